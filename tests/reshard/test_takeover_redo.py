"""Safeguard reshard-73: before the point of no return a relaunched runner redoes the steps.

A real runner is SIGKILLed right after stamping a pre-cutover step (the test hooks of
``reshard.engines.testhooks``); its heartbeat is backdated past the stale window (what the
janitor's relaunch sees) and a new runner takes over. It must redo the sequence from
``blocking`` and end ``succeeded`` with the catalog identical on the target, the compaction
setting back to the original prior (not the paused value) and no open multipart upload of the
op left in S3. Where a redo is refused (the binding no longer names the source, the op already
unblocked, no external target password), the takeover says why and rolls back.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from reshard.engines import backup
from reshard.runner.errors import StepError
from reshard.runner.steps import access, blocking, compaction, record_source
from tests.fixtures.faults import backdate, killed_at, lines_of_epoch, with_bucket
from tests.fixtures.runner import (
    CnpgWorld,
    ExternalSourceWorld,
    ExternalTargetWorld,
    RunnerS3,
    catalog_checksums,
    database_exists,
    external_source_world,
    external_target_world,
    op_log,
    password_url,
    reload,
    role_can_login,
    run_runner,
    runner_moto_server,
    runner_s3,
    step_rows,
    warehouse_of,
)
from tests.fixtures.stores import StoreCluster

__all__ = [
    "external_source_world",
    "external_target_world",
    "runner_moto_server",
    "runner_s3",
]

pytestmark = pytest.mark.faults

REDO = "(before the cutover): redoing the steps from blocking"
NOT_REDOING = "(before the cutover): not redoing the steps: "


def open_uploads(s3: RunnerS3, op_id: int) -> list[str]:
    """Keys of the open multipart uploads of ``op_id``'s backups, read from the S3 server."""
    return s3.open_uploads(f"{backup.KEY_PREFIX}op-{op_id}-")


def leave_open_upload(s3: RunnerS3, op_id: int) -> str:
    """What a runner killed mid-backup leaves: an open multipart upload with one part."""
    client = s3.client()
    key = f"{backup.KEY_PREFIX}op-{op_id}-19700101T000000Z.dump"
    upload = client.create_multipart_upload(Bucket=s3.bucket, Key=key)
    client.upload_part(
        Bucket=s3.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 1024
    )
    return key


def target_cluster(world: CnpgWorld) -> StoreCluster:
    return StoreCluster("target", world.target_store.host, world.target_store.port)


def relaunch(op_id: int, state_dir: Any, **env: str) -> ReshardOperation:
    """The janitor's relaunch of a dead runner: stale heartbeat, attempt +1, a new runner."""
    backdate(op_id)
    ReshardOperation.objects.filter(id=op_id).update(respawn_attempts=2)
    runner = run_runner(op_id, state_dir, 120, env_extra=env)
    assert runner.proc.returncode == 0, runner.output()
    return ReshardOperation.objects.get(id=op_id)


# --- cnpg→cnpg: a kill in each pre-cutover step, a relaunch, success ----------------------------
@pytest.mark.safeguard("reshard-73")
@pytest.mark.parametrize(
    "point",
    [
        "step:blocking",
        "step:preparing_access",
        "step:draining",
        "step:fencing_source",
        "after_nologin",
        "step:pausing_compaction",
        "step:backup_catalog",
    ],
)
def test_cnpg_kill_before_the_cutover_is_redone_and_succeeds(
    cnpg_world: CnpgWorld, runner_state_dir: Any, runner_s3: RunnerS3, point: str
) -> None:
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    s3_env = with_bucket(world.op.org_id, runner_s3)
    killed_at(world.op.id, runner_state_dir, point, **s3_env)
    killed = reload(world.op)
    step = killed.step
    assert warehouse_of(killed).metadata_store_id == world.source_store.name  # never flipped
    if step == "backup_catalog":
        assert warehouse_of(killed).compaction_enabled is False  # paused by the dead runner
    if point == "after_nologin":
        assert role_can_login(world.catalog.cluster, world.catalog.role) is False
    leave_open_upload(runner_s3, killed.id)

    op = relaunch(killed.id, runner_state_dir, **s3_env)

    lines = op_log(op.id)
    assert (op.state, op.error) == ("succeeded", ""), lines
    assert op.runner_epoch == 2
    second = lines_of_epoch(op.id, 2)
    assert (
        f"takeover at step {step} {REDO} (attempt 2 of the respawn budget of 3; the binding "
        "still names the source)"
    ) in second
    assert any(line.startswith("source recorded: ") for line in second)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.target_store.name)
    assert wh.compaction_enabled is True, "the original prior, not the paused value"
    assert op.compaction_prior == {"present": True, "value": True}
    assert catalog_checksums(target_cluster(world), world.catalog.database) == before
    assert not database_exists(world.catalog.cluster, world.catalog.database)
    assert op.backup_s3_uri.startswith(f"s3://{runner_s3.bucket}/{backup.KEY_PREFIX}op-{op.id}-")
    assert open_uploads(runner_s3, op.id) == []
    # The redo stamped the whole sequence again under the new epoch.
    redone = [s for s, _, epoch in step_rows(op.id) if epoch == 2]
    assert redone[:2] == ["blocking", "preparing_access"]
    assert redone[-1] == "finalizing"


