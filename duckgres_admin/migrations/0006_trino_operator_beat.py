"""Data migration: the Trino operator's beat rows (spec trino-pools §4.4, §4.10).

``trino.pool_tick`` every 5 s and ``trino.reconcile_orgs`` every 30 s, both on the
``duckgres.trino`` queue (the solo trino worker) with ``expires`` equal to the interval, so a
backlog after an outage is dropped, not replayed. Both are no-ops where Trino is not wired or
the operator is disabled, and act only in the ``trino`` lease holder.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

ROWS = (
    (
        "duckgres: trino pool tick (every 5 s)",
        "trino.pool_tick",
        5,
        "One shared-pool operator tick (spec trino-pools 4.4): desired configuration, "
        "authority, Gateway pool, tenant admission, one instance step or plan action.",
    ),
    (
        "duckgres: trino org reconcile sweep (every 30 s)",
        "trino.reconcile_orgs",
        30,
        "Publish or remove each Trino org's catalog in its owning pool (spec trino-pools 4.10).",
    ),
)


def seed(apps: Any, schema_editor: Any) -> None:
    interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
    task_model = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, seconds, description in ROWS:
        interval, _ = interval_model.objects.get_or_create(every=seconds, period="seconds")
        task_model.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "interval": interval,
                "queue": "duckgres.trino",
                "expire_seconds": seconds,
                "enabled": True,
                "description": description,
            },
        )


def unseed(apps: Any, schema_editor: Any) -> None:
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name__in=[row[0] for row in ROWS]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0005_trino_audit_beat")]

    operations = [migrations.RunPython(seed, unseed)]
