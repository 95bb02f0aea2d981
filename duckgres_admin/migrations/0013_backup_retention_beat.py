"""Data migration: the catalog backup retention task's beat row (docs/backup.md "Retention").

``reshard.backup_retention`` every hour on ``duckgres.default`` with ``expires`` equal to the
interval, so a backlog after an outage is dropped, not replayed (the next run plans from the
bucket again). A no-op while ``DUCKGRES_BACKUP_RETENTION_ENABLED`` is false (the default).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

NAME = "duckgres: backup retention (every hour)"
TASK = "reshard.backup_retention"
SECONDS = 3600
DESCRIPTION = (
    "Catalog backup retention (docs/backup.md): deletes backups of terminal operations beyond "
    "the newest N and older than D days, bounded, under an advisory lock; a no-op until "
    "DUCKGRES_BACKUP_RETENTION_ENABLED=true."
)


def seed(apps: Any, schema_editor: Any) -> None:
    interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    interval = interval_model.objects.filter(every=SECONDS, period="seconds").order_by(
        "id"
    ).first() or interval_model.objects.create(every=SECONDS, period="seconds")
    task_model.objects.update_or_create(
        name=NAME,
        defaults={
            "task": TASK,
            "interval": interval,
            "queue": "duckgres.default",
            "expire_seconds": SECONDS,
            "enabled": True,
            "description": DESCRIPTION,
        },
    )


def unseed(apps: Any, schema_editor: Any) -> None:
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0012_notification_outbox_beat"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(seed, unseed)]
