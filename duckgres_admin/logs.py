"""Structured JSON logs (structlog over the standard library).

Every line is one JSON object. Callers bind ``op_id``, ``org_id``, ``epoch`` (or ``pool_id``)
with ``structlog.contextvars`` or ``log.bind``. Secret scrubbing happens at the sinks that can
carry operation secrets (see ``reshard.scrub``); this module adds a final process-wide pass over
the three shared secrets so no log line can carry them.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog
from django.conf import settings

_configured = False


def _shared_secrets() -> list[str]:
    return [
        s
        for s in (
            getattr(settings, "DUCKGRES_INTERNAL_SECRET", ""),
            getattr(settings, "DUCKGRES_RUNNER_SECRET", ""),
            getattr(settings, "DUCKGRES_DATAPLANE_SECRET", ""),
        )
        if s
    ]


def _scrub_shared_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    secrets = _shared_secrets()
    if not secrets:
        return event_dict
    for key, value in list(event_dict.items()):
        if isinstance(value, str):
            for secret in secrets:
                if secret in value:
                    value = value.replace(secret, "***")
            event_dict[key] = value
    return event_dict


def configure_logging() -> None:
    """Route structlog through stdlib logging with a JSON renderer; idempotent."""
    global _configured
    if _configured:
        return
    _configured = True
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _scrub_shared_secrets,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        # Standard-library records keep their ``extra=`` fields (op_id, epoch, ...) as JSON keys.
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *shared],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setFormatter(formatter)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
