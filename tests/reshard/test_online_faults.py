"""The online mode under faults (docs/runner.md "The online mode"): a cancel at each new step,
a kill -9 at each new step and mid-catch-up with the janitor's relaunch, a force-fail recovered
by ``reshard_recover``, and a catch-up that cannot apply — each with real runner processes, and
each ending with nothing of the capture left on the source (safeguard reshard-144) and the
tenant's catalog as it was, on the store the binding names.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from duckgres_admin.models import ReshardOperation
from reshard.operation import sequences
from tests.fixtures.faults import backdate, killed_at, pause, with_bucket
from tests.fixtures.online import CaptureProbe
from tests.fixtures.runner import (
    CnpgWorld,
    RunnerS3,
    catalog_checksums,
    database_exists,
    op_log,
    reload,
    role_can_login,
    run_runner,
    runner_moto_server,
    runner_s3,
    start_runner,
    step_rows,
    wait_until,
    warehouse_of,
)
from tests.fixtures.stores import StoreCluster, ducklake_tables

__all__ = ["runner_moto_server", "runner_s3"]  # fixtures used here

pytestmark = pytest.mark.faults


def _online(
    world: CnpgWorld, s3: RunnerS3, *, after_unblock: bool = True
) -> tuple[ReshardOperation, dict[str, str]]:
    """The world's operation in the online mode; the runner's S3 environment (the backup)."""
    env = with_bucket(world.op.org_id, s3)
    ReshardOperation.objects.filter(id=world.op.id).update(
        copy_mode="online",
        copy_mode_reason="online (requested)",
        backup_after_unblock=after_unblock,
    )
    return reload(world.op), env


def _target(world: CnpgWorld) -> StoreCluster:
    return StoreCluster("target", world.target_store.host, world.target_store.port)


def run(op_id: int, *args: str) -> str:
    """``reshard_recover`` as an operator runs it; its output."""
    out = io.StringIO()
    call_command("reshard_recover", str(op_id), *args, stdout=out)
    return out.getvalue()


def _reached(op_id: int, text: str) -> bool:
    return any(text in line for line in op_log(op_id))


def assert_rolled_back(world: CnpgWorld, before: dict[str, str]) -> None:
    """The tenant is where it was: the binding names the source, the warehouse is ready, the
    tenant logs in, its catalog unchanged and free of the capture; the target holds nothing."""
    op = reload(world.op)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name), op_log(op.id)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
    CaptureProbe(world.catalog.cluster, world.catalog.database).assert_nothing_left()
    if database_exists(_target(world), world.catalog.database):
        assert ducklake_tables(_target(world), world.catalog.database) == []
    assert op.recovery_required is False


# --- cancel at each new step, before the flip ------------------------------------------------
@pytest.mark.safeguard("reshard-144")
@pytest.mark.parametrize(
    ("point", "seen"),
    [
        ("step:rendering_target", "rendering_target"),
        ("precopy:copied", "pre-copy complete"),
        ("step:catching_up", "catching_up"),
        ("catch_up:applied", "catch-up applied"),
    ],
)
def test_a_cancel_before_the_flip_leaves_nothing_of_the_online_mode(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3, point: str, seen: str
) -> None:
    world = cnpg_world
    op, s3 = _online(world, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    runner = start_runner(op.id, runner_state_dir, env_extra={**pause(point), **s3})
    wait_until(lambda: reload(op).step == seen or _reached(op.id, seen), 60, seen)
    ReshardOperation.objects.filter(id=op.id).update(cancel_requested=True)
    assert runner.wait(120) == 0, runner.output()
    op = reload(op)
    assert op.state == "cancelled", (op.error, op_log(op.id))
    assert_rolled_back(world, before)
    if point != "step:rendering_target":
        assert op.capture_removed_at is not None
        assert any("change capture removed" in line for line in op_log(op.id))


# --- kill -9 at each new step and mid-catch-up; the janitor's relaunch ------------------------
@pytest.mark.safeguard("reshard-144")
@pytest.mark.parametrize(
    "point",
    [
        "step:rendering_target",
        "step:precopying",
        "precopy:captured",
        "precopy:copied",
        "step:blocking",
        "step:catching_up",
        "catch_up:triggers_dropped",
        "catch_up:applied",
    ],
)
def test_a_kill_before_the_flip_restarts_the_pre_copy_from_a_clean_slate_and_succeeds(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3, point: str
) -> None:
    world = cnpg_world
    # the triggers are dropped inside the window only when the backup runs before the flip
    op, s3 = _online(world, runner_s3, after_unblock=point != "catch_up:triggers_dropped")
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(op.id, runner_state_dir, point, **s3)
    backdate(op.id)
    ReshardOperation.objects.filter(id=op.id).update(respawn_attempts=2)
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=s3)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, lines)
    assert any("redoing the steps from rendering_target" in line for line in lines)
    if point not in ("step:rendering_target", "step:precopying"):
        # what the dead runner left was observed and cleared before the new pre-copy
        assert any("an earlier attempt" in line or "earlier pre-copy" in line for line in lines)
    assert catalog_checksums(_target(world), world.catalog.database) == before
    assert warehouse_of(op).metadata_store_id == world.target_store.name
    CaptureProbe(_target(world), world.catalog.database).assert_nothing_left()
    assert not database_exists(world.catalog.cluster, world.catalog.database)


@pytest.mark.safeguard("reshard-144")
@pytest.mark.parametrize("point", ["after_flip", "step:opening"])
def test_a_kill_in_the_cutover_rolls_back_and_removes_the_capture(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3, point: str
) -> None:
    """At ``cutover`` (the flip may have landed) and at ``opening`` before its commit the
    takeover cannot resume: it rolls back."""
    world = cnpg_world
    op, s3 = _online(world, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(op.id, runner_state_dir, point, **s3)
    assert reload(op).target_opened_at is None
    assert warehouse_of(reload(op)).metadata_store_id == world.target_store.name
    backdate(op.id)
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=s3)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert "cannot be resumed safely" in op.error
    assert_rolled_back(world, before)


@pytest.mark.safeguard("reshard-146")
@pytest.mark.parametrize(
    ("point", "reason"),
    [
        ("step:verifying", "comparison did not pass in this run"),
        ("step:backup_catalog", "no backup of the fenced source was recorded"),
    ],
)
def test_a_kill_after_the_unblock_keeps_the_source_and_says_why(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3, point: str, reason: str
) -> None:
    """Past ``opening`` (the commit point) the tenant writes the target: the relaunch rolls
    forward, never re-points the source, and — the target's snapshot at the flip being gone with
    the dead runner — keeps the fenced source instead of dropping it, ending ``failed`` with the
    reason, the warehouse serving from the target."""
    world = cnpg_world
    op, s3 = _online(world, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(op.id, runner_state_dir, point, **s3)
    assert reload(op).target_opened_at is not None
    assert warehouse_of(reload(op)).state == "ready"
    backdate(op.id)
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=s3)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "failed", op_log(op.id)
    assert "the source was kept" in op.error
    assert reason in op.source_kept_reason
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.target_store.name)
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
    assert role_can_login(world.catalog.cluster, world.catalog.role) is False
    CaptureProbe(world.catalog.cluster, world.catalog.database).assert_nothing_left()


@pytest.mark.safeguard("reshard-146")
def test_a_target_that_differs_at_the_flip_keeps_the_source_and_names_the_table(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    """The catch-up's in-window check passed, then, before the unblock, a row reaches the
    target that the fenced source does not have (here written by hand; in life a bug or a
    foreign writer). The comparison after the unblock reads the target's snapshot held from
    the flip, finds the table that differs, and the source is kept, intact and fenced: the
    operation fails naming the table, the warehouse serves from the target."""
    world = cnpg_world
    op, s3 = _online(world, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    runner = start_runner(op.id, runner_state_dir, env_extra={**pause("step:opening", 4), **s3})
    wait_until(lambda: reload(op).step == "opening", 120, "opening")
    with _target(world).superuser_conn(world.catalog.database) as conn:
        conn.execute(
            "INSERT INTO public.ducklake_metadata (key, value) VALUES ('written_at_the_flip', 'x')"
        )
    assert runner.wait(180) == 0, runner.output()
    op = reload(op)
    assert op.state == "failed", op_log(op.id)
    assert "the source was kept" in op.error
    assert "ducklake_metadata" in op.source_kept_reason
    assert "differ" in op.source_kept_reason
    assert op.catalog_fingerprint is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.target_store.name)
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
    assert role_can_login(world.catalog.cluster, world.catalog.role) is False
    CaptureProbe(world.catalog.cluster, world.catalog.database).assert_nothing_left()


# --- force-fail, then reshard_recover --------------------------------------------------------
@pytest.mark.safeguard("reshard-144")
def test_reshard_recover_removes_the_capture_of_a_force_failed_pre_copy(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    """A runner dies in the pre-copy, before the block, and the janitor force-fails the
    operation (as its rule does: a stamped step means recovery is required). The capture is on
    the tenant's tables; the plan names its removal and the recovery does it."""
    world = cnpg_world
    op, s3 = _online(world, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(op.id, runner_state_dir, "precopy:copied", **s3)
    assert CaptureProbe(world.catalog.cluster, world.catalog.database).installed()
    with connection.cursor() as cursor:  # the janitor's force-fail (reshard.control.janitor)
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET state = 'failed', finished_at = now(), "
            "runner_id = 'janitor', recovery_required = (step <> '' OR blocked_at IS NOT NULL) "
            "WHERE id = %s",
            [op.id],
        )
    assert reload(op).recovery_required is True
    plan = run(op.id)
    assert "remove the online copy's change capture" in plan
    out = run(op.id, "--execute")
    assert "outcome rolled_back" in out, out
    assert_rolled_back(world, before)


