"""Data migration: the config store's retention beat row (docs/operations.md "Retention").

``housekeeping.prune`` every hour on ``duckgres.default`` with ``expires`` equal to the
interval, so a backlog after an outage is dropped, not replayed.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

NAME = "duckgres: retention of the config store (every hour)"
TASK = "housekeeping.prune"
SECONDS = 3600
DESCRIPTION = (
    "Retention (docs/operations.md): deletes expired sessions and, past their "
    "DUCKGRES_RETENTION_*_DAYS, ended operations' logs, audit rows, delivered outbox rows "
    "and ended lease rows, in bounded batches."
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
        ("duckgres_admin", "0022_runner_login_rows"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(seed, unseed)]
