"""Celery and webhook metrics, and where each process exports them.

Invariants:

- **Outcomes are counted where the task ran**, once per event, from Celery's ``task_success``,
  ``task_failure`` and ``task_retry`` signals. The solo control and trino workers export them on
  their own exporters (``DUCKGRES_CONTROL_METRICS_PORT``, ``DUCKGRES_TRINO_METRICS_PORT``). The
  default worker's prefork children cannot serve HTTP: with ``PROMETHEUS_MULTIPROC_DIR`` set
  (an ``emptyDir`` in ``k8s/base/worker.yaml``) each child writes its counters to that directory and
  the worker's main process, which never runs a task, serves their sum on
  ``DUCKGRES_WORKER_METRICS_PORT``. The directory is emptied when the main process starts
  (``duckgres_admin.celery``), so a restarted container never re-counts a previous one's events.
- **Labels are bounded**: ``task`` is one of the product's task names or ``other``; ``outcome``
  one of :data:`OUTCOMES`; ``queue`` one of the direct queues.
- **Gauges are read, not kept**: queue depth from the broker (a passive declare: the message
  count, nothing consumed or created) and deliveries given up from the config store, by the
  control worker after each janitor tick, every replica alike (take the max across replicas).
  A broadcast queue has no depth: Redis delivers it by pub/sub, which keeps nothing.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

from celery import current_app
from django.db.models.functions import Now
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from duckgres_admin.models import Notification, NotificationState
from duckgres_admin.platform.queues import BROADCAST, QueueName, TaskName

_log = logging.getLogger("duckgres.observability")

OUTCOMES = ("succeeded", "failed", "retried")
GIVEN_UP_WINDOW = timedelta(hours=24)
BROKER_TIMEOUT_SECONDS = 5
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

TASKS = Counter(
    "duckgres_celery_tasks",
    "Celery tasks that ended, by task name and outcome (counted in the process that ran them).",
    ["task", "outcome"],
)
QUEUE_MESSAGES = Gauge(
    "duckgres_celery_queue_messages",
    "Messages waiting in a direct Celery queue, read from the broker after each janitor tick.",
    ["queue"],
    multiprocess_mode="max",
)
GIVEN_UP = Gauge(
    "duckgres_webhook_deliveries_given_up_24h",
    "Webhook notifications given up (attempts exhausted or refused for good) in the last 24 h.",
    multiprocess_mode="max",
)

_KNOWN = frozenset(TaskName)


def task_label(name: str | None) -> str:
    return name if name in _KNOWN else "other"


def count_task(name: str | None, outcome: str) -> None:
    TASKS.labels(task=task_label(name), outcome=outcome).inc()


def direct_queues() -> tuple[str, ...]:
    return tuple(q for q in QueueName if q not in BROADCAST)


def read_queue_depths() -> dict[str, int]:
    """The waiting messages of every direct queue, from the broker (a passive declare each)."""
    depths: dict[str, int] = {}
    with current_app.connection_for_read() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
        channel: Any = conn.default_channel  # kombu types the channel without its methods
        for queue in direct_queues():
            try:
                declared = channel.queue_declare(queue=queue, passive=True)
                depths[queue] = int(declared.message_count)
            except Exception as exc:  # noqa: BLE001 - a queue nobody declared yet is empty
                _log.debug("queue %s not declared on the broker yet: %s", queue, exc)
                depths[queue] = 0
    return depths


def given_up_recently() -> int:
    return Notification.objects.filter(
        state=NotificationState.FAILED, last_attempt_at__gte=Now() - GIVEN_UP_WINDOW
    ).count()


def refresh_gauges() -> None:
    """After a janitor tick: queue depth and deliveries given up; a failed read logs a warning
    and leaves that gauge as it was (never a failed tick)."""
    try:
        for queue, depth in read_queue_depths().items():
            QUEUE_MESSAGES.labels(queue=queue).set(depth)
    except Exception as exc:  # noqa: BLE001 - the broker's own errors vary by transport
        _log.warning("platform metrics: reading the queue depths failed: %s", exc)
    try:
        GIVEN_UP.set(given_up_recently())
    except Exception as exc:  # noqa: BLE001 - a database error must not fail the tick
        _log.warning("platform metrics: counting webhook deliveries given up failed: %s", exc)


def start_multiprocess_exporter(port: int) -> bool:
    """In the default worker's main process: serve the children's counters on ``port``, from
    ``PROMETHEUS_MULTIPROC_DIR`` (made ready, before any metric existed, by
    ``duckgres_admin.celery``). Off when the variable is unset or the port is 0."""
    directory = os.environ.get(MULTIPROC_VARIABLE, "")
    if not directory or not port:
        return False
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    start_http_server(port, registry=registry)
    _log.info("default worker metrics exporter listening on :%d (%s)", port, directory)
    return True


def mark_child_gone(pid: int) -> None:
    if os.environ.get(MULTIPROC_VARIABLE):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
