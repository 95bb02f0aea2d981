"""The Celery application. Tasks are thin: they read rows and call domain services.

Logging (docs/logging.md): Celery never configures logging itself. A receiver of
``setup_logging`` exists, so Celery neither hijacks the root logger nor installs its plain-text
formatters; every worker (and its pool processes) and beat log one scrubbed JSON line per record
through ``duckgres_admin.platform.logs`` -- Celery's own task and worker lines included. The level
is
``DUCKGRES_LOG_LEVEL`` (``--loglevel`` and ``--logfile`` are not used); stdout and stderr are
redirected into the log as Celery would (``worker_redirect_stdouts``). ``celeryd_init``, the
worker's first signal, applies the same configuration before the worker's first warning.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery, signals

from duckgres_admin.platform.logs import configure_logging

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")


def _share_metrics_between_processes() -> None:
    """The default worker's prefork children share their Prometheus counters through files in
    ``DUCKGRES_WORKER_METRICS_DIR`` (docs/monitoring.md "Platform metrics"). prometheus_client
    picks its storage when a metric is first created, at the first import of a module that
    defines one, so the directory is made ready here, before any: created, its ``*.db`` files
    of a previous container deleted (never anything else), the switch set. For
    ``celery … worker`` only: no other command run in the container (the probe's ``celery
    inspect ping``) may add files there."""
    directory = os.environ.get("DUCKGRES_WORKER_METRICS_DIR", "")
    if not directory or "worker" not in sys.argv[1:6]:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory


_share_metrics_between_processes()

app = Celery("duckgres_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    [
        "reshard",
        "trino_pools",
        "duckgres_admin.notifications",
        "duckgres_admin.housekeeping",
        "duckgres_admin.observability",
    ]
)


@signals.celeryd_init.connect
def _json_logs_from_the_start(**_kwargs: Any) -> None:
    configure_logging()


@signals.setup_logging.connect
def _json_logs(**_kwargs: Any) -> None:
    configure_logging()
    if app.conf.worker_redirect_stdouts:
        app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)
