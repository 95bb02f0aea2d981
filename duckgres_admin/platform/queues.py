"""The product's Celery queues and task names, in one place, and which worker consumes what.

Every process that sends or consumes a task reads its names from here: the settings build
``CELERY_TASK_QUEUES`` and ``CELERY_TASK_ROUTES`` from :data:`ROUTES`, the beat table
(``duckgres_admin.platform.beat.ROWS``) names its tasks and queues with these members, the workers'
start-up checks (:func:`consumed_queues`) and the API's by-name senders use them, and
``tests/k8s/test_manifests.py`` checks that the ``-Q`` of every worker Deployment in ``k8s/``
is one of :class:`QueueName` and that every queue a task is routed to has a consumer.

Invariants:

- ``duckgres.control`` is a **broadcast** queue (:data:`BROADCAST`): every control-worker
  replica receives every janitor tick and the ``janitor`` lease decides which one acts (spec
  reshard §4.14: duplicate beats are harmless). A direct queue hands each tick to one replica
  at random, so with two replicas the leader ran a random subset of the ticks and an observed
  runner death waited several intervals. Redis delivers a broadcast by pub/sub, only to the
  replicas connected at that moment, on a channel prefixed with the broker db.
- A broadcast's publisher must declare the fanout exchange itself, or kombu's Redis transport
  takes it for a direct exchange and pushes the message onto one consumer's private list that
  nobody reads: every route to a broadcast queue carries that declaration (:func:`routes`), and
  so does every message a sender addresses to one by name (:func:`declare_broadcasts`).
- Every other queue is a direct one, declared exactly as Celery would create it (exchange and
  routing key named as the queue), so messages already queued before an upgrade are read.
"""

from __future__ import annotations

import contextlib
from enum import StrEnum
from typing import Any

from kombu import Exchange, Queue
from kombu.common import Broadcast


class QueueName(StrEnum):
    """The queues, and the worker Deployment in ``k8s/`` that consumes each."""

    DEFAULT = "duckgres.default"  # worker.yaml: launches runners, delivers notifications
    CONTROL = "duckgres.control"  # control-worker.yaml: the janitor (broadcast)
    TRINO = "duckgres.trino"  # trino-worker.yaml: the Trino pool operator


class TaskName(StrEnum):
    """Every Celery task the product defines (``@shared_task(name=...)`` uses these)."""

    LAUNCH_RUNNER = "reshard.launch_runner"
    RECONCILE = "reshard.reconcile"
    TRINO_OWNERSHIP_AUDIT = "trino.ownership_audit"
    TRINO_POOL_TICK = "trino.pool_tick"
    TRINO_RECONCILE_ORGS = "trino.reconcile_orgs"
    TRINO_RECONCILE_ORG = "trino.reconcile_org"
    NOTIFICATIONS_SCAN = "notifications.scan"
    NOTIFICATIONS_DELIVER = "notifications.deliver"
    BACKUP_RETENTION = "reshard.backup_retention"
    BACKUP_RESTORE_TEST = "reshard.backup_restore_test"
    HOUSEKEEPING_PRUNE = "housekeeping.prune"


# The queue each task is sent to when the sender names none. The Trino tasks all go to the
# trino worker (a glob route, so a new trino.* task cannot land on another worker).
ROUTES: dict[str, QueueName] = {
    TaskName.LAUNCH_RUNNER: QueueName.DEFAULT,
    TaskName.NOTIFICATIONS_SCAN: QueueName.DEFAULT,
    TaskName.NOTIFICATIONS_DELIVER: QueueName.DEFAULT,
    TaskName.BACKUP_RETENTION: QueueName.DEFAULT,
    TaskName.BACKUP_RESTORE_TEST: QueueName.DEFAULT,
    TaskName.HOUSEKEEPING_PRUNE: QueueName.DEFAULT,
    TaskName.RECONCILE: QueueName.CONTROL,
    "trino.*": QueueName.TRINO,
}

BROADCAST: frozenset[QueueName] = frozenset({QueueName.CONTROL})


def _declare(name: QueueName) -> Queue:
    if name in BROADCAST:
        return Broadcast(str(name))
    return Queue(str(name), Exchange(str(name)), routing_key=str(name))


# One kombu declaration per queue, made once per process (a Broadcast gets a unique private
# queue name, so every consumer process has its own subscription).
DECLARATIONS: dict[QueueName, Queue] = {name: _declare(name) for name in QueueName}


def celery_queues() -> tuple[Queue, ...]:
    """``CELERY_TASK_QUEUES``."""
    return tuple(DECLARATIONS[name] for name in QueueName)


def routes() -> dict[str, dict[str, Any]]:
    """``CELERY_TASK_ROUTES``: the queue by name; a broadcast also declares its exchange."""
    table: dict[str, dict[str, Any]] = {}
    for task, queue in ROUTES.items():
        route: dict[str, Any] = {"queue": str(queue)}
        if queue in BROADCAST:
            route["declare"] = [DECLARATIONS[queue].exchange]
        table[str(task)] = route
    return table


def declare_broadcasts(
    name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None, **_: Any
) -> dict[str, Any] | None:
    """Celery router (first in ``CELERY_TASK_ROUTES``): a message a sender addresses to a
    broadcast queue by name (``send_task(..., queue="duckgres.control")``, the admin's "run
    task" action, beat) also declares the fanout exchange, whatever its task."""
    queue = options.get("queue")
    if isinstance(queue, Broadcast):
        return {"queue": queue, "declare": [queue.exchange]}
    return None


def celery_routes() -> tuple[Any, ...]:
    """``CELERY_TASK_ROUTES``: :func:`declare_broadcasts`, then the table (:func:`routes`)."""
    return (declare_broadcasts, routes())


def consumed_queues(consumer: Any) -> set[str]:
    """The queue names a Celery worker consumes (its ``-Q``), from the ``worker_ready`` sender.

    Celery keys the selected queues by their kombu name, which for a broadcast is a private
    ``bcast.<uuid>``; its alias is the product's name, so both are reported."""
    names: set[str] = set()
    queues: list[Any] = []
    with contextlib.suppress(AttributeError):
        selected = consumer.app.amqp.queues.consume_from
        names.update(str(name) for name in selected)
        queues.extend(selected.values())
    task_consumer = getattr(consumer, "task_consumer", None)
    queues.extend(getattr(task_consumer, "queues", None) or [])
    for queue in queues:
        for name in (getattr(queue, "name", None), getattr(queue, "alias", None)):
            if name:
                names.add(str(name))
    return names
