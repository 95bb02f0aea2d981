"""Fencing: epoch bumps, the block transaction, the heartbeat thread and the self-fence.

In-process tests drive the runner's own functions with a claimed run context and a second
database connection standing in for the takeover; the process test bumps the epoch of a real
runner mid-run.
"""

from __future__ import annotations

import subprocess
import threading
import time

import psycopg
import pytest
from django.db import OperationalError, connection

from duckgres_admin.models import Warehouse
from reshard.runner.errors import Fenced
from reshard.runner.heartbeat import Heartbeat
from reshard.runner.rollback import unblock
from reshard.runner.steps.blocking import block_warehouse
from tests.fixtures.processes import child_config_store_dsn
from tests.fixtures.runner import (
    CnpgWorld,
    op_log,
    reload,
    start_runner,
    takeover_bump,
    wait_until,
    warehouse_of,
)

FENCED_LINE = "operation fenced: another runner took over; this runner abandons it"


@pytest.mark.safeguard("reshard-47")
def test_epoch_bump_before_the_block_transaction_blocks_nothing(cnpg_world: CnpgWorld, claimed_env):
    env = claimed_env(cnpg_world.op)
    takeover_bump(env.op.id)
    with pytest.raises(Fenced):
        block_warehouse(env)
    wh = warehouse_of(env.op)
    assert (wh.state, wh.status_message) == ("ready", "")
    assert reload(env.op).blocked_at is None
    assert env.ctx.progress.blocked is False


@pytest.mark.safeguard("reshard-47")
def test_a_stale_unblock_writes_nothing(cnpg_world: CnpgWorld, claimed_env):
    env = claimed_env(cnpg_world.op)
    block_warehouse(env)
    assert warehouse_of(env.op).state == "resharding"
    takeover_bump(env.op.id)
    with pytest.raises(Fenced):
        unblock(env)
    assert warehouse_of(env.op).state == "resharding"
    assert reload(env.op).unblocked_at is None


def test_block_is_idempotent_for_a_restart_and_refuses_a_non_ready_warehouse(
    cnpg_world: CnpgWorld, claimed_env
):
    env = claimed_env(cnpg_world.op)
    block_warehouse(env)
    first = reload(env.op).blocked_at
    block_warehouse(env)  # takeover/restart: the no-op resharding → resharding probe
    assert reload(env.op).blocked_at == first
    assert "already in resharding state (takeover or restart) — continuing" in op_log(env.op.id)
    Warehouse.objects.filter(org_id=env.op.org_id).update(state="provisioning")
    with pytest.raises(Exception, match="warehouse is not ready"):
        block_warehouse(env)


@pytest.mark.safeguard("reshard-17")
def test_epoch_bump_mid_run_fences_the_old_runner_without_terminal_write(
    cnpg_world: CnpgWorld, runner_state_dir
):
    op = cnpg_world.op
    first = start_runner(op.id, runner_state_dir, DUCKGRES_CONFIG_POLL_INTERVAL="20")
    wait_until(lambda: reload(op).blocked_at is not None, what="the block to commit")
    # A second runner cannot claim while the first one's heartbeat is fresh.
    second = start_runner(op.id, runner_state_dir / "second")
    assert second.wait(60) == 1, second.output()
    assert any(line.startswith("operation not claimable (owned by") for line in op_log(op.id))
    takeover_bump(op.id)
    assert first.wait(30) != 0, first.output()
    assert first.exit_file().read_text().strip() == "1"
    after = reload(op)
    assert after.state == "running"
    assert after.error == ""
    assert after.finished_at is None
    assert after.unblocked_at is None
    assert warehouse_of(op).state == "resharding"  # the takeover owns it now
    lines = op_log(op.id)
    assert lines.count(FENCED_LINE) == 1
    assert not [line for line in lines if line.startswith("==== reshard report")]
    assert lines[-1].startswith(f"runner log persisted: pod duckgres-reshard-op-{op.id} uid ")
    assert " epoch 1, " in lines[-1]


@pytest.mark.safeguard("reshard-17")
def test_heartbeat_fenced_interrupts_connections_and_children(cnpg_world: CnpgWorld, claimed_env):
    env = claimed_env(cnpg_world.op)
    busy = psycopg.connect(child_config_store_dsn(), autocommit=True)
    child = subprocess.Popen(["sleep", "60"])
    env.ctx.register_connection(busy)
    env.ctx.register_process(child)
    outcome: dict[str, BaseException | None] = {}

    def long_query() -> None:
        try:
            busy.execute("SELECT pg_sleep(60)")
            outcome["error"] = None
        except psycopg.Error as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=long_query)
    worker.start()
    heartbeat = Heartbeat(
        env.ctx, env.log, env.fence.heartbeat, interval=0.2, stale_seconds=62, poll_seconds=0.2
    )
    heartbeat.start()
    try:
        time.sleep(0.5)
        assert not env.ctx.fenced
        takeover_bump(env.op.id)
        wait_until(lambda: env.ctx.fenced, timeout=5, what="the heartbeat to notice fencing")
        assert env.ctx.stop.is_set()
        worker.join(10)
        assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled)
        assert child.wait(10) == -9
    finally:
        heartbeat.stop()
        busy.close()
        if child.poll() is None:
            child.kill()
    assert op_log(env.op.id).count(FENCED_LINE) == 1