# --- external→cnpg ------------------------------------------------------------------------------
@pytest.mark.safeguard("reshard-73")
@pytest.mark.parametrize("point", ["step:draining", "step:backup_catalog"])
def test_external_source_kill_before_the_cutover_is_redone_and_succeeds(
    external_source_world: ExternalSourceWorld,
    runner_state_dir: Any,
    runner_s3: RunnerS3,
    point: str,
) -> None:
    world = external_source_world
    Warehouse.objects.filter(org_id=world.op.org_id).update(compaction_enabled=True)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    s3_env = with_bucket(world.op.org_id, runner_s3)
    killed_at(world.op.id, runner_state_dir, point, **s3_env)
    step = reload(world.op).step
    op = relaunch(world.op.id, runner_state_dir, **s3_env)
    lines = op_log(op.id)
    assert op.state == "succeeded", lines
    assert any(line.startswith(f"takeover at step {step} {REDO}") for line in lines)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind, wh.metadata_store_id) == (
        "ready",
        "cnpg",
        world.target_store.name,
    )
    assert wh.compaction_enabled is True
    target = StoreCluster("target", world.target_store.host, world.target_store.port)
    assert catalog_checksums(target, world.catalog.database) == before
    assert database_exists(world.catalog.cluster, world.catalog.database), "external kept"
    assert open_uploads(runner_s3, op.id) == []


# --- cnpg→external: the password is handed out once, so a takeover after the pull rolls back ---
@pytest.mark.safeguard("reshard-73")
@pytest.mark.safeguard("reshard-79")
@pytest.mark.parametrize("point", ["step:fencing_source", "step:copying"])
def test_cnpg_to_external_takeover_after_the_pull_rolls_back_the_password_being_gone(
    external_target_world: ExternalTargetWorld,
    runner_state_dir: Any,
    runner_s3: RunnerS3,
    point: str,
) -> None:
    world = external_target_world
    s3_env = with_bucket(world.op.org_id, runner_s3)
    with password_url(world.target.password) as url:
        killed_at(world.op.id, runner_state_dir, point, DUCKGRES_RESHARD_PASSWORD_URL=url, **s3_env)
        step = reload(world.op).step
        # The relaunched runner pulls again: the stash entry is gone (404).
        op = relaunch(world.op.id, runner_state_dir, DUCKGRES_RESHARD_PASSWORD_URL=url, **s3_env)
    lines = op_log(op.id)
    assert op.state == "failed", lines
    assert "cannot be resumed safely" in op.error
    assert any(
        line.startswith("could not pull the external target password: password not available")
        for line in lines
    )
    assert any(
        line.startswith(f"takeover at step {step} {NOT_REDOING}")
        and "external target password is gone" in line
        and "rolled back" in line
        for line in lines
    ), lines
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True
    assert open_uploads(runner_s3, op.id) == []


