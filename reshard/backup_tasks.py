"""The backup retention task (docs/backup.md "Retention"). Thin: no input, service out.

``reshard.backup_retention()`` on ``duckgres.default`` (beat every hour, expires after an
hour): one fleet-wide run of :func:`reshard.backups.apply_retention`. Not ``acks_late``: a run
lost with its worker is simply the next run; two at once are excluded by the run's advisory
lock (``duckgres_admin.lockkeys.BACKUP_RETENTION_LOCK_KEY``). A no-op while
``DUCKGRES_BACKUP_RETENTION_ENABLED`` is false (the default).

Registration: Celery's autodiscovery imports ``reshard.tasks``; that module must import this one
(``from reshard import backup_tasks  # noqa: F401``) for workers to know the task.
"""

from __future__ import annotations

from celery import shared_task

from duckgres_admin.queues import TaskName
from reshard import backups


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
