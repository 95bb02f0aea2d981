"""The product's beat rows (``duckgres_admin.platform.beat.ROWS``) and their healing at beat start.

- The table is what the data migrations 0002, 0005 and 0006 write (their ``seed`` functions are
  run here against the real models and compared field by field).
- Both drift checks (control worker, trino worker) read their expectations from the table.
- ``heal`` re-creates a deleted row exactly as shipped and logs a warning naming it; it never
  changes a row that exists (drifted stays drifted and warned by the workers, disabled stays
  disabled and warned by beat, renamed still runs its task).
- A real ``celery beat`` process re-creates deleted rows at start (``beat_init``) and runs them
  from its first tick.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from duckgres_admin.platform import beat
from reshard.control import worker
from tests.fixtures.processes import process_env
from trino_pools import tasks

JANITOR = "duckgres: reshard janitor (every 30 s)"
POOL_TICK = "duckgres: trino pool tick (every 5 s)"
AUDIT = "duckgres: trino ownership audit (every 5 min)"
ORGS = "duckgres: trino org reconcile sweep (every 30 s)"

MIGRATIONS = (
    "0002_seed_leases_and_beat",
    "0005_trino_audit_beat",
    "0006_trino_operator_beat",
    "0012_notification_outbox_beat",
    "0013_backup_retention_beat",
    "0016_backup_restore_test_beat",
    "0023_retention_beat",
)


def _snapshot() -> dict[str, dict[str, Any]]:
    from django_celery_beat.models import PeriodicTask

    return {
        row.name: {
            "task": row.task,
            "interval": (row.interval.every, row.interval.period) if row.interval else None,
            "queue": row.queue,
            "expire_seconds": row.expire_seconds,
            "enabled": row.enabled,
            "description": row.description,
        }
        for row in PeriodicTask.objects.select_related("interval")
    }


def _expected(row: beat.BeatRow) -> dict[str, Any]:
    return {
        "task": row.task,
        "interval": (row.interval_seconds, "seconds"),
        "queue": row.queue,
        "expire_seconds": row.expire_seconds,
        "enabled": True,
        "description": row.description,
    }


class _SchemaEditor:
    """What the seed functions need of a schema editor: ``execute`` on this connection."""

    def execute(self, statement: str, params: Any = None) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)


def _run_migration_seeds() -> None:
    from django.apps import apps

    for name in MIGRATIONS:
        module = importlib.import_module(f"duckgres_admin.migrations.{name}")
        module.seed(apps, _SchemaEditor())


def _ship_all_rows() -> None:
    from django_celery_beat.models import PeriodicTask

    PeriodicTask.objects.all().delete()
    _run_migration_seeds()


# --- the table ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_table_is_what_the_migrations_write() -> None:
    _ship_all_rows()
    assert _snapshot() == {row.name: _expected(row) for row in beat.ROWS}
    assert [row.migration for row in beat.ROWS] == [
        "0002",
        "0005",
        "0006",
        "0006",
        "0012",
        "0013",
        "0016",
        "0023",
    ]


def test_the_table_invariants() -> None:
    assert len({row.name for row in beat.ROWS}) == len(beat.ROWS)
    assert len({row.task for row in beat.ROWS}) == len(beat.ROWS)
    assert all(row.expire_seconds == row.interval_seconds for row in beat.ROWS)
    with pytest.raises(RuntimeError, match="expire_seconds must equal the interval"):
        beat._check_table((beat.BeatRow("x", "t", 30, "q", 60, "0000", ""),))
    assert beat.row_for_task("reshard.reconcile").queue == "duckgres.control"
    with pytest.raises(KeyError):
        beat.row_for_task("no.such.task")


def test_both_drift_checks_read_the_table() -> None:
    janitor = beat.row_for_task(worker.RECONCILE_TASK)
    assert janitor == worker.JANITOR_ROW
    assert worker.JANITOR_INTERVAL_SECONDS == 30
    trino_rows = beat.rows_on_queue("duckgres.trino")
    assert trino_rows == tasks.BEAT_ROWS
    assert tasks.BEAT_INTERVALS == {
        "trino.ownership_audit": 300,
        "trino.pool_tick": 5,
        "trino.reconcile_orgs": 30,
    }
    assert {row.task for row in beat.ROWS} == {
        worker.RECONCILE_TASK,
        *tasks.BEAT_INTERVALS,
        "notifications.scan",
        "reshard.backup_retention",
        "reshard.backup_restore_test",
        "housekeeping.prune",
    }


# --- healing in-process ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_deleted_row_is_recreated_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    from django_celery_beat.models import PeriodicTask

    _ship_all_rows()
    PeriodicTask.objects.filter(name=JANITOR).delete()
    assert worker.beat_drift_warnings()[0].startswith(
        "no enabled beat entry runs reshard.reconcile"
    )
    with caplog.at_level("WARNING", logger="duckgres.beat"):
        created = beat.heal()
    assert [row.name for row in created] == [JANITOR]
    assert _snapshot()[JANITOR] == _expected(beat.row_for_task("reshard.reconcile"))
    assert worker.beat_drift_warnings() == []
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage() == (
        "beat: the beat entry 'duckgres: reshard janitor (every 30 s)' was missing (no row runs "
        "reshard.reconcile); re-created it as migration 0002 wrote it: every 30 s on "
        "duckgres.control, expires 30 s"
    )
    # Idempotent: nothing is missing any more.
    caplog.clear()
    with caplog.at_level("WARNING", logger="duckgres.beat"):
        assert beat.heal() == []
    assert caplog.records == []


@pytest.mark.django_db
def test_every_row_comes_back_and_both_drift_checks_are_clean() -> None:
    from django_celery_beat.models import PeriodicTask

    PeriodicTask.objects.all().delete()
    assert worker.beat_drift_warnings()
    assert len(tasks.beat_drift_warnings()) == 3
    assert {row.name for row in beat.heal()} == {row.name for row in beat.ROWS}
    assert _snapshot() == {row.name: _expected(row) for row in beat.ROWS}
    assert worker.beat_drift_warnings() == []
    assert tasks.beat_drift_warnings() == []


@pytest.mark.django_db
def test_drifted_and_disabled_rows_are_left_alone_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    _ship_all_rows()
    tick = PeriodicTask.objects.get(name=POOL_TICK)
    tick.interval, _ = IntervalSchedule.objects.get_or_create(every=1, period="minutes")
    tick.queue = "duckgres.default"
    tick.save()
    PeriodicTask.objects.filter(name=AUDIT).update(enabled=False)
    before = _snapshot()

    with caplog.at_level("WARNING", logger="duckgres.beat"):
        assert beat.heal() == []
    assert _snapshot() == before, "an existing row is never changed"
    assert [r.getMessage() for r in caplog.records] == [
        "beat: every beat entry for trino.ownership_audit is disabled "
        "('duckgres: trino ownership audit (every 5 min)'); left disabled, so "
        "trino.ownership_audit never runs: enable it in the admin (Periodic tasks) if that is "
        "not intended"
    ]
    # The trino worker still warns about both (its texts unchanged).
    warnings = tasks.beat_drift_warnings()
    assert warnings[0].startswith("no enabled beat entry runs trino.ownership_audit")
    assert f"beat entry {POOL_TICK!r} for trino.pool_tick runs every 60 s" in warnings[1]
    assert warnings[2].endswith("is routed to queue 'duckgres.default'; expected duckgres.trino")


@pytest.mark.django_db
def test_a_renamed_row_still_runs_its_task_so_nothing_is_recreated() -> None:
    from django_celery_beat.models import PeriodicTask

    _ship_all_rows()
    PeriodicTask.objects.filter(name=JANITOR).update(name="janitor (renamed by an operator)")
    assert beat.heal() == []
    assert JANITOR not in _snapshot()
    assert worker.beat_drift_warnings() == []


@pytest.mark.django_db
def test_a_name_taken_by_another_task_is_not_overwritten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django_celery_beat.models import PeriodicTask

    _ship_all_rows()
    PeriodicTask.objects.filter(name=JANITOR).update(task="someone.elses_task")
    with caplog.at_level("WARNING", logger="duckgres.beat"):
        assert beat.heal() == []
    assert _snapshot()[JANITOR]["task"] == "someone.elses_task"
    assert "is taken by a row running someone.elses_task; not re-created" in caplog.text


@pytest.mark.django_db(transaction=True)  # the scheduler commits and closes connections
def test_the_beat_init_receiver_heals_after_the_scheduler_read_the_rows() -> None:
    """Beat sends ``beat_init`` after its DatabaseScheduler read the rows: the re-created row
    must reach that scheduler at its next look at the schedule, not at its 5-minute full sync."""
    from celery.signals import beat_init
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler

    from duckgres_admin.celery import app

    assert any(key[0] == "duckgres_admin.platform.beat-heal" for key, _ in beat_init.receivers)
    _ship_all_rows()
    PeriodicTask.objects.filter(name=POOL_TICK).delete()
    scheduler = DatabaseScheduler(app=app, lazy=False)  # reads the rows, as beat does first
    assert POOL_TICK not in scheduler.schedule
    beat_init.send(sender=None)
    assert PeriodicTask.objects.filter(name=POOL_TICK).exists()
    assert POOL_TICK in scheduler.schedule


# --- a real beat ------------------------------------------------------------------------------


class _Beat:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def beat_process(transactional_db: None, tmp_path: Path) -> Iterator[Callable[[], _Beat]]:
    """Factory: start ``celery -A duckgres_admin beat`` (DatabaseScheduler) on the test
    database and broker; stopped (SIGTERM, then SIGKILL) after the test."""
    from django.conf import settings

    started: list[_Beat] = []

    def start() -> _Beat:
        log = tmp_path / f"beat-{len(started)}.log"
        env = process_env(DUCKGRES_BROKER_URL=str(settings.CELERY_BROKER_URL))
        cmd = [
            sys.executable, "-m", "celery", "-A", "duckgres_admin", "beat",
            "-S", "django_celery_beat.schedulers:DatabaseScheduler", "--loglevel", "INFO",
            "-s", str(tmp_path / "celerybeat-schedule"),
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        started.append(_Beat(proc, log))
        return started[-1]

    yield start
    for process in started:
        if process.proc.poll() is None:
            os.killpg(process.proc.pid, signal.SIGTERM)
            try:
                process.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.proc.pid, signal.SIGKILL)
                process.proc.wait(timeout=10)
    _flush_broker_queues()


def _flush_broker_queues() -> None:
    """Drop the messages beat sent (no worker consumes them in this test)."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(str(settings.CELERY_BROKER_URL), socket_timeout=5)
    try:
        for queue in ("duckgres.control", "duckgres.trino", "duckgres.default"):
            client.delete(queue)
    finally:
        client.close()


