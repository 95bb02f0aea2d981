"""The janitor reconciler (spec reshard §4.15) against real rows, real lease rows and the
database clock, with an in-memory launcher (the one seam to Kubernetes / child processes)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from duckgres_admin.models import ReshardLogEntry, ReshardStepTiming
from duckgres_admin.platform.leadership import LeaderLease
from reshard.control.janitor import MAX_RESPAWNS, force_fail_message
from reshard.launchers.capture import CAPTURE_HEADER
from tests.fixtures.janitor import (
    FakeClock,
    FakeLauncher,
    age_op,
    expire_lease,
    janitor_env,
    make_janitor,
    new_op,
    op_log,
    refresh,
    sample,
    stale_pending,
    stale_running,
)

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env

RESPAWNS = "duckgres_reshard_runner_respawns_total"


def test_a_non_leader_does_nothing() -> None:
    op = stale_pending()
    assert LeaderLease("janitor", holder="someone-else").acquire()
    launcher = FakeLauncher()
    report = make_janitor(launcher).reconcile()
    assert not report.leader
    assert launcher.calls == []
    assert refresh(op).respawn_attempts == 0


def test_fresh_ops_with_a_live_runner_are_never_touched() -> None:
    fresh_running = new_op("running", step="copying", runner_epoch=1)
    age_op(fresh_running.id, created_at="1 hour", heartbeat_at="10 seconds")
    young_pending = new_op("pending")
    age_op(young_pending.id, created_at="60 seconds")
    launcher = FakeLauncher()
    launcher.put(fresh_running.id, "Running", age_seconds=3600)
    report = make_janitor(launcher).reconcile()
    assert report.leader
    assert launcher.creates() == []
    assert launcher.deletes() == []
    assert refresh(fresh_running).respawn_attempts == 0
    assert refresh(fresh_running).heartbeat_at is not None
    assert refresh(young_pending).respawn_attempts == 0


@pytest.mark.safeguard("reshard-70")
def test_a_fresh_op_whose_runner_exited_is_relaunched_in_the_same_tick() -> None:
    """Before issue 14 a fresh heartbeat hid an exited runner until it went stale (minutes)."""
    op = new_op("running", step="copying", runner_epoch=1)
    age_op(op.id, created_at="1 hour", heartbeat_at="10 seconds")
    launcher = FakeLauncher()
    launcher.put(op.id, "Failed", age_seconds=3600)
    make_janitor(launcher).reconcile()
    assert launcher.creates(op.id) == [("create", op.id, True)]
    row = refresh(op)
    assert row.respawn_attempts == 1
    assert row.heartbeat_at is None
    assert any("while its heartbeat was fresh: relaunching now" in m for m in op_log(op.id))


def test_a_missing_runner_is_respawned_with_replace() -> None:
    op = stale_pending()
    launcher = FakeLauncher()
    before = sample(RESPAWNS, outcome="spawned")
    report = make_janitor(launcher).reconcile()
    assert launcher.creates(op.id) == [("create", op.id, True)]
    assert refresh(op).respawn_attempts == 1
    assert f"respawn {op.id} attempt 1" in report.actions
    assert (
        f"runner pod missing or dead (no pod) — respawning duckgres-reshard-op-{op.id} "
        "(attempt 1/3)"
    ) in op_log(op.id, "janitor")
    assert sample(RESPAWNS, outcome="spawned") == before + 1


def test_a_dead_runner_line_names_phase_and_reason_and_its_log_is_captured() -> None:
    op = stale_running()
    launcher = FakeLauncher()
    launcher.put(op.id, "Failed", age_seconds=900, reason="OOMKilled", uid="dead-uid")
    launcher.logs[op.id] = "copying table 1\ncopying table 2\n"
    make_janitor(launcher).reconcile()
    log = op_log(op.id)
    assert (
        f"runner pod missing or dead (pod phase Failed, reason OOMKilled) — respawning "
        f"duckgres-reshard-op-{op.id} (attempt 1/3)"
    ) in log
    pod_log = op_log(op.id, "pod-log")
    assert pod_log[0] == CAPTURE_HEADER
    assert pod_log[-2:] == ["copying table 1", "copying table 2"]
    assert launcher.creates(op.id) == [("create", op.id, True)]


def test_a_failed_respawn_is_logged_and_counted() -> None:
    op = stale_pending()
    launcher = FakeLauncher()
    launcher.create_error = RuntimeError("quota exceeded: pods")
    before = sample(RESPAWNS, outcome="failed")
    make_janitor(launcher).reconcile()
    assert "respawning runner pod failed: quota exceeded: pods" in op_log(op.id)
    assert (
        ReshardLogEntry.objects.get(
            operation_id=op.id, message__startswith="respawning runner pod failed"
        ).level
        == "error"
    )
    assert sample(RESPAWNS, outcome="failed") == before + 1
    assert refresh(op).respawn_attempts == 1, "a failed spawn still consumed an attempt"
    assert refresh(op).state == "pending"


def test_a_phase_error_skips_only_that_op() -> None:
    first = stale_pending()
    second = stale_pending()
    launcher = FakeLauncher()

    def flaky(name: str, op_id: int) -> None:
        if name == "get_phase" and op_id == first.id:
            raise RuntimeError("apiserver timeout")

    launcher.on_call = flaky
    make_janitor(launcher).reconcile()
    assert refresh(first).respawn_attempts == 0
    assert refresh(second).respawn_attempts == 1


@pytest.mark.safeguard("reshard-23")
def test_alternating_leaders_keep_counting_and_force_fail_exactly_once_at_the_4th_need() -> None:
    op = stale_running(step="copying")
    launcher = FakeLauncher()
    leaders = [
        make_janitor(launcher, holder="leader-a.1.aaaaaaaa"),
        make_janitor(launcher, holder="leader-b.2.bbbbbbbb"),
    ]
    for need in range(1, 7):
        janitor = leaders[need % 2]
        expire_lease()  # failover before every tick: a leader-local counter would reset
        report = janitor.reconcile()
        assert report.leader
        row = refresh(op)
        if need <= 3:
            assert row.respawn_attempts == need
            assert row.state == "running"
            launcher.kill(op.id, reason="Error")  # the new runner dies before claiming
        else:
            assert row.state == "failed"
            assert row.respawn_attempts == 3, "it reads as the relaunches the message names"
            assert f"{MAX_RESPAWNS} times" in row.error
    assert len(launcher.creates(op.id)) == 3
    force_fail_lines = [m for m in op_log(op.id) if "could not be kept alive" in m]
    assert len(force_fail_lines) == 1, "force-fail happens exactly once"


@pytest.mark.safeguard("reshard-34")
def test_force_fail_of_a_blocked_op_requires_recovery() -> None:
    op = stale_running(step="copying", blocked=True)
    ReshardStepTiming.objects.create(operation_id=op.id, step="copying", runner_epoch=1)
    type(op).objects.filter(id=op.id).update(respawn_attempts=3)
    launcher = FakeLauncher()
    make_janitor(launcher).reconcile()
    row = refresh(op)
    assert row.state == "failed"
    assert row.recovery_required is True
    assert row.runner_id == "janitor"
    assert row.runner_epoch == 2, "the force-fail bumps the epoch: an old runner is fenced"
    assert row.finished_at is not None
    expected = force_fail_message(op.id, blocked=True, step="copying")
    assert row.error == expected
    assert "could not be kept alive" in row.error
    assert "may still be blocked" in row.error
    assert f"python manage.py reshard_recover {op.id}" in row.error
    assert "(last step: copying)" in row.error
    entry = ReshardLogEntry.objects.get(operation_id=op.id, message=expected)
    assert entry.level == "error"
    assert entry.source == "janitor"
    assert entry.runner_epoch == 2
    timing = ReshardStepTiming.objects.get(operation_id=op.id)
    assert timing.outcome == "failed"
    assert timing.ended_at is not None
    assert launcher.creates() == [], "the 4th need never launches"


@pytest.mark.safeguard("reshard-34")
def test_force_fail_of_a_never_started_op_needs_no_recovery() -> None:
    op = stale_pending()
    type(op).objects.filter(id=op.id).update(respawn_attempts=3)
    make_janitor(FakeLauncher()).reconcile()
    row = refresh(op)
    assert row.state == "failed"
    assert row.recovery_required is False
    assert row.error == (
        f"reshard runner could not be kept alive: the runner pod duckgres-reshard-op-{op.id} "
        "died or failed to start 3 times; the warehouse was never blocked; fix the cause and "
        "start a new operation."
    )
    assert row.error in op_log(op.id)


@pytest.mark.safeguard("reshard-144")
def test_force_fail_of_a_pre_copy_says_the_warehouse_was_never_blocked_and_asks_for_recovery() -> (
    None
):
    """An online copy lost in its pre-copy: a step is stamped, the warehouse never blocked.
    The error must not claim the warehouse may be blocked, and must still send the operator to
    ``reshard_recover`` (the capture and the target are left to remove)."""
    op = stale_running(step="precopying", blocked=False, copy_mode="online")
    type(op).objects.filter(id=op.id).update(respawn_attempts=3)
    make_janitor(FakeLauncher()).reconcile()
    row = refresh(op)
    assert row.state == "failed"
    assert row.recovery_required is True
    assert row.error == force_fail_message(op.id, blocked=False, started=True, step="precopying")
    assert "was never blocked (last step: precopying)" in row.error
    assert "may still be blocked" not in row.error
    assert f"python manage.py reshard_recover {op.id}" in row.error
    assert row.error in op_log(op.id)


@pytest.mark.safeguard("reshard-24")
def test_wedged_runner_is_replaced_and_a_new_runner_gets_the_spawn_grace() -> None:
    op = stale_running(step="draining")
    launcher = FakeLauncher()
    old = launcher.put(op.id, "Running", age_seconds=900, uid="old-uid")
    janitor = make_janitor(launcher)

    # Tick 1: Running with a stale heartbeat = wedged: deleted with its normal grace.
    janitor.reconcile()
    assert launcher.deletes(op.id) == [("delete", op.id, None)]
    assert refresh(op).respawn_attempts == 0
    assert f"deleting wedged runner duckgres-reshard-op-{op.id} (grace 600 s)" in op_log(op.id)

    # Tick 2: still terminating: delete repeated, nothing counted.
    janitor.reconcile()
    assert len(launcher.deletes(op.id)) == 2
    assert refresh(op).respawn_attempts == 0

    # The old runner goes away; tick 3 relaunches: attempt 1, a new uid.
    launcher.gone(op.id)
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    new = launcher.runners[op.id]
    assert new.uid != old.uid

    # Tick 4, right after the relaunch: a live runner inside the spawn grace is left alone.
    launcher.runners[op.id] = type(new)(
        phase="Running", spawned_at=new.spawned_at, uid=new.uid, terminating=False
    )
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    assert len(launcher.deletes(op.id)) == 2


@pytest.mark.safeguard("reshard-24")
@pytest.mark.parametrize(("age", "deleted"), [(100, False), (130, True)])
def test_spawn_grace_boundary(age: int, deleted: bool, settings: Any) -> None:
    settings.DUCKGRES_RESHARD_SPAWN_GRACE_SECONDS = 120
    op = stale_pending()
    launcher = FakeLauncher()
    launcher.put(op.id, "Pending", age_seconds=age)
    make_janitor(launcher).reconcile()
    assert bool(launcher.deletes(op.id)) is deleted
    assert refresh(op).respawn_attempts == 0


@pytest.mark.safeguard("reshard-58")
def test_a_terminating_runner_is_waited_for_without_consuming_attempts() -> None:
    op = stale_running(step="backup_catalog")
    launcher = FakeLauncher()
    launcher.put(op.id, "Running", age_seconds=900, terminating=True, uid="t-uid")
    janitor = make_janitor(launcher)
    for _ in range(3):
        janitor.reconcile()
    assert refresh(op).respawn_attempts == 0
    assert launcher.deletes(op.id) == [("delete", op.id, None)] * 3, "delete again, normal grace"
    warnings = [m for m in op_log(op.id) if m.startswith("previous runner pod still terminating")]
    assert len(warnings) == 1, "warned at most once per runner per minute"
    assert launcher.creates() == []


@pytest.mark.safeguard("reshard-58")
def test_still_terminating_from_create_returns_the_attempt() -> None:
    op = stale_running()
    type(op).objects.filter(id=op.id).update(respawn_attempts=2)
    launcher = FakeLauncher()
    from reshard.launchers.base import StillTerminating

    launcher.create_error = StillTerminating()
    janitor = make_janitor(launcher)
    report = janitor.reconcile()
    assert f"still-terminating {op.id}" in report.actions
    assert refresh(op).respawn_attempts == 2, "the increment was given back by CAS"
    assert any(m.startswith("previous runner pod still terminating") for m in op_log(op.id))
    # A later tick, once the old runner is gone, relaunches with attempt 3.
    launcher.create_error = None
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 3
    assert refresh(op).state == "running"


@pytest.mark.safeguard("reshard-25")
def test_reap_rules(settings: Any) -> None:
    settings.DUCKGRES_RESHARD_REAP_AFTER_SECONDS = 300
    launcher = FakeLauncher()
    exited_terminal = new_op("succeeded")
    age_op(exited_terminal.id, finished_at="10 seconds")
    launcher.put(exited_terminal.id, "Succeeded")
    running_old_terminal = new_op("failed")
    age_op(running_old_terminal.id, finished_at="6 minutes")
    launcher.put(running_old_terminal.id, "Running", age_seconds=900)
    running_new_terminal = new_op("cancelled")
    age_op(running_new_terminal.id, finished_at="1 minute")
    launcher.put(running_new_terminal.id, "Running", age_seconds=900)
    active = new_op("running", step="copying", runner_epoch=1)
    age_op(active.id, heartbeat_at="5 seconds")
    launcher.put(active.id, "Running", age_seconds=900)
    launcher.put(999_001, "Failed")  # exited orphan: no row
    launcher.put(999_002, "Running")  # running orphan: kept
    launcher.runners[999_003] = launcher.runners[999_002]
    launcher.put(999_004, "Succeeded")

    from reshard.launchers.base import RunnerObject

    original_list = launcher.list

    def listing() -> list[RunnerObject]:
        objs = original_list()
        objs.append(RunnerObject(name="weird", op_id_label="not-a-number", status=objs[0].status))
        return objs

    launcher.list = listing  # type: ignore[method-assign]
    make_janitor(launcher).reconcile()
    deleted = {c[1] for c in launcher.deletes()}
    assert exited_terminal.id in deleted, "exited runner of a terminal op: reaped"
    assert running_old_terminal.id in deleted, "running, terminal > 5 min: reaped"
    assert running_new_terminal.id not in deleted, "running, just terminal: kept"
    assert active.id not in deleted, "active op's runner: kept"
    assert 999_001 in deleted, "exited orphan without a row: reaped"
    assert 999_004 in deleted
    assert 999_002 not in deleted, "running orphan without a row: kept"
    assert 999_003 not in deleted


@pytest.mark.safeguard("reshard-35")
def test_pod_log_is_captured_before_the_reap_unless_the_marker_is_there() -> None:
    launcher = FakeLauncher()
    captured = new_op("failed")
    launcher.put(captured.id, "Failed", uid="uid-cap")
    launcher.logs[captured.id] = (
        f"line one\nline two with secret {settings.DUCKGRES_RUNNER_SECRET}\n"
    )
    marked = new_op("succeeded")
    launcher.put(marked.id, "Succeeded", uid="uid-marked")
    ReshardLogEntry.objects.create(
        operation_id=marked.id,
        source="runner",
        message=f"runner log persisted: pod duckgres-reshard-op-{marked.id} uid uid-marked "
        "epoch 1, 120 lines (0 dropped)",
    )
    other_marker = new_op("succeeded")
    launcher.put(other_marker.id, "Succeeded", uid="uid-new")
    ReshardLogEntry.objects.create(
        operation_id=other_marker.id,
        source="runner",
        message=f"runner log persisted: pod duckgres-reshard-op-{other_marker.id} uid uid-old "
        "epoch 1, 3 lines (0 dropped)",
    )

    seen_at_delete: dict[int, list[str]] = {}

    def on_call(name: str, op_id: int) -> None:
        if name == "delete":
            seen_at_delete[op_id] = op_log(op_id, "pod-log")

    launcher.on_call = on_call
    make_janitor(launcher).reconcile()

    cap = seen_at_delete[captured.id]
    assert cap[0] == CAPTURE_HEADER, "the log was in the op log before the delete call"
    assert cap[2:] == ["line one", "line two with secret ***"], "captured lines are scrubbed"
    assert seen_at_delete[marked.id] == [], "marker for this uid: no capture"
    assert ("read_log", marked.id) not in launcher.calls
    assert seen_at_delete[other_marker.id][0] == CAPTURE_HEADER, "a marker of another uid"


@pytest.mark.safeguard("reshard-35")
def test_capture_failure_is_a_warning_and_the_reap_goes_on() -> None:
    launcher = FakeLauncher()
    op = new_op("failed")
    launcher.put(op.id, "Failed", uid="u1")
    launcher.read_log_error = RuntimeError("pods/log forbidden")
    make_janitor(launcher).reconcile()
    warn = ReshardLogEntry.objects.get(operation_id=op.id, message__contains="pods/log forbidden")
    assert warn.level == "warn"
    assert launcher.deletes(op.id)


@pytest.mark.safeguard("reshard-41")
def test_the_leader_stops_mid_tick_past_the_renew_deadline(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals blocked: once the deadline passes the leader makes no further intervention."""
    settings.DUCKGRES_JANITOR_LEASE_SECONDS = 90
    settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = 60
    ops = [stale_pending() for _ in range(3)]
    clock = FakeClock()
    launcher = FakeLauncher()
    janitor = make_janitor(launcher, clock=clock)
    assert janitor.lease.acquire()

    from django.db import OperationalError

    def blocked(*_: Any, **__: Any) -> int | None:
        raise OperationalError("canceling statement due to lock timeout")

    monkeypatch.setattr(janitor.lease, "_execute", blocked)

    def after_first_create(name: str, op_id: int) -> None:
        if name == "create":
            clock.advance(61)  # the first relaunch takes us past the deadline

    launcher.on_call = after_first_create
    clock.advance(30)
    report = janitor.reconcile()
    assert report.leader
    assert report.stopped
    assert [refresh(op).respawn_attempts for op in ops] == [1, 0, 0]
    assert len(launcher.creates()) == 1
    # Next tick: still blocked, still past the deadline: not leader, nothing done.
    report = janitor.reconcile()
    assert not report.leader
    assert len(launcher.creates()) == 1


def test_each_intervention_renews_the_lease() -> None:
    ops = [stale_pending() for _ in range(2)]
    launcher = FakeLauncher()
    janitor = make_janitor(launcher)
    renewals: list[int] = []
    original = janitor.lease.renew

    def counting() -> bool:
        renewals.append(1)
        return original()

    janitor.lease.renew = counting  # type: ignore[method-assign]
    janitor.reconcile()
    assert all(refresh(op).respawn_attempts == 1 for op in ops)
    assert len(renewals) >= 2, "renewed before each relaunch"