@pytest.mark.safeguard("reshard-73")
def test_cnpg_to_external_takeover_without_the_password_is_not_redone(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    s3_env = with_bucket(world.op.org_id, runner_s3)
    with password_url(world.target.password) as url:
        killed_at(
            world.op.id,
            runner_state_dir,
            "step:pausing_compaction",
            DUCKGRES_RESHARD_PASSWORD_URL=url,
            **s3_env,
        )
    op = relaunch(world.op.id, runner_state_dir, **s3_env)  # no password for this runner
    assert op.state == "failed"
    assert "cannot be resumed safely" in op.error
    assert any(
        NOT_REDOING in line and "external target password is gone" in line for line in op_log(op.id)
    )
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True


# --- refusals: never redo onto something that is not this op's own partial effect ---------------
@pytest.mark.safeguard("reshard-73")
def test_a_takeover_whose_binding_no_longer_names_the_source_is_not_redone(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    killed_at(world.op.id, runner_state_dir, "step:draining")
    op = reload(world.op)
    # Someone re-pointed the binding while the op was blocked (here: at the target store).
    Warehouse.objects.filter(org_id=op.org_id).update(
        metadata_store=MetadataStore.objects.get(name=op.to_shard)
    )
    op = relaunch(op.id, runner_state_dir)
    assert op.state == "failed"
    assert op.error == (
        "takeover at step draining cannot be resumed safely; rolling back from durable progress"
    )
    assert any(
        line.startswith(f"takeover at step draining {NOT_REDOING}the binding no longer names")
        for line in op_log(op.id)
    )
    assert not [s for s, _, epoch in step_rows(op.id) if epoch == 2]
    assert database_exists(world.catalog.cluster, world.catalog.database)


@pytest.mark.safeguard("reshard-73")
def test_a_takeover_after_this_ops_own_unblock_is_not_redone(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    """The dead runner's rollback had unblocked the warehouse (``unblocked_at``) and died before
    its terminal write: the takeover must not block the warehouse again."""
    world = cnpg_world
    killed_at(world.op.id, runner_state_dir, "step:draining")
    op = reload(world.op)
    Warehouse.objects.filter(org_id=op.org_id).update(
        state="ready", status_message="metadata-store reshard rolled back"
    )
    ReshardOperation.objects.filter(id=op.id).update(unblocked_at=Now())
    op = relaunch(op.id, runner_state_dir)
    assert op.state == "failed"
    assert "cannot be resumed safely" in op.error
    assert any(
        NOT_REDOING + "this operation already unblocked the warehouse" in line
        for line in op_log(op.id)
    )
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert not [s for s, _, epoch in step_rows(op.id) if epoch == 2]


# --- each redone step accepts only its own op's earlier effect (in-process) -------------------
@pytest.mark.safeguard("reshard-73")
def test_the_block_accepts_resharding_only_when_this_op_blocked_it(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    Warehouse.objects.filter(org_id=env.op.org_id).update(
        state="resharding", status_message="metadata-store reshard in progress"
    )
    with pytest.raises(StepError, match="warehouse is not ready"):
        blocking.block_warehouse(env)  # resharding, but not by this op (no blocked_at)
    assert reload(env.op).blocked_at is None
    Warehouse.objects.filter(org_id=env.op.org_id).update(state="ready")
    blocking.block_warehouse(env)
    blocking.block_warehouse(env)  # the redo: this op's own block
    ReshardOperation.objects.filter(id=env.op.id).update(unblocked_at=Now())
    with pytest.raises(StepError, match="warehouse is not ready"):
        blocking.block_warehouse(env)  # this op already unblocked once: not its block any more


@pytest.mark.safeguard("reshard-73")
def test_access_accepts_a_nologin_tenant_only_after_this_ops_fence_request(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    record_source.run(env)
    with cnpg_world.catalog.cluster.superuser_conn() as conn:
        conn.execute(f'ALTER ROLE "{cnpg_world.catalog.role}" NOLOGIN')
    with pytest.raises(StepError, match="is NOLOGIN before the fence"):
        access.run(env)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET source_fence_requested_at = now() "
            "WHERE id = %s",
            [env.op.id],
        )
    access.run(env)
    assert any(
        line.endswith("(tenant role is NOLOGIN from this operation's earlier fence)")
        for line in op_log(env.op.id)
    )
    assert reload(env.op).source_access_verified_at is not None


@pytest.mark.safeguard("reshard-73")
def test_a_redone_compaction_pause_keeps_the_first_prior(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    compaction.run(env)
    assert warehouse_of(env.op).compaction_enabled is False
    compaction.run(env)  # the redo reads the paused false
    assert reload(env.op).compaction_prior == {"present": True, "value": True}
    assert any("kept from an earlier attempt" in line for line in op_log(env.op.id))