def _until(predicate: Callable[[], Any], what: str, process: _Beat, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process.proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; beat log:\n{process.text()[-4000:]}")


def test_a_real_beat_recreates_deleted_rows_at_start_and_runs_them(
    beat_process: Callable[[], _Beat],
) -> None:
    from django.db import close_old_connections
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    _ship_all_rows()
    PeriodicTask.objects.filter(name__in=[JANITOR, POOL_TICK]).delete()
    # Drifted on purpose: every 60 s instead of 30 s. Disabled on purpose: the audit.
    orgs = PeriodicTask.objects.get(name=ORGS)
    orgs.interval, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    orgs.save()
    PeriodicTask.objects.filter(name=AUDIT).update(enabled=False)
    drifted = _snapshot()[ORGS]

    process = beat_process()

    def healed() -> bool:
        close_old_connections()
        return bool(PeriodicTask.objects.filter(name__in=[JANITOR, POOL_TICK]).count() == 2)

    _until(healed, "beat to re-create the deleted rows", process, timeout=60)
    rows = _snapshot()
    assert rows[JANITOR] == _expected(beat.row_for_task("reshard.reconcile"))
    assert rows[POOL_TICK] == _expected(beat.row_for_task("trino.pool_tick"))
    assert rows[ORGS] == drifted, "a drifted row is left as the operator made it"
    assert rows[AUDIT]["enabled"] is False, "a disabled row stays disabled"

    # The re-created 5 s tick is in beat's live schedule: it is sent within seconds, not at
    # django-celery-beat's next full sync (5 minutes).
    _until(
        lambda: f"Sending due task {POOL_TICK} (trino.pool_tick)" in process.text(),
        "beat to send the re-created trino.pool_tick",
        process,
        timeout=30,
    )
    log = process.text()
    for name, task in ((JANITOR, "reshard.reconcile"), (POOL_TICK, "trino.pool_tick")):
        assert f"the beat entry '{name}' was missing (no row runs {task}); re-created it" in log
    assert "every beat entry for trino.ownership_audit is disabled" in log
    assert f"'{ORGS}' was missing" not in log
    assert process.proc.poll() is None, "beat keeps running"