@pytest.mark.safeguard("reshard-17")
def test_a_one_off_heartbeat_store_error_does_not_fence(cnpg_world: CnpgWorld, claimed_env):
    env = claimed_env(cnpg_world.op)
    calls = {"n": 0}

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("injected store outage")
        env.fence.heartbeat()

    before = reload(env.op).heartbeat_at
    heartbeat = Heartbeat(env.ctx, env.log, flaky, interval=0.3, stale_seconds=62, poll_seconds=0.1)
    heartbeat.start()
    try:
        wait_until(lambda: calls["n"] >= 4, timeout=5, what="four heartbeat ticks")
    finally:
        heartbeat.stop()
    assert not env.ctx.fenced
    assert not env.ctx.stop.is_set()
    after = reload(env.op).heartbeat_at
    assert before is not None
    assert after is not None
    assert after > before
    warnings = [line for line in op_log(env.op.id) if line.startswith("heartbeat write failed")]
    assert len(warnings) == 1
    assert "injected store outage" in warnings[0]


@pytest.mark.safeguard("reshard-48")
def test_self_fence_when_no_fenced_write_succeeds_for_stale_minus_60(
    cnpg_world: CnpgWorld, claimed_env
):
    """STALE=62 → self-fence after 2 s without a successful fenced write."""
    env = claimed_env(cnpg_world.op)
    busy = psycopg.connect(child_config_store_dsn(), autocommit=True)
    env.ctx.register_connection(busy)
    result: dict[str, BaseException | None] = {}

    def long_query() -> None:
        try:
            busy.execute("SELECT pg_sleep(60)")
            result["error"] = None
        except psycopg.Error as exc:
            result["error"] = exc

    def store_down() -> None:
        raise OperationalError("config store unreachable (injected)")

    worker = threading.Thread(target=long_query)
    worker.start()
    started = time.monotonic()
    heartbeat = Heartbeat(
        env.ctx, env.log, store_down, interval=0.5, stale_seconds=62, poll_seconds=0.2
    )
    heartbeat.start()
    try:
        wait_until(lambda: env.ctx.fenced, timeout=8, what="the self-fence")
        elapsed = time.monotonic() - started
        worker.join(10)
    finally:
        heartbeat.stop()
        busy.close()
    assert elapsed >= 2.0
    assert env.ctx.stop.is_set()
    assert isinstance(result.get("error"), psycopg.errors.QueryCanceled)
    lines = op_log(env.op.id)
    fenced = [line for line in lines if line.startswith("runner self-fenced")]
    assert len(fenced) == 1
    assert fenced[0].endswith("(stale window 62 s); abandoning the operation to a takeover")
    # Once fenced, every fenced write refuses without touching the store.
    with pytest.raises(Fenced):
        env.fence.update(step="draining")
    assert reload(env.op).step == ""


@pytest.mark.safeguard("reshard-48")
def test_pre_statement_heartbeat_refuses_past_the_self_fence_age(
    cnpg_world: CnpgWorld, claimed_env
):
    env = claimed_env(cnpg_world.op)
    env.fence.pre_statement_heartbeat()  # fresh: heartbeats
    env.ctx._last_write = time.monotonic() - 5  # older than stale (62) - 60
    with pytest.raises(Fenced):
        env.fence.pre_statement_heartbeat()


@pytest.mark.safeguard("reshard-48")
def test_a_beat_hanging_on_the_network_cannot_delay_the_self_fence(
    cnpg_world: CnpgWorld, claimed_env
):
    env = claimed_env(cnpg_world.op)
    release = threading.Event()

    def hang() -> None:  # a store that neither answers nor resets the connection
        release.wait(30)

    heartbeat = Heartbeat(env.ctx, env.log, hang, interval=0.3, stale_seconds=62, poll_seconds=0.2)
    heartbeat.start()
    try:
        wait_until(lambda: env.ctx.fenced, timeout=6, what="the self-fence")
    finally:
        release.set()
        heartbeat.stop()
    assert env.ctx.stop.is_set()
    assert any(line.startswith("runner self-fenced") for line in op_log(env.op.id))


@pytest.mark.safeguard("reshard-48")
def test_a_runner_cut_off_from_the_config_store_self_fences_and_writes_nothing(
    cnpg_world: CnpgWorld, runner_state_dir
):
    from tests.fixtures.runner import TcpProxy

    op = cnpg_world.op
    proxy = TcpProxy("127.0.0.1", int(connection.settings_dict["PORT"] or 5432))
    runner = start_runner(
        op.id,
        runner_state_dir,
        DUCKGRES_CONFIG_POLL_INTERVAL="20",
        DUCKGRES_CONFIG_STORE=proxy.dsn(child_config_store_dsn()),
    )
    wait_until(lambda: reload(op).blocked_at is not None, what="the block to commit")
    proxy.cut()
    cut_at = time.monotonic()
    code = runner.wait(30)
    assert code == 1, runner.output()
    assert time.monotonic() - cut_at < 15
    out = runner.output()
    assert "runner self-fenced: no successful heartbeat for" in out
    assert "(stale window 62 s); abandoning the operation to a takeover" in out
    assert runner.exit_file().read_text().strip() == "1"
    after = reload(op)
    assert after.state == "running"
    assert after.error == ""
    assert after.unblocked_at is None
    assert warehouse_of(op).state == "resharding"  # left for the takeover to roll back
