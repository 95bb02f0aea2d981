"""Control-worker start-up: the metrics exporter and the beat-row drift warning (design §3).

Wired to Celery's ``worker_ready`` signal from ``reshard.tasks``. Both act only in a worker
that consumes the ``duckgres.control`` queue (the janitor's solo worker): the exporter listens
on ``DUCKGRES_CONTROL_METRICS_PORT`` (0 disables it), and a janitor beat row that drifted from
its entry in ``duckgres_admin.platform.beat.ROWS`` ("every 30 s on duckgres.control, expires 30
s") is
reported as a warning, because a longer interval delays every relaunch and an ``expires``
different from the interval either replays a backlog after an outage or drops live ticks.
The worker only warns; a missing row is re-created by beat at its start
(``duckgres_admin.platform.beat``), never by the worker, and a drifted one is never changed.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import Error as DbError

from duckgres_admin.platform import beat
from duckgres_admin.platform.queues import QueueName, TaskName, consumed_queues
from reshard.control import metrics

_log = logging.getLogger("duckgres.reshard.worker")

RECONCILE_TASK = TaskName.RECONCILE
JANITOR_ROW = beat.row_for_task(RECONCILE_TASK)
JANITOR_INTERVAL_SECONDS = JANITOR_ROW.interval_seconds


def beat_drift_warnings() -> list[str]:
    """Warnings for the janitor's beat row (none = as in ``duckgres_admin.platform.beat.ROWS``)."""
    return beat.drift_warnings((JANITOR_ROW,))


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` handler: start the exporter and check the beat row (control worker)."""
    if QueueName.CONTROL not in consumed_queues(sender):
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
