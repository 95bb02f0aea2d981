"""Data migration: the leader-lease rows and the janitor's beat schedule.

Both lease rows start expired (``-infinity``) so the first contender takes them. The janitor
beat entry is a row (visible and editable in the admin) firing every 30 s with ``expires``
equal to its interval, so a backlog after an outage is dropped, not replayed.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

JANITOR_TASK_NAME = "duckgres: reshard janitor (every 30 s)"


def seed(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(
        "INSERT INTO duckgres_leases (name, holder, epoch, expires_at) VALUES "
        "('janitor', '', 0, '-infinity'), ('trino', '', 0, '-infinity') "
        "ON CONFLICT (name) DO NOTHING"
    )
    interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    every_30s, _ = interval_model.objects.get_or_create(every=30, period="seconds")
    task_model.objects.update_or_create(
        name=JANITOR_TASK_NAME,
        defaults={
            "task": "reshard.reconcile",
            "interval": every_30s,
            "queue": "duckgres.control",
            "expire_seconds": 30,
            "enabled": True,
            "description": "Leader-only reshard reconciler (spec reshard 4.15).",
        },
    )


def unseed(apps: Any, schema_editor: Any) -> None:
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name=JANITOR_TASK_NAME
    ).delete()
    schema_editor.execute("DELETE FROM duckgres_leases WHERE name IN ('janitor', 'trino')")


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(seed, unseed)]
