"""Celery tasks and trino-worker start-up of the Trino pool domain (spec trino-pools §4.3, §4.14).

The trino worker is its own Celery worker consuming only ``duckgres.trino`` with
``--pool=solo --concurrency=1``. Routing: ``CELERY_TASK_ROUTES`` in settings; the beat rows
name the queue too.

- ``trino.ownership_audit`` (beat every 5 min, expires 5 min): run by the ``trino`` lease holder
  only; a no-op where Trino is not wired.
- ``worker_ready`` in the trino worker (consuming ``duckgres.trino``): start the exporter on
  ``DUCKGRES_TRINO_METRICS_PORT`` (0 disables it), then §4.1 step 7 -- check the catalog writer
  (when enabled), run its bootstrap DDL if requested, and the ownership audit (log only). A
  failing writer check or bootstrap stops the worker (exit code 2): it must not run pools it
  cannot publish to. In the control worker (``duckgres.control``): the ownership audit only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.db import DatabaseError

from trino_pools import audit, catalog_store, config, lease, metrics

_log = logging.getLogger("duckgres.trino.worker")

TRINO_QUEUE = "duckgres.trino"
CONTROL_QUEUE = "duckgres.control"
AUDIT_TASK = "trino.ownership_audit"


@shared_task(name=AUDIT_TASK, acks_late=False, ignore_result=True)
def ownership_audit_task() -> dict[str, object]:
    settings = config.current()
    if not settings.wired:
        return {"wired": False}
    if not lease.lease().acquire():
        return {"wired": True, "leader": False}
    result = audit.run_audit(settings)
    return {"wired": True, "leader": True, "count": result.count if result else 0}


def consumed_queues(consumer: Any) -> set[str]:
    """Queue names a Celery worker consumes (``-Q``), from the ``worker_ready`` sender."""
    names: set[str] = set()
    with contextlib.suppress(AttributeError):
        names.update(consumer.app.amqp.queues.consume_from.keys())
    task_consumer = getattr(consumer, "task_consumer", None)
    for queue in getattr(task_consumer, "queues", None) or []:
        names.add(str(queue.name))
    return names


def worker_start(settings: config.TrinoSettings) -> None:
    """§4.1 step 7 and the exporter; raises ``catalog_store.CatalogStoreError`` when fatal."""
    if not settings.wired:
        return
    if settings.metrics_port:
        try:
            metrics.EXPORTER.start(settings.metrics_port)
        except OSError as exc:
            _log.error("trino worker: cannot start the metrics exporter: %s", exc)
    metrics.mark_configured(settings)
    if settings.catalog_writer_enabled:
        catalog_store.check_writer(settings, bootstrap=settings.catalog_bootstrap)
    start_audit(settings)


AUDIT_INTERVAL_SECONDS = 300
_PERIOD_SECONDS = {"microseconds": 1e-6, "seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}


def beat_drift_warnings() -> list[str]:
    """Warnings for the ownership audit's beat rows (none = as shipped by migration 0005)."""
    from django_celery_beat.models import PeriodicTask

    rows = [
        row
        for row in PeriodicTask.objects.filter(task=AUDIT_TASK).select_related("interval")
        if row.enabled
    ]
    if not rows:
        return [
            f"no enabled beat entry runs {AUDIT_TASK}: the periodic Trino ownership audit will "
            "never run (restore the row written by migration 0005)"
        ]
    warnings: list[str] = []
    for row in rows:
        seconds = (
            row.interval.every * _PERIOD_SECONDS.get(row.interval.period, 0)
            if row.interval is not None
            else None
        )
        if seconds != AUDIT_INTERVAL_SECONDS:
            warnings.append(
                f"beat entry {row.name!r} for {AUDIT_TASK} runs every {seconds} s; "
                f"expected an interval of {AUDIT_INTERVAL_SECONDS} s"
            )
        elif row.expire_seconds != seconds:
            warnings.append(
                f"beat entry {row.name!r} for {AUDIT_TASK} has expire_seconds="
                f"{row.expire_seconds}; it must equal the interval ({seconds:g} s)"
            )
        if row.queue and row.queue != TRINO_QUEUE:
            warnings.append(
                f"beat entry {row.name!r} for {AUDIT_TASK} is routed to queue {row.queue!r}; "
                f"expected {TRINO_QUEUE}"
            )
    return warnings


def start_audit(settings: config.TrinoSettings) -> None:
    """The start-up ownership audit: log only (the gauge is the beat run's, §4.14)."""
    try:
        audit.run_audit(settings, set_gauge=False)
    except DatabaseError as exc:
        _log.warning("the start-up Trino ownership audit failed: %s", exc)


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    queues = consumed_queues(sender)
    if TRINO_QUEUE in queues:
        try:
            worker_start(config.current())
        except catalog_store.CatalogStoreError as exc:
            _log.critical("trino worker cannot start: %s", exc)
            os._exit(2)
    elif CONTROL_QUEUE in queues:
        start_audit(config.current())


worker_ready.connect(on_worker_ready, weak=False, dispatch_uid="trino_pools.trino-worker-ready")