# --- a catch-up that cannot apply fails the operation and rolls back ------------------------
@pytest.mark.safeguard("reshard-144")
def test_a_catalog_table_changed_during_the_pre_copy_fails_the_catch_up_and_rolls_back(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = cnpg_world
    op, s3 = _online(world, runner_s3)
    runner = start_runner(op.id, runner_state_dir, env_extra={**pause("step:blocking", 3), **s3})
    wait_until(lambda: reload(op).step == "blocking", 60, "blocking")
    table = ducklake_tables(world.catalog.cluster, world.catalog.database)[0]
    with world.catalog.cluster.superuser_conn(world.catalog.database) as conn:
        conn.execute(f"ALTER TABLE public.{table} ADD COLUMN extra integer")
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    assert runner.wait(120) == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert "changed since the pre-copy" in op.error
    assert [s for s, o, _ in step_rows(op.id)][-1] == "catching_up"
    assert sequences.at_or_past(op.step, "catching_up", "cnpg", op.copy_variant)
    assert_rolled_back(world, before)


@pytest.mark.safeguard("reshard-146")
def test_without_a_backup_the_source_is_kept_after_the_unblock(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    """The warehouse has no bucket: the backup after the unblock fails, so the moved tenant
    keeps running on the target and the fenced source is kept, never dropped unbacked."""
    world = cnpg_world
    ReshardOperation.objects.filter(id=world.op.id).update(
        copy_mode="online", backup_after_unblock=True
    )
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    runner = run_runner(world.op.id, runner_state_dir, 180)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "failed"
    assert op.source_kept_reason == "no backup of the fenced source was recorded"
    assert warehouse_of(op).metadata_store_id == world.target_store.name
    assert catalog_checksums(_target(world), world.catalog.database) == before
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
