"""Data migration: the notification outbox scan's beat row (docs/notifications.md).

``notifications.scan`` every 15 s on ``duckgres.default`` with ``expires`` equal to the
interval, so a backlog after an outage is dropped, not replayed (the next scan finds the same
rows: the outbox is in the database, not in the broker). A no-op while ``DUCKGRES_WEBHOOK_URL``
is unset.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

NAME = "duckgres: notification outbox (every 15 s)"
TASK = "notifications.scan"
SECONDS = 15
DESCRIPTION = (
    "Outbox scan (docs/notifications.md): a row for every terminal reshard operation, "
    "deliveries of due rows enqueued; a no-op without DUCKGRES_WEBHOOK_URL."
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
        ("duckgres_admin", "0011_notifications"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(seed, unseed)]
