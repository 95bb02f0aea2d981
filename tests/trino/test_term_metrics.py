"""Term-scoped pool gauges and the failure counter (spec trino-pools §7).

Every test uses its own pool names: the registry is process-wide, like in production.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import socket
import sys
import threading
from collections.abc import Callable

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trino_pools import term_metrics as tm
from trino_pools.metrics import TRINO_REGISTRY
from trino_pools.term_metrics import MEMBER_PHASES as MEMBER_ORDER
from trino_pools.term_metrics import BackoffOnly, SnapshotRow

TERM_FAMILIES = {
    "duckgres_trino_pool_members",
    "duckgres_trino_pool_serving_instance_info",
    "duckgres_trino_pool_min_serving",
    "duckgres_trino_pool_oldest_drain_seconds",
    "duckgres_trino_pool_snapshot_timestamp_seconds",
}
PHASES_15 = [
    "PENDING",
    "CREATING",
    "PREPARING",
    "VALIDATING",
    "ADMITTED",
    "SERVING",
    "DRAINING",
    "SEALED",
    "RETIRING",
    "RETIRED",
    "SUSPECT",
    "LOST",
    "FAILURE_RETIRED",
    "FAILED_PREPARING",
    "UNKNOWN",
]


def _pool() -> str:
    return f"pool-{secrets.token_hex(3)}"


def scrape() -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(TRINO_REGISTRY).decode()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def series(pool: str, names: set[str] | None = None) -> list[tuple[str, dict[str, str], float]]:
    return [s for s in scrape() if s[1].get("pool") == pool and (names is None or s[0] in names)]


def term_series(pool: str) -> list[tuple[str, dict[str, str], float]]:
    return series(pool, TERM_FAMILIES)


def value(name: str, **labels: str) -> float | None:
    return TRINO_REGISTRY.get_sample_value(name, labels)


def row(instance: str, phase: str = "SERVING", *, changed: float = 1000.0, ns: str = "ns-a"):
    return SnapshotRow(
        instance_id=instance,
        phase=phase,
        phase_changed_at=changed,
        namespace=ns,
        coordinator_deployment=f"{instance}-coordinator",
        worker_deployment=f"{instance}-worker",
    )


def test_snapshot_exports_every_term_gauge():
    pool = _pool()
    token = tm.begin_term(pool)
    assert term_series(pool) == []  # nothing before the first snapshot of the term
    rows = [
        row("cell-00000001"),
        row("cell-00000002", "DRAINING", changed=900.0),
        row("cell-00000003", "DRAINING", changed=950.0),
        row("cell-00000004", "PENDING"),
        row("cell-00000005", "BOGUS"),
    ]
    assert tm.record_snapshot(token, pool, rows, min_serving=2, namespace="trino-x", now=1000.0)

    members = {s[1]["phase"]: s[2] for s in series(pool, {"duckgres_trino_pool_members"})}
    assert sorted(members) == sorted(PHASES_15)
    assert members["SERVING"] == 1
    assert members["DRAINING"] == 2
    assert members["PENDING"] == 1
    assert members["UNKNOWN"] == 1
    assert sum(members.values()) == len(rows)

    assert value("duckgres_trino_pool_oldest_drain_seconds", pool=pool) == 100.0
    assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) == 1000.0
    assert value("duckgres_trino_pool_min_serving", pool=pool, workload_namespace="trino-x") == 2
    info = series(pool, {"duckgres_trino_pool_serving_instance_info"})
    assert info == [
        (
            "duckgres_trino_pool_serving_instance_info",
            {
                "pool": pool,
                "pool_instance": "cell-00000001",
                "workload_namespace": "ns-a",
                "coordinator_deployment": "cell-00000001-coordinator",
                "worker_deployment": "cell-00000001-worker",
            },
            1.0,
        )
    ]
    tm.end_term(pool, token)


def test_oldest_drain_is_zero_without_draining_rows_and_never_negative():
    pool = _pool()
    token = tm.begin_term(pool)
    tm.record_snapshot(token, pool, [row("cell-00000001")], 1, "ns", now=10.0)
    assert value("duckgres_trino_pool_oldest_drain_seconds", pool=pool) == 0
    # clock skew: a phase change "in the future"
    tm.record_snapshot(token, pool, [row("cell-00000001", "DRAINING", changed=50.0)], 1, "ns", 10.0)
    assert value("duckgres_trino_pool_oldest_drain_seconds", pool=pool) == 0
    tm.end_term(pool, token)


@pytest.mark.safeguard("trino-32")
def test_term_end_removes_every_term_gauge_and_late_writes_do_not_recreate_them():
    """The rules one call at a time; the same calls racing on real threads:
    ``test_late_snapshots_racing_the_term_end_never_recreate_the_gauges``."""
    pool, other = _pool(), _pool()
    token = tm.begin_term(pool)
    other_token = tm.begin_term(other)
    rows = [row("cell-00000001"), row("cell-00000002", "DRAINING", changed=5.0)]
    assert tm.record_snapshot(token, pool, rows, 2, "trino-a", now=10.0)
    assert tm.record_snapshot(other_token, other, rows, 3, "trino-b", now=10.0)
    assert {s[0] for s in term_series(pool)} == TERM_FAMILIES
    other_before = term_series(other)
    tm.count_failure(pool, "timeout")

    assert tm.end_term(pool, token)
    assert term_series(pool) == []
    assert tm.current_token(pool) is None

    # The ended term's late snapshot and late end change nothing.
    assert not tm.record_snapshot(token, pool, rows, 2, "trino-a", now=20.0)
    assert not tm.end_term(pool, token)
    assert term_series(pool) == []

    # Other pools untouched; the failure counter survives the term change.
    assert term_series(other) == other_before
    assert value("duckgres_trino_pool_reconcile_failures_total", pool=pool, reason="timeout") == 1
    tm.end_term(other, other_token)


@pytest.mark.safeguard("trino-32")
def test_only_the_current_term_writes_and_ends():
    """The rules one call at a time; the same calls racing on real threads:
    ``test_a_stale_term_racing_a_new_term_never_touches_it``."""
    pool = _pool()
    old = tm.begin_term(pool)
    assert tm.record_snapshot(old, pool, [row("cell-00000001")], 2, "trino-a", now=10.0)

    # A new term (the old one never ended, e.g. cancelled): its beginning clears the old gauges.
    new = tm.begin_term(pool)
    assert new is not old
    assert term_series(pool) == []

    # The stale term's late snapshot is refused, before and after the new term's snapshot.
    assert not tm.record_snapshot(old, pool, [row("cell-0000000a")], 9, "trino-old", now=11.0)
    assert term_series(pool) == []
    assert tm.record_snapshot(new, pool, [row("cell-00000002")], 2, "trino-a", now=12.0)
    assert not tm.record_snapshot(old, pool, [row("cell-0000000a")], 9, "trino-old", now=13.0)
    assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) == 12.0
    assert (
        value("duckgres_trino_pool_min_serving", pool=pool, workload_namespace="trino-old") is None
    )

    # The stale term's end does not remove the new term's gauges.
    assert not tm.end_term(pool, old)
    assert tm.current_token(pool) is new
    assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) == 12.0
    assert tm.end_term(pool, new)
    assert term_series(pool) == []


# Races with real threads (safeguard trino-32). The tests above pin each rule one call at a
# time; these run the racing calls on threads released together by a barrier, with the
# interpreter switching threads every microsecond while they run, many rounds each. Whatever
# the interleaving, the assertions are the same: they state what every interleaving must end in.

RACE_ROUNDS = 1000
JOIN_SECONDS = 30.0


def _race(*racers: Callable[[], None]) -> None:
    """Run ``racers`` on their own threads, released at once by a barrier, switching threads
    every microsecond (default 5 ms) until they are done; re-raise the first failure."""
    barrier = threading.Barrier(len(racers))
    errors: list[BaseException] = []

    def run(racer: Callable[[], None]) -> None:
        try:
            barrier.wait(timeout=JOIN_SECONDS)
            racer()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in racers]
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=JOIN_SECONDS)
            assert not thread.is_alive(), "a racer did not finish within its deadline"
    finally:
        sys.setswitchinterval(before)
    if errors:
        raise errors[0]


@pytest.mark.safeguard("trino-32")
def test_late_snapshots_racing_the_term_end_never_recreate_the_gauges():
    """The ending term's tick still writing snapshots while the term is ended three times at
    once (a cancel, a fence refusal and the tick's own end): one end wins, nothing outlives
    it."""
    pool = _pool()
    for _ in range(RACE_ROUNDS):
        token = tm.begin_term(pool)
        assert tm.record_snapshot(token, pool, [row("cell-00000001")], 2, "trino-a", now=1.0)
        ended: list[bool] = []
        written: list[bool] = []

        def end(token: tm.TermToken = token, ended: list[bool] = ended) -> None:
            ended.append(tm.end_term(pool, token))

        def late_writes(token: tm.TermToken = token, written: list[bool] = written) -> None:
            for i in range(20):
                snapshot = [row("cell-00000002")]
                written.append(tm.record_snapshot(token, pool, snapshot, 3, "ns", now=2.0 + i))

        _race(end, end, end, late_writes)
        assert sorted(ended) == [False, False, True]  # exactly one end removed the term
        assert tm.current_token(pool) is None
        assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) is None
        # Once a late write was refused, no later one got through.
        assert written == sorted(written, reverse=True)
    assert term_series(pool) == []  # the last round's whole export: nothing of the pool


@pytest.mark.safeguard("trino-32")
def test_a_stale_term_racing_a_new_term_never_touches_it():
    """The old term (cancelled: its end and its late snapshots still arrive) racing the new
    term's beginning and first snapshot: the new term's gauges always survive."""
    pool = _pool()
    for _ in range(RACE_ROUNDS):
        old = tm.begin_term(pool)
        assert tm.record_snapshot(old, pool, [row("cell-0000000a")], 9, "trino-old", now=1.0)
        new: list[tm.TermToken] = []

        def stale_term(old: tm.TermToken = old) -> None:
            tm.end_term(pool, old)
            for i in range(10):
                tm.record_snapshot(old, pool, [row("cell-0000000a")], 9, "trino-old", now=2.0 + i)
            tm.end_term(pool, old)

        def new_term(new: list[tm.TermToken] = new) -> None:
            token = tm.begin_term(pool)
            new.append(token)
            assert tm.record_snapshot(token, pool, [row("cell-00000002")], 2, "trino-a", 50.0)

        _race(stale_term, new_term)
        [token] = new
        assert token is not old
        assert tm.current_token(pool) is token
        assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) == 50.0
        floor = value("duckgres_trino_pool_min_serving", pool=pool, workload_namespace="trino-a")
        assert floor == 2.0
        assert (
            value("duckgres_trino_pool_min_serving", pool=pool, workload_namespace="trino-old")
            is None
        )
    # The last round's whole export, series by series: only the new term's snapshot.
    assert term_series(pool) == [
        *(
            ("duckgres_trino_pool_members", {"pool": pool, "phase": phase}, count)
            for phase, count in ((p, 1.0 if p == "SERVING" else 0.0) for p in MEMBER_ORDER)
        ),
        (
            "duckgres_trino_pool_serving_instance_info",
            {
                "pool": pool,
                "pool_instance": "cell-00000002",
                "workload_namespace": "ns-a",
                "coordinator_deployment": "cell-00000002-coordinator",
                "worker_deployment": "cell-00000002-worker",
            },
            1.0,
        ),
        (
            "duckgres_trino_pool_min_serving",
            {"pool": pool, "workload_namespace": "trino-a"},
            2.0,
        ),
        ("duckgres_trino_pool_oldest_drain_seconds", {"pool": pool}, 0.0),
        ("duckgres_trino_pool_snapshot_timestamp_seconds", {"pool": pool}, 50.0),
    ]
    assert tm.end_term(pool, token)
    assert term_series(pool) == []


def test_a_token_of_another_pool_cannot_write():
    pool, other = _pool(), _pool()
    token = tm.begin_term(pool)
    tm.begin_term(other)
    assert not tm.record_snapshot(token, other, [row("cell-00000001")], 1, "ns", now=1.0)
    assert term_series(other) == []


@pytest.mark.safeguard("trino-34")
def test_serving_info_drops_departed_instances_and_keeps_the_pinned_namespace():
    pool = _pool()
    token = tm.begin_term(pool)
    first = [
        row("cell-00000001", ns="trino-old"),  # pinned at creation, before a namespace move
        row("cell-00000002", ns="trino-new"),
        row("cell-00000003", ns=""),  # snapshot namespace unreadable
    ]
    tm.record_snapshot(token, pool, first, 2, "trino-new", now=1.0)
    info = {
        s[1]["pool_instance"]: s[1]["workload_namespace"]
        for s in series(pool, {"duckgres_trino_pool_serving_instance_info"})
    }
    assert info == {"cell-00000001": "trino-old", "cell-00000002": "trino-new", "cell-00000003": ""}

    # Next snapshot: 1 is draining, 3 left the rows entirely.
    second = [
        row("cell-00000001", "DRAINING", ns="trino-old"),
        row("cell-00000002", ns="trino-new"),
    ]
    tm.record_snapshot(token, pool, second, 2, "trino-new", now=2.0)
    info = {
        s[1]["pool_instance"]: s[1]["workload_namespace"]
        for s in series(pool, {"duckgres_trino_pool_serving_instance_info"})
    }
    assert info == {"cell-00000002": "trino-new"}
    tm.end_term(pool, token)


@pytest.mark.safeguard("trino-34")
def test_min_serving_is_exported_with_zero_serving_and_follows_the_namespace():
    pool = _pool()
    token = tm.begin_term(pool)
    tm.record_snapshot(token, pool, [row("cell-00000001", "PENDING")], 3, "trino-a", now=1.0)
    assert series(pool, {"duckgres_trino_pool_serving_instance_info"}) == []
    assert value("duckgres_trino_pool_min_serving", pool=pool, workload_namespace="trino-a") == 3

    tm.record_snapshot(token, pool, [], 2, "trino-b", now=2.0)
    floors = series(pool, {"duckgres_trino_pool_min_serving"})
    assert floors == [
        ("duckgres_trino_pool_min_serving", {"pool": pool, "workload_namespace": "trino-b"}, 2.0)
    ]
    tm.end_term(pool, token)


@pytest.mark.safeguard("trino-34")
def test_no_namespace_or_instance_label_anywhere_in_the_trino_registry():
    pool = _pool()
    token = tm.begin_term(pool)
    tm.record_snapshot(
        token, pool, [row("cell-00000001"), row("cell-00000002", "LOST")], 1, "ns", 1.0
    )
    tm.count_failure(pool, "internal")
    samples = scrape()
    assert {s[0] for s in samples if s[1].get("pool") == pool} >= TERM_FAMILIES
    for name, labels, _ in samples:
        assert "namespace" not in labels, name
        assert "instance" not in labels, name
    tm.end_term(pool, token)


def test_a_failed_read_changes_no_sample_and_a_later_success_refreshes():
    """The metrics half of safeguard 31 (the operator-level test is the integrator's)."""
    pool = _pool()
    token = tm.begin_term(pool)
    tm.record_snapshot(token, pool, [row("cell-00000001")], 1, "ns", now=100.0)
    before = term_series(pool)
    # The instance listing failed: the tick records a failure and does not call record_snapshot.
    tm.count_failure(pool, tm.classify(TimeoutError("instance listing timed out")))
    assert term_series(pool) == before
    assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) == 100.0
    # A later successful listing refreshes the timestamp and the serving series.
    tm.record_snapshot(token, pool, [row("cell-00000002")], 1, "ns", now=105.0)
    assert value("duckgres_trino_pool_snapshot_timestamp_seconds", pool=pool) == 105.0
    instances = [
        s[1]["pool_instance"] for s in series(pool, {"duckgres_trino_pool_serving_instance_info"})
    ]
    assert instances == ["cell-00000002"]
    tm.end_term(pool, token)


# Failure reasons (safeguard 35)


def _named(name: str, base: type[BaseException] = Exception, **attrs: object) -> BaseException:
    cls = type(name, (base,), {})
    exc: BaseException = cls("boom")
    for key, val in attrs.items():
        setattr(exc, key, val)
    return exc


def _real_classes() -> list[tuple[BaseException, str]]:
    """The error classes the operator actually raises."""
    from duckgres_admin.lib import gateway
    from trino_pools import authority, catalog_writer, effects

    return [
        (authority.PoolConflict("epoch moved"), "fenced"),
        (catalog_writer.WriterFenced("newer writer"), "fenced"),
        (gateway.GatewayRefused("POOL_STALE_EPOCH", 409, "stale"), "fenced"),
        (gateway.GatewayRefused("POOL_SERVING_FLOOR", 409, "floor"), "gateway_refused"),
        (gateway.GatewayRefused("", 400, "no code"), "gateway_refused"),
        (gateway.GatewayUnavailable(503, "busy"), "gateway_unavailable"),
        (gateway.UnknownOutcome("connection reset"), "gateway_unavailable"),
        (effects.EffectUnknown("instance:cell-1", "admit", "timeout"), "gateway_unavailable"),
        (authority.NotThisReplica("pool-a"), "internal"),
    ]


CASES = [
    (_named("PoolConflict"), "fenced"),
    (_named("WriterFenced"), "fenced"),
    (_named("GatewayRefused", code="POOL_STALE_EPOCH"), "fenced"),
    (_named("GatewayRefused", code="POOL_SERVING_FLOOR"), "gateway_refused"),
    (_named("GatewayUnavailable", status=503), "gateway_unavailable"),
    (_named("UnknownOutcome"), "gateway_unavailable"),
    (_named("EffectUnknown"), "gateway_unavailable"),
    (TimeoutError("t"), "timeout"),
    (socket.timeout("t"), "timeout"),  # noqa: UP041 - the alias callers still raise
    (_named("ReadTimeout"), "timeout"),
    (_named("Canceled"), "canceled"),
    (asyncio.CancelledError(), "canceled"),
    (concurrent.futures.CancelledError(), "canceled"),
    (KeyboardInterrupt(), "canceled"),
    (ValueError("x"), "internal"),
    (RuntimeError("x"), "internal"),
    (_named("KubeError"), "internal"),
    *_real_classes(),
]


@pytest.mark.safeguard("trino-35")
@pytest.mark.parametrize(
    ("exc", "reason"), CASES, ids=lambda c: type(c).__name__ if isinstance(c, BaseException) else c
)
def test_each_error_class_maps_to_one_of_the_six_reasons(exc, reason):
    assert tm.classify(exc) == reason
    assert reason in tm.REASONS
    assert len(tm.REASONS) == 6


def test_subclasses_inherit_the_mapping():
    base = type("GatewayUnavailable", (Exception,), {})
    sub = type("Overloaded", (base,), {})
    assert tm.classify(sub()) == "gateway_unavailable"


@pytest.mark.safeguard("trino-35")
def test_backoff_only_counts_nothing_and_a_mix_counts_the_real_reason():
    pool = _pool()
    tm.begin_term(pool)
    before = {
        r: value("duckgres_trino_pool_reconcile_failures_total", pool=pool, reason=r)
        for r in tm.REASONS
    }
    assert before == dict.fromkeys(tm.REASONS, 0.0)

    assert tm.classify(BackoffOnly("next attempt in 30 s")) is None
    assert tm.failure_reason([BackoffOnly("a"), BackoffOnly("b")]) is None
    tm.count_failure(pool, tm.failure_reason([BackoffOnly("a")]))
    after = {
        r: value("duckgres_trino_pool_reconcile_failures_total", pool=pool, reason=r)
        for r in tm.REASONS
    }
    assert after == before

    mixed = [BackoffOnly("a"), _named("GatewayUnavailable"), BackoffOnly("b")]
    assert tm.failure_reason(mixed) == "gateway_unavailable"
    tm.count_failure(pool, tm.failure_reason(mixed))
    assert (
        value(
            "duckgres_trino_pool_reconcile_failures_total", pool=pool, reason="gateway_unavailable"
        )
        == 1
    )
    assert (
        sum(
            value("duckgres_trino_pool_reconcile_failures_total", pool=pool, reason=r) or 0
            for r in tm.REASONS
        )
        == 1
    )


def test_fenced_wins_over_other_errors_else_the_first_real_error_counts():
    assert tm.failure_reason([ValueError(), _named("PoolConflict")]) == "fenced"
    assert tm.failure_reason([TimeoutError(), ValueError()]) == "timeout"
    group = BaseExceptionGroup(
        "tick", [BackoffOnly("x"), _named("GatewayRefused", code="POOL_PHASE")]
    )
    assert tm.failure_reason([group]) == "gateway_refused"
    assert tm.failure_reason([]) is None


def test_unknown_reason_is_refused():
    with pytest.raises(ValueError, match="unknown reconcile failure reason"):
        tm.count_failure(_pool(), "disk_full")
