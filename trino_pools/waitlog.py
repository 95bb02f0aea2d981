"""Rate-limited "Trino pool member is waiting." log lines (spec trino-pools §4.6, safeguard 35).

A member that waits (for obligations to drain, for Kubernetes resources, for a coordinator …)
is polled every tick; logging each poll would flood the logs. Per instance, a line is emitted:

- on the first wait seen for the instance;
- when the reason differs from the last *logged* reason, at most once per 30 s;
- when the reason is unchanged, every 5 minutes (a heartbeat).

Fields: ``pool``, ``instance``, ``epoch``, ``phase``, ``phase_age_seconds``, ``reason``; for
reason ``gateway_obligations`` also ``pending_requests``, ``open_transactions``,
``active_queries``, ``ready_to_seal`` and ``drained`` (all five required). Obligation fields are
never emitted for another reason (``kubernetes_resources`` never invents them). ``retain``
drops instances that left the snapshot so the cache stays bounded by the live instances.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MESSAGE = "Trino pool member is waiting."
REASON_CHANGE_INTERVAL = 30.0
HEARTBEAT_INTERVAL = 300.0
OBLIGATIONS = "gateway_obligations"
OBLIGATION_FIELDS = (
    "pending_requests",
    "open_transactions",
    "active_queries",
    "ready_to_seal",
    "drained",
)

_log = logging.getLogger("duckgres.trino.operator")

# LogRecord attributes an ``extra=`` key may not overwrite.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
}


@dataclass
class _Entry:
    pool: str
    reason: str
    logged_at: float


class WaitLog:
    """Per-instance rate limiter for the waiting line; thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        self._clock = clock
        self._logger = logger or _log
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def waiting(
        self,
        pool: str,
        instance: str,
        epoch: int,
        phase: str,
        phase_age_seconds: float,
        reason: str,
        **fields: Any,
    ) -> bool:
        """Record that ``instance`` waits for ``reason``; True when a line was logged."""
        if reason == OBLIGATIONS:
            missing = [name for name in OBLIGATION_FIELDS if name not in fields]
            if missing:
                raise TypeError(f"reason {OBLIGATIONS} needs the fields {', '.join(missing)}")
        else:
            fields = {k: v for k, v in fields.items() if k not in OBLIGATION_FIELDS}
        clash = sorted(set(fields) & _RESERVED)
        if clash:
            raise ValueError(f"log field names {clash} are reserved by logging")
        now = self._clock()
        with self._lock:
            entry = self._entries.get(instance)
            if entry is not None:
                interval = HEARTBEAT_INTERVAL if entry.reason == reason else REASON_CHANGE_INTERVAL
                if now - entry.logged_at < interval:
                    return False
            self._entries[instance] = _Entry(pool=pool, reason=reason, logged_at=now)
        self._logger.info(
            MESSAGE,
            extra={
                "pool": pool,
                "instance": instance,
                "epoch": epoch,
                "phase": phase,
                "phase_age_seconds": round(max(0.0, float(phase_age_seconds)), 3),
                "reason": reason,
                **fields,
            },
        )
        return True

    def retain(self, instance_ids: Iterable[str], *, pool: str | None = None) -> None:
        """Forget instances not in ``instance_ids`` (only those of ``pool`` when given)."""
        keep = set(instance_ids)
        with self._lock:
            for instance in list(self._entries):
                entry = self._entries[instance]
                if instance not in keep and (pool is None or entry.pool == pool):
                    del self._entries[instance]

    def forget(self, instance: str) -> None:
        with self._lock:
            self._entries.pop(instance, None)

    def cached(self) -> frozenset[str]:
        """Instance ids currently in the cache (for tests and introspection)."""
        with self._lock:
            return frozenset(self._entries)
