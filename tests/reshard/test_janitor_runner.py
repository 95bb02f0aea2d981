"""The janitor relaunching a real ``manage.py reshard_runner`` killed with SIGKILL (spec reshard
§4.15, invariant 13; safeguards 24 and 35): the killed runner's process log reaches the op
log before its files are removed, a new runner takes over with a new epoch, and after the op
finished the runner that wrote its own exit marker is reaped without a second capture."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.platform.leadership import LeaderLease
from reshard.control.janitor import Janitor
from reshard.launchers.capture import CAPTURE_HEADER
from reshard.launchers.local import LocalLauncher
from tests.fixtures.janitor import age_op, janitor_env, op_log, refresh
from tests.fixtures.processes import child_config_store_dsn
from tests.fixtures.runner import CnpgWorld, wait_until, warehouse_of

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env


@pytest.mark.safeguard("reshard-35")
@pytest.mark.safeguard("reshard-24")
def test_sigkilled_runner_log_is_kept_and_the_janitor_relaunches(
    cnpg_world: CnpgWorld,
    runner_state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    # The launcher builds the runner's environment from this process's: point it at the test
    # database and hold the runner in its post-block propagation wait (2 x 20 s).
    monkeypatch.setenv("DUCKGRES_CONFIG_STORE", child_config_store_dsn())
    monkeypatch.setenv("DUCKGRES_CONFIG_POLL_INTERVAL", "20")
    op = cnpg_world.op
    launcher = LocalLauncher(runner_state_dir)
    janitor = Janitor(
        LeaderLease("janitor", holder="runner-test.1.00000000"), launcher_for=lambda kind: launcher
    )
    try:
        age_op(op.id, created_at="10 minutes")  # the launch task "was lost"
        janitor.reconcile()
        assert refresh(op).respawn_attempts == 1
        wait_until(lambda: refresh(op).blocked_at is not None, 60, "the first runner to block")
        first = launcher.get_phase(op.id)
        assert first.phase == "Running"
        assert refresh(op).runner_epoch == 1

        record = launcher._read(op.id)
        assert record is not None
        os.killpg(int(record["pid"]), signal.SIGKILL)
        wait_until(lambda: launcher.get_phase(op.id).exited, 15, "the kill to be observed")
        age_op(op.id, heartbeat_at="10 minutes")  # its heartbeat is stale by now

        janitor.reconcile()
        row = refresh(op)
        assert row.respawn_attempts == 2
        pod_log = op_log(op.id, "pod-log")
        assert pod_log[0] == CAPTURE_HEADER
        assert any(f"uid {first.uid}" in line for line in pod_log[:2])
        assert any("operation claimed by" in line for line in pod_log[2:]), (
            "the killed runner's own output is in the op log"
        )
        second = launcher.get_phase(op.id)
        assert second.uid != first.uid

        # The takeover claims with a new epoch, redoes the steps from blocking (reshard-73) and
        # ends.
        wait_until(lambda: refresh(op).state in ("failed", "cancelled", "succeeded"), 90, "end")
        row = refresh(op)
        assert row.runner_epoch == 2
        assert warehouse_of(op).state == "ready"
        wait_until(lambda: launcher.get_phase(op.id).exited, 30, "the takeover to exit")
        final = launcher.get_phase(op.id)
        assert any(
            m.startswith("runner log persisted: pod ") and f" uid {final.uid} epoch " in m
            for m in op_log(op.id)
        )

        # The reap deletes it without capturing again: its marker is in the op log.
        captured_before = len(op_log(op.id, "pod-log"))
        janitor.reconcile()
        assert launcher.get_phase(op.id).phase == "absent"
        assert len(op_log(op.id, "pod-log")) == captured_before
    finally:
        for obj in launcher.list():
            rec = launcher._read(obj.op_id_label)
            if rec and launcher._alive(rec):
                os.killpg(int(rec["pid"]), signal.SIGKILL)
