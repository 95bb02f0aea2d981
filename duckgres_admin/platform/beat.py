"""The product's beat rows, in one table, and their healing at beat start.

``ROWS`` is the one list of django-celery-beat ``PeriodicTask`` rows the product ships (written
by data migrations 0002, 0005 and 0006; the migrations keep their own frozen copies). The drift
check (:func:`drift_warnings`, run at start by the control worker for its rows and by the trino
worker for its rows) reads its expected values from it. Task and queue names are the members of
``duckgres_admin.platform.queues``.

Invariants:

- Every row is an interval schedule in seconds whose ``expire_seconds`` equals its interval
  (a backlog after an outage is dropped, not replayed). Checked at import.
- Names and tasks are unique in the table.
- **Healing** (:func:`heal`, run by the ``beat_init`` receiver in every beat process) only ever
  *creates* a row: a table row is re-created, exactly as the migration wrote it, when there is
  no ``PeriodicTask`` for its task at all and its name is free. A row that exists is never
  changed, whatever it looks like: drifted rows are warned about by the workers' drift checks,
  and a disabled row stays disabled (beat warns). Each re-created row is logged as a warning
  naming it. Creating by the unique ``name`` makes two beats starting together harmless.
- ``beat_init`` is sent after beat's ``DatabaseScheduler`` read the rows; a re-created row
  bumps django-celery-beat's change marker (``PeriodicTasks.last_update``), so the scheduler
  reloads at its next tick and the row runs from beat's first ticks.

The receiver is connected when this module is imported: ``reshard.control.worker`` (imported by
``reshard.tasks``) and ``trino_pools.tasks`` import it, and Celery autodiscovers both task
modules in every worker and beat process (tests/test_beat_rows.py starts a real beat).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery.signals import beat_init
from django.db import DatabaseError, transaction

from duckgres_admin.platform.queues import QueueName, TaskName

_log = logging.getLogger("duckgres.beat")


# The seconds of one unit of each django-celery-beat IntervalSchedule period.
PERIOD_SECONDS: dict[str, float] = {
    "microseconds": 1e-6,
    "seconds": 1,
    "minutes": 60,
    "hours": 3600,
    "days": 86400,
}


@dataclass(frozen=True)
class BeatRow:
    """One product beat row, as its data migration writes it."""

    name: str
    task: str
    interval_seconds: int
    queue: str
    expire_seconds: int
    migration: str
    description: str


ROWS: tuple[BeatRow, ...] = (
    BeatRow(
        name="duckgres: reshard janitor (every 30 s)",
        task=TaskName.RECONCILE,
        interval_seconds=30,
        queue=QueueName.CONTROL,
        expire_seconds=30,
        migration="0002",
        description="Leader-only reshard reconciler (spec reshard 4.15).",
    ),
    BeatRow(
        name="duckgres: trino ownership audit (every 5 min)",
        task=TaskName.TRINO_OWNERSHIP_AUDIT,
        interval_seconds=300,
        queue=QueueName.TRINO,
        expire_seconds=300,
        migration="0005",
        description="Trino-enabled orgs whose owner is not a configured pool "
        "(spec trino-pools 4.14); log + gauge, never changes a row.",
    ),
    BeatRow(
        name="duckgres: trino pool tick (every 5 s)",
        task=TaskName.TRINO_POOL_TICK,
        interval_seconds=5,
        queue=QueueName.TRINO,
        expire_seconds=5,
        migration="0006",
        description="One shared-pool operator tick (spec trino-pools 4.4): desired "
        "configuration, authority, Gateway pool, tenant admission, one instance step or plan "
        "action.",
    ),
    BeatRow(
        name="duckgres: trino org reconcile sweep (every 30 s)",
        task=TaskName.TRINO_RECONCILE_ORGS,
        interval_seconds=30,
        queue=QueueName.TRINO,
        expire_seconds=30,
        migration="0006",
        description="Publish or remove each Trino org's catalog in its owning pool "
        "(spec trino-pools 4.10).",
    ),
    BeatRow(
        name="duckgres: notification outbox (every 15 s)",
        task=TaskName.NOTIFICATIONS_SCAN,
        interval_seconds=15,
        queue=QueueName.DEFAULT,
        expire_seconds=15,
        migration="0012",
        description="Outbox scan (docs/notifications.md): a row for every terminal reshard "
        "operation, deliveries of due rows enqueued; a no-op without DUCKGRES_WEBHOOK_URL.",
    ),
    BeatRow(
        name="duckgres: backup retention (every hour)",
        task=TaskName.BACKUP_RETENTION,
        interval_seconds=3600,
        queue=QueueName.DEFAULT,
        expire_seconds=3600,
        migration="0013",
        description="Catalog backup retention (docs/backup.md): deletes backups of terminal "
        "operations beyond the newest N and older than D days, bounded, under an advisory "
        "lock; a no-op until DUCKGRES_BACKUP_RETENTION_ENABLED=true.",
    ),
    BeatRow(
        name="duckgres: backup restore test (every 6 hours)",
        task=TaskName.BACKUP_RESTORE_TEST,
        interval_seconds=21600,
        queue=QueueName.DEFAULT,
        expire_seconds=21600,
        migration="0016",
        description="Backup restore test (docs/backup.md): restores each warehouse's newest "
        "untested backup into a scratch database and checks its DuckLake state, bounded, "
        "under an advisory lock; a no-op until DUCKGRES_RESTORE_TEST_STORE names a store.",
    ),
    BeatRow(
        name="duckgres: retention of the config store (every hour)",
        task=TaskName.HOUSEKEEPING_PRUNE,
        interval_seconds=3600,
        queue=QueueName.DEFAULT,
        expire_seconds=3600,
        migration="0023",
        description="Retention (docs/operations.md): deletes expired sessions and, past their "
        "DUCKGRES_RETENTION_*_DAYS, ended operations' logs, audit rows, delivered outbox rows "
        "and ended lease rows, in bounded batches.",
    ),
)


def _check_table(rows: tuple[BeatRow, ...]) -> None:
    names = [row.name for row in rows]
    tasks = [row.task for row in rows]
    if len(set(names)) != len(names) or len(set(tasks)) != len(tasks):
        raise RuntimeError("duckgres_admin.platform.beat.ROWS: names and tasks must be unique")
    for row in rows:
        if row.expire_seconds != row.interval_seconds or row.interval_seconds <= 0:
            raise RuntimeError(f"beat row {row.name!r}: expire_seconds must equal the interval")


_check_table(ROWS)


def row_for_task(task: str) -> BeatRow:
    """The table row that runs ``task`` (KeyError when the product ships none)."""
    for row in ROWS:
        if row.task == task:
            return row
    raise KeyError(task)


def rows_on_queue(queue: str) -> tuple[BeatRow, ...]:
    return tuple(row for row in ROWS if row.queue == queue)


def drift_warnings(rows: tuple[BeatRow, ...]) -> list[str]:
    """Warnings for the ``PeriodicTask`` rows of the given table rows (none = as shipped).

    Warn only: a drifted row is never changed, a deleted one is re-created by beat at its start
    (:func:`heal`). Each worker checks the rows of the queue it consumes at its start."""
    from django_celery_beat.models import PeriodicTask

    warnings: list[str] = []
    for expected in rows:
        task, interval = expected.task, expected.interval_seconds
        found = PeriodicTask.objects.filter(task=task).select_related("interval")
        enabled = [row for row in found if row.enabled]
        if not enabled:
            warnings.append(
                f"no enabled beat entry runs {task}: it will never run (restore the row "
                f"written by migration {expected.migration})"
            )
        for row in enabled:
            seconds = schedule_seconds(row)
            if seconds is None:
                warnings.append(
                    f"beat entry {row.name!r} for {task} is not an interval schedule; "
                    f"expected every {interval} s"
                )
                continue
            if seconds != interval:
                # One warning per cause: expire_seconds is judged against the right interval.
                warnings.append(
                    f"beat entry {row.name!r} for {task} runs every {seconds:g} s; "
                    f"expected {interval} s"
                )
            elif row.expire_seconds != seconds:
                warnings.append(
                    f"beat entry {row.name!r} for {task} has expire_seconds="
                    f"{row.expire_seconds}; it must equal the interval ({seconds:g} s)"
                )
            if row.queue and row.queue != expected.queue:
                warnings.append(
                    f"beat entry {row.name!r} for {task} is routed to queue {row.queue!r}; "
                    f"expected {expected.queue}"
                )
    return warnings


def schedule_seconds(task: Any) -> float | None:
    """The interval of a ``PeriodicTask`` in seconds; ``None`` when it is not an interval."""
    interval = task.interval
    if interval is None:
        return None
    seconds: float = interval.every * PERIOD_SECONDS.get(interval.period, 0)
    return seconds


def _interval(seconds: int) -> Any:
    from django_celery_beat.models import IntervalSchedule

    # (every, period) is not unique in django-celery-beat: reuse the oldest match.
    found = (
        IntervalSchedule.objects.filter(every=seconds, period=IntervalSchedule.SECONDS)
        .order_by("id")
        .first()
    )
    if found is not None:
        return found
    return IntervalSchedule.objects.create(every=seconds, period=IntervalSchedule.SECONDS)


def heal(rows: tuple[BeatRow, ...] = ROWS) -> list[Any]:
    """Re-create the table rows whose task has no ``PeriodicTask`` at all; returns the new rows.

    Logs one warning per re-created row, and one per product task whose rows are all disabled
    (left disabled). A row whose name is taken by another task is not re-created (warned).
    """
    from django_celery_beat.models import PeriodicTask

    created: list[Any] = []
    for row in rows:
        existing = list(PeriodicTask.objects.filter(task=row.task).order_by("id"))
        if existing:
            if not any(task.enabled for task in existing):
                _log.warning(
                    "beat: every beat entry for %s is disabled (%s); left disabled, so %s "
                    "never runs: enable it in the admin (Periodic tasks) if that is not intended",
                    row.task,
                    ", ".join(repr(task.name) for task in existing),
                    row.task,
                )
            continue
        with transaction.atomic():
            task, new = PeriodicTask.objects.get_or_create(
                name=row.name,
                defaults={
                    "task": row.task,
                    "interval": _interval(row.interval_seconds),
                    "queue": row.queue,
                    "expire_seconds": row.expire_seconds,
                    "enabled": True,
                    "description": row.description,
                },
            )
        if not new:
            if task.task != row.task:
                _log.warning(
                    "beat: no beat entry runs %s, and its entry name %r is taken by a row "
                    "running %s; not re-created: fix the row in the admin (Periodic tasks)",
                    row.task,
                    row.name,
                    task.task,
                )
            continue  # another beat re-created it at the same moment
        _log.warning(
            "beat: the beat entry %r was missing (no row runs %s); re-created it as migration "
            "%s wrote it: every %d s on %s, expires %d s",
            row.name,
            row.task,
            row.migration,
            row.interval_seconds,
            row.queue,
            row.expire_seconds,
        )
        created.append(task)
    return created


def on_beat_init(sender: Any = None, **_: Any) -> None:
    """``beat_init`` receiver: heal the product's beat rows before beat's first tick."""
    try:
        heal()
    except DatabaseError as exc:
        _log.warning("beat: cannot check the product's beat entries: %s", exc)


beat_init.connect(on_beat_init, weak=False, dispatch_uid="duckgres_admin.platform.beat-heal")
