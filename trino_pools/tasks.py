"""Celery tasks and trino-worker start-up of the Trino pool domain (spec trino-pools §4.3, §4.14).

The trino worker is its own Celery worker consuming only ``duckgres.trino`` with
``--pool=solo --concurrency=1``. Routing: ``CELERY_TASK_ROUTES`` in settings; the beat rows
name the queue too.

- ``trino.ownership_audit`` (beat every 5 min, expires 5 min): run by the ``trino`` lease holder
  only; a no-op where Trino is not wired.
- ``trino.pool_tick`` (beat every 5 s, expires 5 s): one operator tick (``trino_pools.operator``);
  a no-op where Trino is not wired or the operator is disabled (read-only operator).
- ``trino.reconcile_orgs`` (beat every 30 s, expires 30 s): the leader's sweep of every
  Trino-enabled or catalog-holding org; ``trino.reconcile_org(org_id)`` is queued after commit by
  enable, disable, tier and move changes (``trino_pools.enqueue``: by name, so the API never
  imports this module or the operator). Both need the catalog writer this worker holds: in a
  process without it they leave every row untouched (``NotThisReplica``).
- ``worker_shutdown``: every live term ends (term gauges removed, catalog writer released).
- ``worker_ready`` in the trino worker (consuming ``duckgres.trino``): start the exporter on
  ``DUCKGRES_TRINO_METRICS_PORT`` (0 disables it), then §4.1 step 7 -- check the catalog writer
  (when enabled), run its bootstrap DDL if requested, and the ownership audit (log only). A
  failing writer check or bootstrap stops the worker (exit code 2): it must not run pools it
  cannot publish to. In the control worker (``duckgres.control``): the ownership audit only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown
from django.db import DatabaseError

from duckgres_admin.platform import beat
from duckgres_admin.platform.queues import QueueName, TaskName, consumed_queues
from trino_pools import audit, catalog_store, config, lease, metrics, operator, reconcile

_log = logging.getLogger("duckgres.trino.worker")

TRINO_QUEUE = QueueName.TRINO
AUDIT_TASK = TaskName.TRINO_OWNERSHIP_AUDIT
POOL_TICK_TASK = TaskName.TRINO_POOL_TICK
RECONCILE_ORG_TASK = TaskName.TRINO_RECONCILE_ORG
RECONCILE_ORGS_TASK = TaskName.TRINO_RECONCILE_ORGS


@shared_task(name=AUDIT_TASK, acks_late=False, ignore_result=True)
def ownership_audit_task() -> dict[str, object]:
    settings = config.current()
    if not settings.wired:
        return {"wired": False}
    if not lease.lease().acquire():
        return {"wired": True, "leader": False}
    result = audit.run_audit(settings)
    return {"wired": True, "leader": True, "count": result.count if result else 0}


@shared_task(name=POOL_TICK_TASK, acks_late=False, ignore_result=True)
def pool_tick_task() -> dict[str, object]:
    settings = config.current()
    if not settings.wired or not settings.operator_enabled:
        return {"wired": settings.wired, "operator": False}
    report = operator.operator().tick(settings)
    return {"wired": True, "leader": report.leader, "pools": report.pools}


@shared_task(name=RECONCILE_ORG_TASK, acks_late=False, ignore_result=True)
def reconcile_org_task(org_id: str) -> str:
    if not config.current().wired:
        return "not wired"
    return reconcile.reconcile_org(org_id)


@shared_task(name=RECONCILE_ORGS_TASK, acks_late=False, ignore_result=True)
def reconcile_orgs_task() -> dict[str, object]:
    settings = config.current()
    if not settings.wired or not settings.operator_enabled:
        return {"wired": settings.wired, "operator": False}
    if not lease.lease().acquire():
        return {"wired": True, "leader": False}
    return {"wired": True, "leader": True, "orgs": reconcile.reconcile_orgs()}


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
    if settings.node_disruption_enabled:
        _log.warning(
            "DUCKGRES_TRINO_POOL_NODE_DISRUPTION_ENABLED is true, but node replacement "
            "(spec 4.13) is not built in this version: no node is protected, cordoned or "
            "replaced; set it to false to silence this warning"
        )
    if settings.catalog_writer_enabled:
        catalog_store.check_writer(settings, bootstrap=settings.catalog_bootstrap)
    start_audit(settings)


# Every Trino beat row as shipped by migrations 0005 and 0006: the product's one table of beat
# rows (``duckgres_admin.platform.beat.ROWS``, which beat uses to re-create a deleted row at its
# start).
BEAT_ROWS: tuple[beat.BeatRow, ...] = beat.rows_on_queue(TRINO_QUEUE)
BEAT_INTERVALS: dict[str, int] = {row.task: row.interval_seconds for row in BEAT_ROWS}
AUDIT_INTERVAL_SECONDS = BEAT_INTERVALS[AUDIT_TASK]


def beat_drift_warnings() -> list[str]:
    """Warnings for the Trino beat rows (none = as in ``duckgres_admin.platform.beat.ROWS``)."""
    return beat.drift_warnings(BEAT_ROWS)


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
            for warning in beat_drift_warnings():
                _log.warning("%s", warning)
        except DatabaseError as exc:
            _log.warning("cannot check the Trino beat entries: %s", exc)
        try:
            worker_start(config.current())
        except catalog_store.CatalogStoreError as exc:
            _log.critical("trino worker cannot start: %s", exc)
            os._exit(2)
    elif QueueName.CONTROL in queues:
        start_audit(config.current())


def on_worker_shutdown(**_: Any) -> None:
    operator.shutdown()


worker_ready.connect(on_worker_ready, weak=False, dispatch_uid="trino_pools.trino-worker-ready")
worker_shutdown.connect(
    on_worker_shutdown, weak=False, dispatch_uid="trino_pools.trino-worker-shutdown"
)
