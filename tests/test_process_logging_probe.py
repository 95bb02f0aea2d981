"""A Celery loader for the process-logging tests; it holds no tests.

``tests/test_process_logging.py`` starts real ``celery -A duckgres_admin worker`` and ``beat``
processes with ``CELERY_LOADER=tests.test_process_logging_probe:ProbeLoader`` (Celery's own
``--loader`` mechanism). The loader is Celery's default one plus a probe installed in that
process only: the worker registers the task ``probe.leak`` and, once ready, logs lines carrying
the internal shared secret raw and URL-encoded with ``op_id``/``epoch``/``pool_id`` fields
(stdlib ``extra=``, structlog keywords, a traceback, a ``print``); beat logs the same lines when
it starts. The task logs them too, then fails with the secret in its exception, so Celery's own
failure line carries it. Nothing happens at import: pytest collects this module.
"""

from __future__ import annotations

import logging
import sys
from typing import Any
from urllib.parse import quote, quote_plus

import structlog
from celery import signals
from celery.loaders.app import AppLoader
from django.conf import settings

OP_ID, EPOCH, POOL_ID = 41, 3, 5
FIELDS = {"op_id": OP_ID, "epoch": EPOCH, "pool_id": POOL_ID}
TASK = "probe.leak"

_log = logging.getLogger("duckgres.test.probe")


def leak(where: str) -> None:
    """Log the internal secret in every way a process can, from ``where``."""
    secret = str(settings.DUCKGRES_INTERNAL_SECRET)
    encoded, plus = quote(secret, safe=""), quote_plus(secret)
    _log.warning("probe %s raw %s", where, secret, extra=FIELDS)
    _log.warning(
        "probe %s url-encoded postgresql://u:%s@h/db?password=%s", where, encoded, plus,
        extra={**FIELDS, "dsn": f"postgresql://u:{encoded}@h/db", "nested": {"s": [secret]}},
    )  # fmt: skip
    structlog.get_logger("duckgres.test.probe").warning(
        f"probe {where} structlog {secret}", **FIELDS, password=secret, dsn=encoded
    )
    try:
        raise RuntimeError(f"probe {where} failure {secret} {encoded}")
    except RuntimeError:
        _log.exception("probe %s exception", where, extra=FIELDS)
    print(f"probe {where} print {secret}")
    print(f"probe {where} stderr {encoded}", file=sys.stderr)


def _leak_task() -> None:
    leak("task")
    secret = str(settings.DUCKGRES_INTERNAL_SECRET)
    raise RuntimeError(f"probe task raised {secret} {quote(secret, safe='')}")


def _on_worker_ready(**_kwargs: Any) -> None:
    leak("worker")


def _on_beat_init(**_kwargs: Any) -> None:
    leak("beat")


class ProbeLoader(AppLoader):
    """Celery's default loader; once the default modules (and Django) are loaded, installs the
    probe in this process."""

    _installed = False

    def import_default_modules(self) -> Any:
        modules = super().import_default_modules()
        if not ProbeLoader._installed:
            ProbeLoader._installed = True
            self.app.task(name=TASK)(_leak_task)
            signals.worker_ready.connect(_on_worker_ready, weak=False)
            signals.beat_init.connect(_on_beat_init, weak=False)
        return modules
