"""Control-worker start-up: the metrics exporter and the beat-row drift warning (design §3).

Wired to Celery's ``worker_ready`` signal from ``reshard.tasks``. Both act only in a worker
that consumes the ``duckgres.control`` queue (the janitor's solo worker): the exporter listens
on ``DUCKGRES_CONTROL_METRICS_PORT`` (0 disables it), and a janitor beat row that drifted from
its entry in ``duckgres_admin.beat.ROWS`` ("every 30 s on duckgres.control, expires 30 s") is
reported as a warning, because a longer interval delays every relaunch and an ``expires``
different from the interval either replays a backlog after an outage or drops live ticks.
The worker only warns; a missing row is re-created by beat at its start
(``duckgres_admin.beat``), never by the worker, and a drifted one is never changed.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from django.db import Error as DbError

from duckgres_admin import beat
from reshard import metrics

_log = logging.getLogger("duckgres.reshard.worker")

RECONCILE_TASK = "reshard.reconcile"
JANITOR_ROW = beat.row_for_task(RECONCILE_TASK)
CONTROL_QUEUE = beat.CONTROL_QUEUE
JANITOR_INTERVAL_SECONDS = JANITOR_ROW.interval_seconds


def consumed_queues(consumer: Any) -> set[str]:
    """Queue names a Celery worker consumes (``-Q``), from the ``worker_ready`` sender."""
    names: set[str] = set()
    with contextlib.suppress(AttributeError):
        names.update(consumer.app.amqp.queues.consume_from.keys())
    task_consumer = getattr(consumer, "task_consumer", None)
    for queue in getattr(task_consumer, "queues", None) or []:
        names.add(str(queue.name))
    return names


def beat_drift_warnings() -> list[str]:
    """Warnings for the janitor's beat rows (none = as in ``duckgres_admin.beat.ROWS``)."""
    from django_celery_beat.models import PeriodicTask

    rows = list(PeriodicTask.objects.filter(task=RECONCILE_TASK).select_related("interval"))
    enabled = [row for row in rows if row.enabled]
    if not enabled:
        return [
            f"no enabled beat entry runs {RECONCILE_TASK}: the reshard janitor will never run "
            f"(restore the row written by migration {JANITOR_ROW.migration})"
        ]
    warnings: list[str] = []
    for row in enabled:
        seconds = beat.schedule_seconds(row)
        if seconds is None:
            warnings.append(
                f"beat entry {row.name!r} for {RECONCILE_TASK} is not an interval schedule; "
                f"expected every {JANITOR_INTERVAL_SECONDS} s"
            )
            continue
        if seconds != JANITOR_INTERVAL_SECONDS:
            warnings.append(
                f"beat entry {row.name!r} for {RECONCILE_TASK} runs every {seconds:g} s; "
                f"expected {JANITOR_INTERVAL_SECONDS} s"
            )
        if row.expire_seconds != seconds:
            warnings.append(
                f"beat entry {row.name!r} for {RECONCILE_TASK} has expire_seconds="
                f"{row.expire_seconds} but its interval is {seconds:g} s; they must be equal "
                "so a backlog is dropped, not replayed"
            )
        if row.queue and row.queue != JANITOR_ROW.queue:
            warnings.append(
                f"beat entry {row.name!r} for {RECONCILE_TASK} is routed to queue "
                f"{row.queue!r}; expected {JANITOR_ROW.queue}"
            )
    return warnings


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` handler: start the exporter and check the beat row (control worker)."""
    if CONTROL_QUEUE not in consumed_queues(sender):
        return
    try:
        metrics.start_exporter()
    except OSError as exc:
        _log.error("control worker: cannot start the metrics exporter: %s", exc)
    try:
        for warning in beat_drift_warnings():
            _log.warning("control worker: %s", warning)
    except DbError as exc:
        _log.warning("control worker: cannot check the janitor beat entry: %s", exc)
