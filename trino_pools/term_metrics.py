"""Term-scoped Trino pool metrics and the reconcile failure counter (spec trino-pools §7).

Term ownership (invariant 11, safeguard 32):

- ``begin_term(pool)`` clears the pool's term gauges and installs a new owner token.
- Only the pool's current token may write (``record_snapshot``); a write with any other token
  (an older term's late snapshot) is a no-op and returns False.
- ``end_term(pool, token)`` removes the pool's term gauges and the token, before the tick
  returns; ending with a stale token is a no-op. Other pools are never touched.

The gauges are served by one custom collector over a lock-protected dict, one entry per pool
with a live term, holding that term's last successful snapshot; a scrape renders the dict, so
removing a pool's entry removes every series of the pool at once and nothing can be left behind
(no per-series deletion). A failed instance read simply does not call ``record_snapshot``: no
sample changes and ``snapshot_timestamp_seconds`` keeps the time of the last successful read.

``duckgres_trino_pool_reconcile_failures_total{pool,reason}`` is an ordinary counter: it is
never cleared on a term change. Reasons are bounded to ``REASONS``; ``classify`` maps an error
to one of them (or to ``None`` for a backoff-only wait, which is not a failure) by class name
and attributes, so that this module depends on none of the modules whose errors it classifies.

Label names are never ``namespace`` or ``instance`` (they collide with scrape-target labels).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from duckgres_admin.models.trino import InstancePhase
from trino_pools.metrics import TRINO_REGISTRY

MEMBERS = "duckgres_trino_pool_members"
SERVING_INFO = "duckgres_trino_pool_serving_instance_info"
MIN_SERVING = "duckgres_trino_pool_min_serving"
OLDEST_DRAIN = "duckgres_trino_pool_oldest_drain_seconds"
SNAPSHOT_TIMESTAMP = "duckgres_trino_pool_snapshot_timestamp_seconds"
FAILURES = "duckgres_trino_pool_reconcile_failures"  # exposed with the ``_total`` suffix

UNKNOWN = "UNKNOWN"
MEMBER_PHASES: tuple[str, ...] = (*(p.value for p in InstancePhase), UNKNOWN)
"""The 15 values of ``members{phase}``, always all exported."""

REASONS: tuple[str, ...] = (
    "fenced",
    "timeout",
    "canceled",
    "gateway_unavailable",
    "gateway_refused",
    "internal",
)

_SERVING_LABELS = [
    "pool",
    "pool_instance",
    "workload_namespace",
    "coordinator_deployment",
    "worker_deployment",
]


class BackoffOnly(Exception):
    """A wait for ``next_attempt_at``: logged at debug, never counted as a failure."""


class TermToken:
    """Proof of ownership of one pool's term gauges; compared by identity."""

    __slots__ = ("pool", "serial")

    def __init__(self, pool: str, serial: int) -> None:
        self.pool = pool
        self.serial = serial

    def __repr__(self) -> str:
        return f"TermToken(pool={self.pool!r}, serial={self.serial})"


@dataclass(frozen=True)
class SnapshotRow:
    """One durable instance row as the snapshot sees it."""

    instance_id: str
    phase: str
    phase_changed_at: float  # Unix seconds
    namespace: str = ""  # the instance's pinned snapshot namespace; "" if unreadable
    coordinator_deployment: str = ""
    worker_deployment: str = ""


@dataclass(frozen=True)
class _Snapshot:
    members: tuple[tuple[str, int], ...]
    serving: tuple[tuple[str, str, str, str], ...]  # instance, namespace, coordinator, worker
    min_serving: int
    namespace: str
    oldest_drain: float
    timestamp: float


@dataclass
class _Term:
    token: TermToken
    snapshot: _Snapshot | None = None


