"""The backup tasks (docs/backup.md "Retention", "Restore tests"). Thin: no input, service out.

``reshard.backup_retention()`` on ``duckgres.default`` (beat every hour, expires after an
hour): one fleet-wide run of :func:`reshard.backups.apply_retention`. Not ``acks_late``: a run
lost with its worker is simply the next run; two at once are excluded by the run's advisory
lock (``duckgres_admin.lockkeys.BACKUP_RETENTION_LOCK_KEY``). A no-op while
``DUCKGRES_BACKUP_RETENTION_ENABLED`` is false (the default).

``reshard.backup_restore_test()`` on ``duckgres.default`` (beat every 6 hours, expires after 6
hours): one fleet-wide run of :func:`reshard.restore_test.run`, same rules (its own advisory
lock, a no-op until ``DUCKGRES_RESTORE_TEST_STORE`` names a store). The restore itself is
``pg_restore`` in a child process fed chunk by chunk; the task holds no operation state and is
safe to lose: the next run sweeps the scratch database a lost run left. Its time limits follow
``DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS`` times the per-run bound.

Registration: Celery's autodiscovery imports ``reshard.tasks``; that module must import this one
(``from reshard import backup_tasks  # noqa: F401``) for workers to know the task.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from duckgres_admin.queues import TaskName
from reshard import backups, restore_test


@shared_task(name=TaskName.BACKUP_RETENTION, acks_late=False, ignore_result=True)
def backup_retention_task() -> dict[str, object]:
    report = backups.apply_retention()
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


@shared_task(
    name=TaskName.BACKUP_RESTORE_TEST,
    acks_late=False,
    ignore_result=True,
    time_limit=_restore_test_limit(),
)
def backup_restore_test_task() -> dict[str, object]:
    report = restore_test.run()
    return {
        "enabled": report.enabled,
        "ran": report.ran,
        "tested": report.tested,
        "swept": len(report.swept),
        "errors": len(report.errors),
        "bounded": report.bounded,
    }
