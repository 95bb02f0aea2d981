"""The backup tasks (docs/backup.md "Retention", "Restore tests"). Thin: no input, service out.

``reshard.backup_retention()`` on ``duckgres.default`` (beat every hour, expires after an
hour): one fleet-wide run of :func:`reshard.backups.inventory.apply_retention`. Not ``acks_late``: a
run lost with its worker is simply the next run; two at once are excluded by the run's advisory
lock (``duckgres_admin.platform.lockkeys.BACKUP_RETENTION_LOCK_KEY``). A no-op while
``DUCKGRES_BACKUP_RETENTION_ENABLED`` is false (the default).

``reshard.backup_restore_test()`` on ``duckgres.default`` (beat every 6 hours, expires after 6
hours): one fleet-wide run of :func:`reshard.backups.restore_test.run`, same rules (its own advisory
lock, a no-op until ``DUCKGRES_RESTORE_TEST_STORE`` names a store). The restore itself is
``pg_restore`` in a child process fed chunk by chunk; the task holds no operation state and is
safe to lose: the next run sweeps the scratch database a lost run left. Its time limits follow
``DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS`` times the per-run bound.

The same task **on demand** (docs/backup.md "On demand"): queued by
``reshard.backups.requests`` with ``org_id``, ``backup_key`` and ``op_id`` as keyword
arguments, it tests that one backup (``restore_test.Only``: again, even when it has a result).
Its outcome that a beat run leaves only in the worker's log — no store in the worker, an
inconclusive attempt, the backup gone — is also written to the backup's operation log, where
the operator who asked reads it. While another run holds the lock it is retried every
:data:`LOCK_RETRY_SECONDS` (the first deferral noted on the op log) until the task's time limit
has passed, then gives up with a note: it never waits inside a worker slot.

Registration: Celery's autodiscovery imports ``reshard.tasks``; that module must import this one
(``from reshard.backups import tasks as backup_tasks``) for workers to know the task.
"""

from __future__ import annotations

import contextlib
import logging

from celery import Task, shared_task
from django.conf import settings

from duckgres_admin.platform.queues import TaskName
from reshard.backups import inventory, restore_test
from reshard.operation import oplog

_log = logging.getLogger("duckgres.reshard.restore_test")


@shared_task(name=TaskName.BACKUP_RETENTION, acks_late=False, ignore_result=True)
def backup_retention_task() -> dict[str, object]:
    report = inventory.apply_retention()
    return {
        "enabled": report.enabled,
        "ran": report.ran,
        "warehouses": report.warehouses,
        "deleted": len(report.deleted),
        "errors": len(report.errors),
        "bounded": report.bounded,
    }


def _restore_test_limit() -> int:
    per_restore: int = settings.DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS
    runs: int = settings.DUCKGRES_RESTORE_TEST_MAX_PER_RUN
    return per_restore * runs + 600


LOCK_RETRY_SECONDS = 60


def _lock_retries() -> int:
    """How many times an on-demand test waits for a running test (its whole time limit)."""
    return max(1, _restore_test_limit() // LOCK_RETRY_SECONDS)


def _summary(report: restore_test.RestoreTestReport) -> dict[str, object]:
    return {
        "enabled": report.enabled,
        "ran": report.ran,
        "tested": report.tested,
        "swept": len(report.swept),
        "errors": len(report.errors),
        "bounded": report.bounded,
    }


def _note(op_id: int | None, message: str, level: str = "warn") -> None:
    _log.log(logging.WARNING if level == "warn" else logging.INFO, message)
    if op_id:
        with contextlib.suppress(Exception):  # the op log is where the asker looks; best effort
            oplog.append(op_id, message, level=level, source="janitor")


@shared_task(
    name=TaskName.BACKUP_RESTORE_TEST,
    bind=True,
    acks_late=False,
    ignore_result=True,
    time_limit=_restore_test_limit(),
)
def backup_restore_test_task(
    self: Task,  # type: ignore[type-arg]
    org_id: str = "",
    backup_key: str = "",
    op_id: int | None = None,
) -> dict[str, object]:
    """A fleet-wide run (no arguments: beat), or the on-demand test of one backup."""
    if not org_id:
        return _summary(restore_test.run())
    what = f"on-demand restore test of {backup_key} (org {org_id})"
    report = restore_test.run(only=restore_test.Only(org_id, backup_key))
    if report.enabled and not report.ran and not report.errors:  # another run holds the lock
        retries = int(self.request.retries or 0)
        if retries < _lock_retries():
            if retries == 0:
                _note(
                    op_id,
                    f"{what}: another restore-test run holds the lock; tried again every "
                    f"{LOCK_RETRY_SECONDS} s for up to {_restore_test_limit() // 60} min",
                    level="info",
                )
            raise self.retry(countdown=LOCK_RETRY_SECONDS, max_retries=_lock_retries())
        _note(op_id, f"{what} gave up: another run held the lock throughout; ask again")
    elif not report.enabled:
        _note(op_id, f"{what} did not run: DUCKGRES_RESTORE_TEST_STORE is empty in the worker")
    elif report.ran and not report.tested and not report.errors:
        _note(op_id, f"{what} found nothing to test: the warehouse or its data bucket is gone")
    for error in report.errors:
        _note(op_id, f"{what} recorded nothing: {error}")
    return _summary(report)
