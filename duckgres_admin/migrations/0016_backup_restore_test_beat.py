"""Data migration: the backup restore test's beat row (docs/backup.md "Restore tests").

``reshard.backup_restore_test`` every 6 hours on ``duckgres.default`` with ``expires`` equal to
the interval, so a backlog after an outage is dropped, not replayed. A no-op while
``DUCKGRES_RESTORE_TEST_STORE`` is empty (the default).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

NAME = "duckgres: backup restore test (every 6 hours)"
TASK = "reshard.backup_restore_test"
SECONDS = 21600
DESCRIPTION = (
    "Backup restore test (docs/backup.md): restores each warehouse's newest untested backup "
    "into a scratch database and checks its DuckLake state, bounded, under an advisory lock; "
    "a no-op until DUCKGRES_RESTORE_TEST_STORE names a store."
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
        ("duckgres_admin", "0015_backup_verification"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(seed, unseed)]
