"""Reshard metrics (spec reshard §7): names, types, labels, buckets; gauges set by the leader
each tick; histograms observed once per terminal op, whichever leader gets there."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections
from prometheus_client import REGISTRY

from duckgres_admin.models import ReshardStepTiming
from reshard.control import metrics
from tests.fixtures.janitor import (
    FakeLauncher,
    age_op,
    expire_lease,
    janitor_env,
    make_janitor,
    new_op,
    refresh,
    sample,
    sql,
    stale_pending,
)

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env

STEP = "duckgres_reshard_step_duration_seconds"
WINDOW = "duckgres_reshard_maintenance_window_seconds"


def _family(name: str) -> Any:
    for family in REGISTRY.collect():
        if family.name == name:
            return family
    raise AssertionError(f"metric {name} is not registered")


@pytest.mark.parametrize(
    ("name", "kind", "labels"),
    [
        ("duckgres_reshard_active_operations", "gauge", ()),
        ("duckgres_reshard_stale_operations", "gauge", ()),
        ("duckgres_reshard_recovery_required_operations", "gauge", ()),
        ("duckgres_reshard_runner_respawns", "counter", ("outcome",)),
        (STEP, "histogram", ("step", "direction", "outcome")),
        (WINDOW, "histogram", ("direction", "outcome")),
        ("duckgres_janitor_is_leader", "gauge", ()),
        ("duckgres_janitor_lease_epoch", "gauge", ()),
    ],
)
def test_names_types_and_labels(name: str, kind: str, labels: tuple[str, ...]) -> None:
    family = _family(name)
    assert family.type == kind
    metric = {
        "duckgres_reshard_runner_respawns": metrics.RUNNER_RESPAWNS,
        STEP: metrics.STEP_DURATION,
        WINDOW: metrics.MAINTENANCE_WINDOW,
    }.get(name)
    if metric is not None:
        assert tuple(metric._labelnames) == labels
    if kind == "counter":
        assert name + "_total" in {s.name for s in family.samples} or not family.samples


def test_histogram_buckets() -> None:
    metrics.STEP_DURATION.labels(step="copying", direction="cnpg_to_cnpg", outcome="ok")
    metrics.MAINTENANCE_WINDOW.labels(direction="cnpg_to_cnpg", outcome="succeeded")

    def bounds(name: str) -> list[str]:
        return sorted(
            {s.labels["le"] for s in _family(name).samples if s.name == name + "_bucket"},
            key=lambda v: float(v),
        )

    assert bounds(STEP) == [
        *(f"{float(b)}" for b in (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)),
        "+Inf",
    ]
    assert bounds(WINDOW) == [
        *(f"{float(b)}" for b in (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)),
        "+Inf",
    ]


def test_the_leader_sets_the_gauges_each_tick() -> None:
    stale = stale_pending()
    fresh = new_op("running", step="copying", runner_epoch=1)
    age_op(fresh.id, heartbeat_at="3 seconds")
    new_op("failed", recovery_required=True)
    new_op("failed", recovery_required=True)
    new_op("failed")
    launcher = FakeLauncher()
    janitor = make_janitor(launcher)
    assert janitor.reconcile().leader
    assert sample("duckgres_reshard_active_operations") == 2
    assert sample("duckgres_reshard_stale_operations") == 1
    assert sample("duckgres_reshard_recovery_required_operations") == 2
    assert sample("duckgres_janitor_is_leader") == 1
    assert sample("duckgres_janitor_lease_epoch") == janitor.lease.epoch
    assert refresh(stale).respawn_attempts == 1

    # A non-leader process reports itself as such and leaves the op gauges alone.
    other = make_janitor(launcher, holder="other.2.bbbbbbbb")
    new_op("pending")
    assert not other.reconcile().leader
    assert sample("duckgres_janitor_is_leader") == 0
    assert sample("duckgres_reshard_active_operations") == 2


def _terminal_op(direction: tuple[str, str] = ("cnpg", "cnpg"), state: str = "succeeded") -> Any:
    src, dst = direction
    op = new_op(
        state,
        source_kind=src,
        target_kind=dst,
        to_shard="shard-b" if dst == "cnpg" else "",
        from_shard="shard-a" if src == "cnpg" else "",
    )
    last = "ok" if state == "succeeded" else "failed"
    for i, (step, outcome) in enumerate(
        [("blocking", "ok"), ("draining", "ok"), ("copying", last)]
    ):
        timing = ReshardStepTiming.objects.create(
            operation_id=op.id, step=step, runner_epoch=1, outcome=outcome
        )
        sql(
            "UPDATE duckgres_reshard_operation_steps"
            " SET started_at = now() - interval '100 seconds',"
            " ended_at = now() - interval '100 seconds' + make_interval(secs => %s)"
            " WHERE id = %s",
            [(i + 1) * 20, timing.id],
        )
    ReshardStepTiming.objects.create(operation_id=op.id, step="verifying", runner_epoch=1)
    sql(
        "UPDATE duckgres_reshard_operations SET blocked_at = now() - interval '90 seconds', "
        "unblocked_at = now() - interval '5 seconds', finished_at = now() WHERE id = %s",
        [op.id],
    )
    return op


def test_histograms_observed_once_across_two_leaders() -> None:
    op = _terminal_op(("cnpg", "external"))
    labels = {"direction": "cnpg_to_external", "outcome": "ok"}
    before_block = sample(STEP + "_count", step="blocking", **labels)
    before_copy_sum = sample(STEP + "_sum", step="copying", **labels)
    before_window = sample(WINDOW + "_count", direction="cnpg_to_external", outcome="succeeded")
    launcher = FakeLauncher()
    a = make_janitor(launcher, holder="a.1.aaaaaaaa")
    b = make_janitor(launcher, holder="b.2.bbbbbbbb")
    assert a.reconcile().leader
    expire_lease()
    assert b.reconcile().leader
    expire_lease()
    assert a.reconcile().leader
    assert sample(STEP + "_count", step="blocking", **labels) == before_block + 1
    assert sample(STEP + "_sum", step="copying", **labels) == pytest.approx(before_copy_sum + 60)
    assert (
        sample(WINDOW + "_count", direction="cnpg_to_external", outcome="succeeded")
        == before_window + 1
    )
    assert sample(WINDOW + "_sum", direction="cnpg_to_external", outcome="succeeded") >= 85, (
        "unblocked_at - blocked_at"
    )
    assert refresh(op).metrics_observed_at is not None


def test_open_steps_and_unfinished_windows_are_not_observed() -> None:
    op = new_op("failed", source_kind="external", from_shard="")
    ReshardStepTiming.objects.create(operation_id=op.id, step="blocking", runner_epoch=1)
    sql("UPDATE duckgres_reshard_operations SET blocked_at = now() WHERE id = %s", [op.id])
    before = sample(STEP + "_count", step="blocking", direction="external_to_cnpg", outcome="ok")
    before_w = sample(WINDOW + "_count", direction="external_to_cnpg", outcome="failed")
    assert metrics.observe_terminal_operations() >= 1
    assert (
        sample(STEP + "_count", step="blocking", direction="external_to_cnpg", outcome="ok")
        == before
    )
    assert sample(WINDOW + "_count", direction="external_to_cnpg", outcome="failed") == before_w
    assert refresh(op).metrics_observed_at is not None


def test_active_ops_are_never_observed() -> None:
    op = new_op("running", step="copying", runner_epoch=1)
    metrics.observe_terminal_operations()
    assert refresh(op).metrics_observed_at is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_observers_count_each_op_exactly_once() -> None:
    ops = [_terminal_op(("external", "cnpg"), state="failed") for _ in range(12)]
    labels = {"step": "draining", "direction": "external_to_cnpg", "outcome": "ok"}
    before = sample(STEP + "_count", **labels)
    barrier = threading.Barrier(3)
    won: list[int] = []
    lock = threading.Lock()

    def observer() -> None:
        try:
            barrier.wait()
            n = metrics.observe_terminal_operations()
            with lock:
                won.append(n)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=observer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == len(ops)
    assert sample(STEP + "_count", **labels) == before + len(ops)


def test_respawn_counter_counts_once_per_relaunch() -> None:
    stale_pending()
    launcher = FakeLauncher()
    before = sample("duckgres_reshard_runner_respawns_total", outcome="spawned")
    make_janitor(launcher, holder="x.1.00000000").reconcile()
    make_janitor(launcher, holder="y.2.00000000").reconcile()  # not leader
    assert sample("duckgres_reshard_runner_respawns_total", outcome="spawned") == before + 1