class _TermGauges(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._terms: dict[str, _Term] = {}
        self._serial = itertools.count(1)

    def begin(self, pool: str) -> TermToken:
        with self._lock:
            token = TermToken(pool, next(self._serial))
            self._terms[pool] = _Term(token)
            return token

    def end(self, pool: str, token: TermToken) -> bool:
        with self._lock:
            term = self._terms.get(pool)
            if term is None or term.token is not token:
                return False
            del self._terms[pool]
            return True

    def write(self, pool: str, token: TermToken, snapshot: _Snapshot) -> bool:
        with self._lock:
            term = self._terms.get(pool)
            if term is None or term.token is not token:
                return False
            term.snapshot = snapshot
            return True

    def current(self, pool: str) -> TermToken | None:
        with self._lock:
            term = self._terms.get(pool)
            return None if term is None else term.token

    def _snapshots(self) -> list[tuple[str, _Snapshot]]:
        with self._lock:
            return sorted(
                (pool, term.snapshot)
                for pool, term in self._terms.items()
                if term.snapshot is not None
            )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        members = GaugeMetricFamily(
            MEMBERS,
            "Durable instance rows per phase at the last snapshot.",
            labels=["pool", "phase"],
        )
        serving = GaugeMetricFamily(
            SERVING_INFO,
            "1 per durable SERVING row at the last snapshot (inventory, not health).",
            labels=_SERVING_LABELS,
        )
        floor = GaugeMetricFamily(
            MIN_SERVING,
            "Durable serving floor (min_serving) at the last snapshot.",
            labels=["pool", "workload_namespace"],
        )
        drain = GaugeMetricFamily(
            OLDEST_DRAIN,
            "Age of the oldest DRAINING row (0 if none) at the last snapshot.",
            labels=["pool"],
        )
        stamp = GaugeMetricFamily(
            SNAPSHOT_TIMESTAMP,
            "Unix time of the last successful instance read in this term.",
            labels=["pool"],
        )
        for pool, snap in self._snapshots():
            for phase, value in snap.members:
                members.add_metric([pool, phase], value)
            for instance, namespace, coordinator, worker in snap.serving:
                serving.add_metric([pool, instance, namespace, coordinator, worker], 1)
            floor.add_metric([pool, snap.namespace], snap.min_serving)
            drain.add_metric([pool], snap.oldest_drain)
            stamp.add_metric([pool], snap.timestamp)
        yield from (members, serving, floor, drain, stamp)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(MEMBERS, "", labels=["pool", "phase"])
        yield GaugeMetricFamily(SERVING_INFO, "", labels=_SERVING_LABELS)
        yield GaugeMetricFamily(MIN_SERVING, "", labels=["pool", "workload_namespace"])
        yield GaugeMetricFamily(OLDEST_DRAIN, "", labels=["pool"])
        yield GaugeMetricFamily(SNAPSHOT_TIMESTAMP, "", labels=["pool"])


TERM_GAUGES = _TermGauges()
TRINO_REGISTRY.register(TERM_GAUGES)

RECONCILE_FAILURES = Counter(
    FAILURES,
    "Failed Trino pool ticks by bounded reason; never cleared on a term change.",
    ["pool", "reason"],
    registry=TRINO_REGISTRY,
)


def begin_term(pool: str) -> TermToken:
    """Clear ``pool``'s term gauges and make the returned token their only writer."""
    token = TERM_GAUGES.begin(pool)
    for reason in REASONS:  # zero-valued series so that increase() sees the first failure
        RECONCILE_FAILURES.labels(pool=pool, reason=reason)
    return token


def end_term(pool: str, token: TermToken) -> bool:
    """Remove ``pool``'s term gauges and token; False (and no change) for a stale token."""
    return TERM_GAUGES.end(pool, token)


def current_token(pool: str) -> TermToken | None:
    return TERM_GAUGES.current(pool)


def record_snapshot(
    token: TermToken,
    pool: str,
    rows: Sequence[SnapshotRow],
    min_serving: int,
    namespace: str,
    now: float,
) -> bool:
    """Replace ``pool``'s term gauges with this successful instance read.

    ``namespace`` is the pool's workload namespace (the ``min_serving`` series); each serving
    row carries its own pinned namespace. Returns False without writing for a stale token.
    """
    counts = dict.fromkeys(MEMBER_PHASES, 0)
    oldest = 0.0
    serving: list[tuple[str, str, str, str]] = []
    for row in rows:
        phase = row.phase if row.phase in counts and row.phase != UNKNOWN else UNKNOWN
        counts[phase] += 1
        if phase == InstancePhase.SERVING:
            serving.append(
                (
                    row.instance_id,
                    row.namespace,
                    row.coordinator_deployment,
                    row.worker_deployment,
                )
            )
        elif phase == InstancePhase.DRAINING:
            oldest = max(oldest, now - row.phase_changed_at)
    snapshot = _Snapshot(
        members=tuple((phase, counts[phase]) for phase in MEMBER_PHASES),
        serving=tuple(sorted(serving)),
        min_serving=min_serving,
        namespace=namespace,
        oldest_drain=oldest,
        timestamp=now,
    )
    return TERM_GAUGES.write(pool, token, snapshot)


def count_failure(pool: str, reason: str | None) -> None:
    """+1 on ``reconcile_failures_total{pool,reason}``; ``None`` (backoff only) counts nothing."""
    if reason is None:
        return
    if reason not in REASONS:
        raise ValueError(f"unknown reconcile failure reason {reason!r}; expected one of {REASONS}")
    RECONCILE_FAILURES.labels(pool=pool, reason=reason).inc()


# Class names recognised by classify(); matched along the MRO so subclasses inherit the mapping.
_FENCED = frozenset({"PoolConflict", "WriterFenced"})
_CANCELED = frozenset(
    {"Canceled", "Cancelled", "CancelledError", "CanceledError", "TaskRevokedError", "Terminated"}
)
_GATEWAY_REFUSED = frozenset({"GatewayRefused"})
_GATEWAY_UNAVAILABLE = frozenset({"GatewayUnavailable", "UnknownOutcome", "EffectUnknown"})
_TIMEOUT = frozenset(
    {"TimeoutError", "Timeout", "ReadTimeout", "ConnectTimeout", "SoftTimeLimitExceeded"}
)
_STALE_EPOCH_CODE = "POOL_STALE_EPOCH"


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def classify(exc: BaseException) -> str | None:
    """The bounded failure reason of ``exc``; ``None`` for a backoff-only wait.

    Order: backoff-only; fenced (``PoolConflict``, ``WriterFenced``, or any error carrying the
    Gateway code ``POOL_STALE_EPOCH``); canceled; gateway_refused; gateway_unavailable (also an
    unknown outcome of a durable effect); timeout; anything else is internal.
    """
    names = _names(exc)
    if isinstance(exc, BackoffOnly):
        return None
    if names & _FENCED or getattr(exc, "code", None) == _STALE_EPOCH_CODE:
        return "fenced"
    if names & _CANCELED or isinstance(
        exc,
        asyncio.CancelledError | concurrent.futures.CancelledError | KeyboardInterrupt | SystemExit,
    ):
        return "canceled"
    if names & _GATEWAY_REFUSED:
        return "gateway_refused"
    if names & _GATEWAY_UNAVAILABLE:
        return "gateway_unavailable"
    if isinstance(exc, TimeoutError) or names & _TIMEOUT:
        return "timeout"
    return "internal"


def _flatten(errors: Iterable[BaseException]) -> Iterator[BaseException]:
    for error in errors:
        if isinstance(error, BaseExceptionGroup):
            yield from _flatten(error.exceptions)
        else:
            yield error


def failure_reason(errors: Iterable[BaseException]) -> str | None:
    """One reason for a tick that raised ``errors`` (exception groups are flattened).

    Backoff-only errors are ignored; ``None`` when nothing else failed. ``fenced`` wins (it ends
    the term); otherwise the first real error's reason counts.
    """
    reasons = [r for r in (classify(e) for e in _flatten(errors)) if r is not None]
    if not reasons:
        return None
    return "fenced" if "fenced" in reasons else reasons[0]
