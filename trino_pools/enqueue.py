"""What the API side sends to the trino worker, by task name (spec trino-pools §4.3, §4.10).

Enable, disable, tier and move changes (``trino_pools.placement``) queue
``trino.reconcile_org(org_id)`` once their transaction commits. The message is sent by name on
the ``duckgres.trino`` queue, so the API process never imports the worker's Celery tasks and,
through them, the pool operator (import-linter keeps it so). A lost message is harmless: the
leader's 30 s sweep (``trino.reconcile_orgs``) reconciles every org anyway.
"""

from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction

from duckgres_admin.platform.queues import QueueName, TaskName
from trino_pools import config

_log = logging.getLogger("duckgres.trino.worker")

TRINO_QUEUE = QueueName.TRINO
RECONCILE_ORG_TASK = TaskName.TRINO_RECONCILE_ORG


def queue_reconcile(org_id: str) -> None:
    """Queue ``trino.reconcile_org`` once the caller's transaction commits (org id only)."""
    if not config.current().wired:
        return

    def send() -> None:
        try:
            current_app.send_task(RECONCILE_ORG_TASK, args=[org_id], queue=TRINO_QUEUE)
        except Exception as exc:  # noqa: BLE001 - the 30 s sweep reconciles the org anyway
            _log.warning("cannot queue %s for org %s: %s", RECONCILE_ORG_TASK, org_id, exc)

    transaction.on_commit(send)
