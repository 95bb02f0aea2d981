"""The ``trino`` lease (spec trino-pools §4.3) and the Trino worker's task and start-up."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import override_settings

from duckgres_admin.models import WarehouseTrino
from tests.trino.helpers import full_env, write
from trino_pools import config, tasks
from trino_pools import lease as trino_lease
from trino_pools.catalog_store import CatalogStoreError
from trino_pools.config import load
from trino_pools.lease import TrinoLease, owner_identity

pytestmark = pytest.mark.django_db


def _lease_row() -> tuple[str, int]:
    with connection.cursor() as cur:
        cur.execute("SELECT holder, epoch FROM duckgres_leases WHERE name = 'trino'")
        row = cur.fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def _expire_row() -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE duckgres_leases SET expires_at = '-infinity' WHERE name = 'trino'")


def test_owner_identity_format_and_stability(monkeypatch):
    ident = owner_identity()
    assert re.fullmatch(r".+\.[0-9a-f]{16}", ident)
    assert owner_identity() == ident


def test_one_holder_at_a_time_and_the_epoch_rises_on_every_take():
    _expire_row()
    _, start = _lease_row()
    first, second = TrinoLease(holder="a.1"), TrinoLease(holder="b.2")
    assert first.acquire()
    assert not second.acquire()
    assert first.acquire()  # renew keeps the same epoch
    assert first.epoch == start + 1
    assert _lease_row() == ("a.1", start + 1)
    first.release()
    assert second.acquire()
    assert second.epoch == start + 2
    # The old holder's renew now fails: leadership lost.
    first.epoch = start + 1
    assert not first.renew()
    assert first.epoch is None


@override_settings(DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS=5, DUCKGRES_JANITOR_LEASE_SECONDS=10)
def test_past_the_renew_deadline_the_holder_stops_acting():
    _expire_row()
    now = [1000.0]
    held = TrinoLease(holder="c.3", clock=lambda: now[0])
    assert held.acquire()
    assert held.acting_allowed()
    now[0] += 6
    assert not held.acting_allowed()


@pytest.fixture
def wired(tmp_path, trino_settings_reset):
    settings = load(full_env(tmp_path), service_account_token="/nonexistent")
    config.install_for_tests(settings)
    return settings


def test_audit_task_is_a_no_op_when_trino_is_not_wired(trino_settings_reset):
    config.install_for_tests(load({}))
    assert tasks.ownership_audit_task() == {"wired": False}


def test_audit_task_runs_only_in_the_lease_holder(wired, make_warehouse):
    WarehouseTrino.objects.create(warehouse=make_warehouse(), enabled=True, trino_cell_id="")
    _expire_row()
    trino_lease.lease().epoch = None
    assert tasks.ownership_audit_task() == {"wired": True, "leader": True, "count": 1}
    # Another process holds the row now: this one does nothing.
    trino_lease.lease().epoch = None
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE duckgres_leases SET holder = 'other', expires_at = now() + interval '1 min' "
            "WHERE name = 'trino'"
        )
    assert tasks.ownership_audit_task() == {"wired": True, "leader": False}


def test_the_beat_row_runs_the_audit_every_5_minutes_on_the_trino_queue():
    from django_celery_beat.models import PeriodicTask

    row = PeriodicTask.objects.get(task="trino.ownership_audit")
    assert row.queue == "duckgres.trino"
    assert row.interval is not None
    assert (row.interval.every, row.interval.period) == (300, "seconds")
    assert row.expire_seconds == 300
    assert row.enabled


def test_tasks_route_to_the_trino_queue():
    from duckgres_admin.celery import app

    route = app.amqp.router.route({}, "trino.ownership_audit")
    assert route["queue"].name == "duckgres.trino"


class _Sender:
    def __init__(self, queues: list[str]) -> None:
        class _Q:
            def __init__(self, name: str) -> None:
                self.name = name

        class _TC:
            pass

        self.task_consumer = _TC()
        self.task_consumer.queues = [_Q(q) for q in queues]  # type: ignore[attr-defined]


def test_worker_ready_starts_the_trino_worker_only_there(monkeypatch, wired):
    calls = []
    monkeypatch.setattr(tasks, "worker_start", lambda s: calls.append(s))
    monkeypatch.setattr(tasks, "start_audit", lambda s: None)
    tasks.on_worker_ready(_Sender(["duckgres.default"]))
    tasks.on_worker_ready(_Sender(["duckgres.control"]))
    assert calls == []
    tasks.on_worker_ready(_Sender(["duckgres.trino"]))
    assert calls == [wired]


def test_worker_start_fails_when_the_catalog_store_is_unreachable(
    tmp_path, dead_endpoint, trino_settings_reset
):
    dsn = f"postgresql://publisher:pw-9x8c7v6b@127.0.0.1:{dead_endpoint.port}/catalogs"
    env = full_env(
        tmp_path,
        DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=write(tmp_path, "dead-dsn", dsn),
        DUCKGRES_TRINO_METRICS_PORT="0",
    )
    settings = load(env, service_account_token="/nonexistent")
    with pytest.raises(CatalogStoreError) as info:
        tasks.worker_start(settings)
    assert "the Trino catalog store (DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE" in str(info.value)
    assert "pw-9x8c7v6b" not in str(info.value)


def test_worker_start_warns_that_node_replacement_is_not_built(
    tmp_path, trino_settings_reset, monkeypatch, caplog
):
    env = full_env(
        tmp_path,
        DUCKGRES_TRINO_POOL_NODE_DISRUPTION_ENABLED="true",
        DUCKGRES_TRINO_METRICS_PORT="0",
        DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED="false",
        DUCKGRES_TRINO_POOL_OPERATOR_ENABLED="false",
        DUCKGRES_TRINO_DEFAULT_CELL="",
    )
    settings = load(env, service_account_token="/nonexistent")
    monkeypatch.setattr(tasks, "start_audit", lambda s: None)
    with caplog.at_level("WARNING", logger="duckgres.trino.worker"):
        tasks.worker_start(settings)
    assert any("node replacement" in r.getMessage() for r in caplog.records)


def test_control_worker_start_runs_the_audit_log_only(monkeypatch, wired, make_warehouse, caplog):
    from trino_pools.metrics import TRINO_REGISTRY, set_unconfigured_owners

    set_unconfigured_owners(-1)
    WarehouseTrino.objects.create(warehouse=make_warehouse(), enabled=True, trino_cell_id="")
    started = []
    monkeypatch.setattr(tasks, "worker_start", lambda s: started.append(s))
    with caplog.at_level("WARNING", logger="duckgres.trino.audit"):
        tasks.on_worker_ready(_Sender(["duckgres.control"]))
    assert started == []
    assert any("1 Trino-enabled warehouse(s)" in r.getMessage() for r in caplog.records)
    # Log only: the gauge belongs to the beat run in the lease holder.
    assert TRINO_REGISTRY.get_sample_value("duckgres_trino_unconfigured_owner_warehouses") == -1


def test_beat_drift_warnings():
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    assert tasks.beat_drift_warnings() == []
    row = PeriodicTask.objects.get(task="trino.ownership_audit")
    row.expire_seconds = 3600
    row.queue = "duckgres.default"
    row.save()
    assert tasks.beat_drift_warnings() == [
        f"beat entry {row.name!r} for trino.ownership_audit has expire_seconds=3600; it must "
        "equal the interval (300 s)",
        f"beat entry {row.name!r} for trino.ownership_audit is routed to queue "
        "'duckgres.default'; expected duckgres.trino",
    ]
    row.interval, _ = IntervalSchedule.objects.get_or_create(every=1, period="hours")
    row.save()
    assert "runs every 3600 s" in tasks.beat_drift_warnings()[0]
    row.enabled = False
    row.save()
    assert tasks.beat_drift_warnings()[0].startswith(
        "no enabled beat entry runs trino.ownership_audit"
    )


def test_operator_beat_rows_are_shipped():
    from django_celery_beat.models import PeriodicTask

    rows = {row.task: row for row in PeriodicTask.objects.filter(task__startswith="trino.")}
    assert rows["trino.pool_tick"].interval.every == 5
    assert rows["trino.pool_tick"].expire_seconds == 5
    assert rows["trino.reconcile_orgs"].interval.every == 30
    assert {row.queue for row in rows.values()} == {"duckgres.trino"}
