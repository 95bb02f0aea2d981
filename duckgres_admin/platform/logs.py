"""Structured, scrubbed JSON logs in every process (structlog over the standard library).

Invariants (docs/logging.md):

- Every record of every process -- the API under gunicorn (its error and access logs too), the
  runner, every Celery worker and beat, management commands -- is ONE JSON object on ONE line,
  written to stderr by :class:`JsonFormatter`. ``settings.LOGGING`` keeps its handlers, levels
  and loggers, but its formatters are replaced at runtime by this one (:func:`logging_config`).
- A line carries ``timestamp`` (UTC ISO), ``level``, ``logger``, ``event``, the context bound
  with ``structlog.contextvars`` / ``log.bind`` and every ``extra=`` field of a stdlib call
  (``op_id``, ``org_id``, ``epoch``, ``pool_id``, ...); inside a Celery task also ``task_id``
  and ``task_name``; an access-log line also the request's fields.
- The last step before rendering is the process-wide scrub: every string of the line (keys,
  values, nested values, the rendered traceback, the ``repr`` of any other object) has the
  three shared secrets masked by the one scrubber, ``duckgres_admin.base.scrub.Scrubber``, in
  every form it masks (raw, URL-encoded, and the partly encoded forms of URLs). Operation
  secrets are scrubbed at their own sinks (``duckgres_admin.base.scrub``).
- :func:`configure_logging` may run any number of times (Django's ``ready``, the runner,
  Celery's ``celeryd_init`` and ``setup_logging`` signals); each run leaves the same state.
"""

from __future__ import annotations

import copy
import functools
import logging
import logging.config
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog
from celery import current_task
from celery.utils.log import LoggingProxy
from django.conf import settings

from duckgres_admin.base.scrub import Scrubber, shared_secrets

# Loggers that Django's DEFAULT_LOGGING gives handlers of their own (plain text): they are
# reset to propagate to the root logger's JSON handler instead.
_DJANGO_OWN_HANDLERS = ("django", "django.server")

# gunicorn access-log atoms kept as fields of their own (the event is the formatted line).
_ACCESS_FIELDS = {
    "h": "remote_addr",
    "m": "method",
    "U": "path",
    "q": "query",
    "H": "protocol",
    "s": "status",
    "B": "response_bytes",
    "M": "duration_ms",
    "f": "referer",
    "a": "user_agent",
}


@functools.lru_cache(maxsize=8)
def _scrubber(secrets: tuple[str, ...]) -> Scrubber:
    """The one scrubber of ``secrets``, built once per set of shared secrets."""
    return Scrubber(*secrets)


def _scrub_mapping(mapping: Mapping[Any, Any], scrubber: Scrubber) -> dict[str, Any]:
    return {scrubber.scrub(str(k)): _scrub(v, scrubber) for k, v in mapping.items()}


def _scrub(value: object, scrubber: Scrubber) -> object:
    if isinstance(value, str):
        return scrubber.scrub(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return _scrub_mapping(value, scrubber)
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, scrubber) for v in value]
    # What the JSON renderer would print for it (its fallback is repr), scrubbed.
    return scrubber.scrub(repr(value))


def _scrub_shared_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    return _scrub_mapping(event_dict, _scrubber(tuple(shared_secrets())))


def _add_task_context(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """``task_id`` / ``task_name`` of the Celery task running in this thread, if any."""
    if current_task:
        request = current_task.request
        if request is not None and request.id:
            event_dict.setdefault("task_id", request.id)
            event_dict.setdefault("task_name", current_task.name)
    return event_dict


def _foreign_args(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A stdlib record's arguments are already in ``event``; a gunicorn access record's atoms
    also become fields."""
    args = event_dict.pop("positional_args", None)
    record = event_dict.get("_record")
    if isinstance(args, Mapping) and getattr(record, "name", "") == "gunicorn.access":
        for atom, key in _ACCESS_FIELDS.items():
            value = args.get(atom)
            if isinstance(value, str) and key == "status" and value.isdigit():
                value = int(value)
            event_dict.setdefault(key, value)
    return event_dict


_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _add_task_context,
]


class JsonFormatter(structlog.stdlib.ProcessorFormatter):
    """The one formatter of every handler: a record in, one scrubbed JSON line out."""

    def __init__(self) -> None:
        super().__init__(
            # Standard-library records keep their ``extra=`` fields (op_id, epoch, ...).
            foreign_pre_chain=[structlog.stdlib.ExtraAdder(), _foreign_args, *_SHARED],
            pass_foreign_args=True,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                # Last before rendering: the traceback above is scrubbed too.
                _scrub_shared_secrets,
                structlog.processors.JSONRenderer(),
            ],
        )


def _stderr() -> TextIO | None:
    """The stream a new handler writes to: ``sys.stderr``, unless Celery replaced it by its
    logger proxy (a handler writing there would log into itself, and the proxy silently drops
    such recursion)."""
    return sys.__stderr__ if isinstance(sys.stderr, LoggingProxy) else sys.stderr


def logging_config() -> dict[str, Any]:
    """``settings.LOGGING`` with every handler formatting through :class:`JsonFormatter`."""
    config: dict[str, Any] = copy.deepcopy(settings.LOGGING)
    config["formatters"] = {"json": {"()": JsonFormatter}}
    for handler in config.get("handlers", {}).values():
        handler["formatter"] = "json"
        if handler.get("class") == "logging.StreamHandler":
            handler.setdefault("stream", _stderr())
    loggers = config.setdefault("loggers", {})
    for name in _DJANGO_OWN_HANDLERS:
        loggers.setdefault(name, {"handlers": [], "propagate": True})
    return config


def gunicorn_logconfig_dict() -> dict[str, Any]:
    """gunicorn's ``logconfig_dict``: its error and access loggers propagate to the root
    logger's JSON handler (stderr). The error log follows the root level, the access log logs
    every request."""
    config = logging_config()
    root_level = config.get("root", {}).get("level", "INFO")
    config["loggers"]["gunicorn.error"] = {"level": root_level, "handlers": [], "propagate": True}
    config["loggers"]["gunicorn.access"] = {"level": "INFO", "handlers": [], "propagate": True}
    return config


def configure_logging() -> None:
    """(Re)apply the JSON logging of this process: structlog through stdlib logging, every
    handler with :class:`JsonFormatter`, warnings captured as records."""
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    logging.config.dictConfig(logging_config())
    logging.captureWarnings(True)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
