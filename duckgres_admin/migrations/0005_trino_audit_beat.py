"""Data migration: the Trino ownership audit's beat row (spec trino-pools §4.14).

``trino.ownership_audit`` every 5 minutes on the ``duckgres.trino`` queue, with ``expires``
equal to its interval so a backlog after an outage is dropped, not replayed. The task itself
runs only in the ``trino`` lease holder; in a deployment where Trino is not wired it is a no-op.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

AUDIT_TASK_NAME = "duckgres: trino ownership audit (every 5 min)"


def seed(apps: Any, schema_editor: Any) -> None:
    interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    every_5m, _ = interval_model.objects.get_or_create(every=300, period="seconds")
    task_model.objects.update_or_create(
        name=AUDIT_TASK_NAME,
        defaults={
            "task": "trino.ownership_audit",
            "interval": every_5m,
            "queue": "duckgres.trino",
            "expire_seconds": 300,
            "enabled": True,
            "description": "Trino-enabled orgs whose owner is not a configured pool "
            "(spec trino-pools 4.14); log + gauge, never changes a row.",
        },
    )


def unseed(apps: Any, schema_editor: Any) -> None:
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name=AUDIT_TASK_NAME
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0004_trino_org_cascade"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(seed, unseed)]
