"""A store drain through the janitor, end to end (issue 13 item 3; safeguards reshard-98, 99).

Six warehouses on the source cluster (5433) are drained to the target cluster (5434) with
``max_concurrent`` 2: real control workers (two replicas of the janitor on the broadcast queue,
ticks sent as beat does), a real default worker launching real runner processes, and the
janitor's leader SIGKILLed in the middle. One org cannot move (its warehouse is not ready) and
is skipped with the start's reason; one child fails (a connection lease that never ends makes
its drain step time out) and rolls back; the other four move. No item is launched twice and
no more than two children are ever active."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections.abc import Callable

import pytest
from django.utils import timezone

from duckgres_admin.models import ConnectionLease, ReshardOperation, StoreDrain, Warehouse
from duckgres_admin.platform.leadership import read_lease
from reshard.control import drains
from tests.fixtures.janitor import janitor_env, reset_leases, send_tick
from tests.fixtures.processes import CeleryWorker
from tests.fixtures.rows import new_store, new_warehouse
from tests.fixtures.runner import database_exists
from tests.fixtures.stores import StoreClusters, TenantCatalogFactory

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("janitor_env"),
]
assert janitor_env

# The janitor as the control workers run it here: a short lease, so that the standby takes
# over within seconds of the leader's death (production: 90 s / 60 s).
CONTROL_ENV = {
    "DUCKGRES_JANITOR_LEASE_SECONDS": "6",
    "DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS": "4",
    "DUCKGRES_RESHARD_LAUNCHER": "local",
}


def _leader(workers: list[CeleryWorker]) -> CeleryWorker | None:
    row = read_lease("janitor")
    if row is None or not row.live:
        return None
    pids = row.holder.split(".")
    return next((w for w in workers if str(w.proc.pid) in pids and w.proc.poll() is None), None)


def _active_children(drain_id: int) -> int:
    return ReshardOperation.objects.filter(
        drain_item__drain_id=drain_id, state__in=("pending", "running")
    ).count()


@pytest.mark.safeguard("reshard-98")
@pytest.mark.safeguard("reshard-99")
def test_a_drain_of_six_with_two_at_a_time_survives_the_janitor_leader_s_death(
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    celery_worker_factory: Callable[..., CeleryWorker],
) -> None:
    reset_leases()
    source, target = new_store(store_clusters.source), new_store(store_clusters.target)
    catalogs = [tenant_catalog(store_clusters.source) for _ in range(6)]
    warehouses = [new_warehouse(store=source, catalog=c, compaction_enabled=True) for c in catalogs]
    skipped, failing = warehouses[1], warehouses[4]
    Warehouse.objects.filter(pk=skipped.pk).update(state="provisioning")
    ConnectionLease.objects.create(  # held past the drain timeout: that child's drain fails
        org_id=failing.org_id,
        holder="pinned",
        purpose="query",
        state="granted",
        requested_at=timezone.now(),
        granted_at=timezone.now(),
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    drain_id = drains.create_drain(  # the API's service (tests/api/test_drains.py)
        source.name,
        target_stores=[target.name],
        max_concurrent=2,
        drain_timeout_seconds=5,
        actor="ops@example.com",
    ).id

    # Workers start after the catalogs exist: they inherit the tenants' env: secrets.
    celery_worker_factory(queues=("duckgres.default",), extra_env=CONTROL_ENV)
    control = [
        celery_worker_factory(queues=("duckgres.control",), extra_env=CONTROL_ENV) for _ in range(2)
    ]
    killed: CeleryWorker | None = None
    most_active = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        send_tick()
        time.sleep(1.0)
        most_active = max(most_active, _active_children(drain_id))
        launched = ReshardOperation.objects.filter(drain_item__drain_id=drain_id).count()
        if killed is None and launched >= 2:
            killed = _leader(control)
            if killed is not None:
                os.kill(killed.proc.pid, signal.SIGKILL)  # mid-drain, children running
                killed.proc.wait(10)
        if StoreDrain.objects.get(pk=drain_id).state == "finished":
            break
    drain = StoreDrain.objects.get(pk=drain_id)
    body = drains.drain_view(drain)
    assert drain.state == "finished", body
    assert killed is not None, "the leader was never killed mid-drain"

    states = {item["org_id"]: item for item in body["items"]}
    assert states[skipped.org_id]["state"] == "skipped"
    assert states[skipped.org_id]["reason"] == (
        "warehouse must be in ready state to reshard (currently provisioning)"
    )
    assert states[skipped.org_id]["operation_id"] is None
    assert states[failing.org_id]["state"] == "failed", body
    failed_op = ReshardOperation.objects.get(pk=states[failing.org_id]["operation_id"])
    assert failed_op.error.startswith("drain timed out after 5 s (1 active leases"), failed_op.error
    moved = [w for w in warehouses if w not in (skipped, failing)]
    for wh in moved:
        assert states[wh.org_id]["state"] == "succeeded", body
        row = Warehouse.objects.get(pk=wh.pk)
        assert (row.metadata_store_id, row.state) == (target.name, "ready")
    assert Warehouse.objects.get(pk=failing.pk).metadata_store_id == source.name
    assert body["progress"] == {
        "waiting": 0,
        "running": 0,
        "succeeded": 4,
        "failed": 1,
        "cancelled": 0,
        "skipped": 1,
    }
    assert drain.summary == "4 succeeded, 1 failed, 1 skipped"

    # Never launched twice, never more than two at a time, and the standby finished the job.
    children = ReshardOperation.objects.filter(drain_item__drain_id=drain_id)
    orgs = list(children.values_list("org_id", flat=True))
    assert sorted(orgs) == sorted(w.org_id for w in warehouses if w is not skipped)
    assert ReshardOperation.objects.filter(org_id__in=orgs).count() == len(orgs)
    assert set(children.values_list("created_by", flat=True)) == {f"drain:{drain_id}"}
    assert most_active <= 2
    # The same bound from the rows: at no instant were more than two children alive.
    spans = list(children.values_list("created_at", "finished_at"))
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    alive = peak = 0
    for _, step in edges:
        alive += step
        peak = max(peak, alive)
    assert peak <= 2, spans
    lease = read_lease("janitor")
    assert lease is not None
    assert lease.epoch >= 2, "the standby took the lease over"
    assert str(killed.proc.pid) not in lease.holder.split(".")
    for catalog, wh in zip(catalogs, warehouses, strict=True):
        assert database_exists(catalog.cluster, catalog.database) is (wh not in moved)


@pytest.mark.safeguard("reshard-111")
def test_a_drain_cancel_stops_the_child_that_is_blocking_now(
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    celery_worker_factory: Callable[..., CeleryWorker],
) -> None:
    """``duckgres store drain … --max-concurrent 1``, then the cancel while the first child is
    ``running`` in ``blocking`` (its propagation wait, before its point of no return): the
    cancel's own transaction asks that child, which a real runner honours — the child ends
    ``cancelled`` with its catalog bound to the source and intact — and the waiting item is
    cancelled at once, never launched. No janitor tick is needed for the child to be asked."""
    reset_leases()
    source, target = new_store(store_clusters.source), new_store(store_clusters.target)
    catalogs = [tenant_catalog(store_clusters.source) for _ in range(2)]
    warehouses = [new_warehouse(store=source, catalog=c) for c in catalogs]
    drain_id = drains.create_drain(
        source.name,
        target_stores=[target.name],
        max_concurrent=1,
        drain_timeout_seconds=30,
        actor="ops@example.com",
    ).id
    # A propagation wait of 2 x 6 s: the child sits in `blocking` long enough to be asked.
    slow = {**CONTROL_ENV, "DUCKGRES_CONFIG_POLL_INTERVAL": "6"}
    celery_worker_factory(queues=("duckgres.default",), extra_env=slow)
    celery_worker_factory(queues=("duckgres.control",), extra_env=CONTROL_ENV)
    child: ReshardOperation | None = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        send_tick()
        child = ReshardOperation.objects.filter(drain_item__drain_id=drain_id).first()
        if child is not None and (child.state, child.step) == ("running", "blocking"):
            break
        time.sleep(0.3)
    assert child is not None, "the drain launched no child"
    assert (child.state, child.step) == ("running", "blocking"), (child.state, child.step)
    done = drains.cancel_drain(drain_id, actor="ops@example.com")
    assert done.waiting_cancelled == 1
    assert [(c.operation_id, c.honoured) for c in done.children] == [(child.id, True)]
    asked = ReshardOperation.objects.get(pk=child.id)
    assert asked.cancel_requested, "asked in the cancel's own transaction"

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        child = ReshardOperation.objects.get(pk=child.id)
        if child.state in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    assert child.state == "cancelled", (child.state, child.step, child.error)
    moving = Warehouse.objects.get(org_id=child.org_id)
    assert (moving.metadata_store_id, moving.state) == (source.name, "ready")
    catalog = next(c for c, w in zip(catalogs, warehouses, strict=True) if w.org_id == child.org_id)
    assert database_exists(catalog.cluster, catalog.database)
    with catalog.tenant_conn() as conn:
        assert conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone() is not None
    # The waiting item was never launched; the drain ends cancelled once its child is terminal.
    assert ReshardOperation.objects.filter(drain_item__drain_id=drain_id).count() == 1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        send_tick()
        if StoreDrain.objects.get(pk=drain_id).state == "cancelled":
            break
        time.sleep(1.0)
    drain = StoreDrain.objects.get(pk=drain_id)
    assert (drain.state, drain.summary) == ("cancelled", "2 cancelled"), drains.drain_view(drain)
