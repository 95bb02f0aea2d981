"""The janitor with the real local-process launcher (spec reshard §4.13, §4.15; safeguards
24, 35): a runner process killed with SIGKILL is respawned, its log captured first."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from duckgres_admin.platform.leadership import LeaderLease
from reshard.control.janitor import Janitor
from reshard.launchers.capture import CAPTURE_HEADER
from reshard.launchers.local import LocalLauncher
from tests.fixtures.janitor import (
    age_op,
    janitor_env,
    new_op,
    op_log,
    refresh,
    stale_pending,
)

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env

# A stand-in runner: prints like a runner and lives until killed. The janitor only cares about
# the process (phase, uid, log file), not about what it runs.
STAND_IN = [
    sys.executable,
    "-c",
    "import os, time; print('runner up as', os.environ['POD_NAME'], os.environ['POD_UID'],"
    " flush=True); time.sleep(600)",
]


@pytest.fixture
def local_launcher(tmp_path: Path) -> Iterator[LocalLauncher]:
    launcher = LocalLauncher(tmp_path / "runners", command=STAND_IN)
    yield launcher
    for obj in launcher.list():
        pid = _pid(launcher, int(obj.op_id_label))
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _pid(launcher: LocalLauncher, op_id: int) -> int | None:
    record = launcher._read(op_id)
    return int(record["pid"]) if record else None


def _wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met within the deadline")


@pytest.mark.safeguard("reshard-24")
@pytest.mark.safeguard("reshard-35")
def test_a_sigkilled_local_runner_is_captured_and_respawned(local_launcher: LocalLauncher) -> None:
    op = stale_pending()
    janitor = Janitor(
        LeaderLease("janitor", holder="local-test.1.00000000"),
        launcher_for=lambda kind: local_launcher,
    )

    # Tick 1: no runner at all → respawn (attempt 1) with the real launcher.
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    first = local_launcher.get_phase(op.id)
    assert first.phase == "Running"
    log_path = local_launcher.directory / f"op-{op.id}.log"
    _wait_for(lambda: log_path.exists() and "runner up as" in log_path.read_text())

    # The runner "claims" (fresh heartbeat): ticks leave it alone.
    type(op).objects.filter(id=op.id).update(state="running", runner_epoch=1, step="copying")
    age_op(op.id, heartbeat_at="1 second")
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    assert local_launcher.get_phase(op.id).uid == first.uid

    # SIGKILL the runner; its heartbeat goes stale.
    pid = _pid(local_launcher, op.id)
    assert pid
    os.killpg(pid, signal.SIGKILL)
    _wait_for(lambda: local_launcher.get_phase(op.id).exited)
    age_op(op.id, heartbeat_at="10 minutes")

    janitor.reconcile()
    row = refresh(op)
    assert row.respawn_attempts == 2
    second = local_launcher.get_phase(op.id)
    assert second.phase == "Running"
    assert second.uid != first.uid, "a new runner, not the old one"
    log = op_log(op.id)
    assert any(
        m.startswith("runner pod missing or dead (pod phase Failed, reason killed")
        and m.endswith(f"respawning duckgres-reshard-op-{op.id} (attempt 2/3)")
        for m in log
    )
    pod_log = op_log(op.id, "pod-log")
    assert pod_log[0] == CAPTURE_HEADER
    assert any(f"runner up as duckgres-reshard-op-{op.id} {first.uid}" in m for m in pod_log), (
        "the killed runner's log reached the op log before its files were removed"
    )


@pytest.mark.safeguard("reshard-40")
def test_duplicate_launch_delivery_with_the_local_launcher_keeps_one_runner(
    local_launcher: LocalLauncher,
) -> None:
    from reshard.control.launch import launch_runner

    op = new_op("pending")
    assert launch_runner(op.id, launcher_for=lambda kind: local_launcher) == "launched"
    first = local_launcher.get_phase(op.id)
    pid = _pid(local_launcher, op.id)
    assert launch_runner(op.id, launcher_for=lambda kind: local_launcher) == "already-running"
    second = local_launcher.get_phase(op.id)
    assert second.phase == "Running"
    assert not second.terminating, "the live runner was not signalled"
    assert second.uid == first.uid
    assert _pid(local_launcher, op.id) == pid
    assert len(local_launcher.list()) == 1


@pytest.mark.safeguard("reshard-70")
def test_an_observed_death_is_relaunched_at_once_not_after_staleness(
    local_launcher: LocalLauncher,
) -> None:
    """A SIGKILLed local runner whose heartbeat is still fresh is relaunched by the next tick
    (not after the 300 s stale window), within the same bounded budget."""
    from django.db import connection

    op = stale_pending()
    janitor = Janitor(
        LeaderLease("janitor", holder="local-test.1.00000000"),
        launcher_for=lambda kind: local_launcher,
    )
    janitor.reconcile()
    first = local_launcher.get_phase(op.id)
    type(op).objects.filter(id=op.id).update(state="running", runner_epoch=1, step="copying")
    age_op(op.id, heartbeat_at="1 second")
    janitor.reconcile()  # alive and fresh: untouched
    assert refresh(op).respawn_attempts == 1
    assert local_launcher.get_phase(op.id).uid == first.uid

    pid = _pid(local_launcher, op.id)
    assert pid
    os.killpg(pid, signal.SIGKILL)
    _wait_for(lambda: local_launcher.get_phase(op.id).exited)
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        [(died_at,)] = cur.fetchall()

    janitor.reconcile()  # heartbeat still fresh (about 1 s old): acted on at once
    row = refresh(op)
    assert row.respawn_attempts == 2
    assert row.heartbeat_at is None
    second = local_launcher.get_phase(op.id)
    assert second.phase == "Running"
    assert second.uid != first.uid
    log = op_log(op.id)
    assert any(
        f"runner duckgres-reshard-op-{op.id} (epoch 1) exited (phase Failed" in m
        and "relaunching now instead of waiting for the heartbeat to go stale" in m
        for m in log
    ), log
    respawned = [
        m for m in log if m.endswith(f"respawning duckgres-reshard-op-{op.id} (attempt 2/3)")
    ]
    assert respawned, log
    # Measured on the database clock: the relaunch came well within one janitor interval (30 s).
    from duckgres_admin.models import ReshardLogEntry

    relaunch_ts = (
        ReshardLogEntry.objects.filter(operation_id=op.id, message=respawned[-1])
        .order_by("-id")
        .values_list("ts", flat=True)
        .first()
    )
    assert relaunch_ts is not None
    assert (relaunch_ts - died_at).total_seconds() < 30


@pytest.mark.safeguard("reshard-70")
def test_a_live_runner_with_a_fresh_heartbeat_is_never_released(
    local_launcher: LocalLauncher,
) -> None:
    op = stale_pending()
    janitor = Janitor(
        LeaderLease("janitor", holder="local-test.1.00000000"),
        launcher_for=lambda kind: local_launcher,
    )
    janitor.reconcile()
    type(op).objects.filter(id=op.id).update(state="running", runner_epoch=1, step="copying")
    age_op(op.id, heartbeat_at="1 second")
    for _ in range(2):
        janitor.reconcile()
    row = refresh(op)
    assert row.heartbeat_at is not None
    assert row.respawn_attempts == 1
    assert not [m for m in op_log(op.id) if "relaunching now" in m]
