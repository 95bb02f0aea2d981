"""Celery signal receivers for the platform metrics (no task is defined here; Celery imports
this module with the tasks modules). What they count and where it is exported:
:mod:`duckgres_admin.observability.metrics`."""

from __future__ import annotations

import os
from typing import Any

from celery import signals
from django.conf import settings

from duckgres_admin.observability import metrics
from duckgres_admin.platform.queues import TaskName


def _name(sender: Any) -> str | None:
    return getattr(sender, "name", None)


@signals.task_success.connect
def _succeeded(sender: Any = None, **_: Any) -> None:
    metrics.count_task(_name(sender), "succeeded")


@signals.task_failure.connect
def _failed(sender: Any = None, **_: Any) -> None:
    metrics.count_task(_name(sender), "failed")


@signals.task_retry.connect
def _retried(sender: Any = None, **_: Any) -> None:
    metrics.count_task(_name(sender), "retried")


@signals.task_postrun.connect
def _after_janitor_tick(sender: Any = None, **_: Any) -> None:
    if _name(sender) == TaskName.RECONCILE:
        metrics.refresh_gauges()


@signals.worker_init.connect
def _default_worker_exporter(**_: Any) -> None:
    metrics.start_multiprocess_exporter(int(settings.DUCKGRES_WORKER_METRICS_PORT))


@signals.worker_process_shutdown.connect
def _child_gone(pid: int | None = None, **_: Any) -> None:
    metrics.mark_child_gone(pid or os.getpid())
