"""Kills, takeovers and cancels of real runner processes (spec §4.5-§4.8; safeguards 2, 10, 16,
18, 19, 22, 44, 45, 52). Kills use the test-only hooks of ``reshard.engines.testhooks``; a
takeover backdates ``heartbeat_at`` past the stale window and starts a new runner."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from tests.fixtures.faults import backdate, killed_at, lines_of_epoch, pause, with_bucket
from tests.fixtures.rows import new_warehouse
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
    start_runner,
    wait_until,
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

LATE_CANCEL = "cancel requested after the point of no return; the operation will complete"


def target_cluster(world: CnpgWorld) -> StoreCluster:
    return StoreCluster("target", world.target_store.host, world.target_store.port)


# --- 16: a crash between the drop and its acknowledgement rolls forward ----------------------
@pytest.mark.safeguard("reshard-16")
def test_cnpg_kill_after_drop_before_dropped_at_takeover_rolls_forward(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(world.op.id, runner_state_dir, "after_source_drop")
    op = reload(world.op)
    assert op.source_drop_committed_at is not None
    assert op.source_dropped_at is None
    backdate(op.id)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "succeeded", op_log(op.id)
    assert op.source_dropped_at is not None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.target_store.name)
    assert catalog_checksums(target_cluster(world), world.catalog.database) == before
    second = lines_of_epoch(op.id, 2)
    assert any("after the commit point: rolling forward" in line for line in second)
    assert not any("flipped back" in line for line in second)


@pytest.mark.safeguard("reshard-16")
def test_external_kill_after_drop_before_dropped_at_takeover_rolls_forward(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    with password_url(world.target.password) as url:
        killed_at(
            world.op.id,
            runner_state_dir,
            "after_source_drop",
            DUCKGRES_RESHARD_PASSWORD_URL=url,
            **with_bucket(world.op.org_id, runner_s3),
        )
    op = reload(world.op)
    assert op.external_verified_at is not None
    assert op.source_dropped_at is None
    backdate(op.id)
    runner = run_runner(op.id, runner_state_dir)  # no password needed past the commit point
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "succeeded", op_log(op.id)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind) == ("ready", "external")
    assert wh.metadata_store_database == world.target.database


@pytest.mark.safeguard("reshard-135")
def test_the_source_drop_waits_for_a_lingering_provisioner_session_to_end(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    """The drop runs as the tenant role, which may not end a provisioner's backend: a copy or
    pg_dump session still exiting made ``DROP DATABASE … WITH (FORCE)`` fail (seen in CI)."""
    world = cnpg_world
    database = world.catalog.database
    lingering = world.catalog.cluster.provisioner_conn(database)
    runner = start_runner(world.op.id, runner_state_dir)
    noticed = "before DROP DATABASE; letting them end"
    try:
        wait_until(
            lambda: (
                runner.proc.poll() is not None
                or any(noticed in line for line in op_log(world.op.id))
            ),
            timeout=90,
            what="the drop to notice the lingering session",
        )
        time.sleep(1)
    finally:
        lingering.close()
    assert runner.wait() == 0, runner.output()
    op = reload(world.op)
    assert op.state == "succeeded", op_log(op.id)
    assert op.source_dropped_at is not None, op_log(op.id)
    assert not database_exists(world.catalog.cluster, database)
    assert not any("must be dropped manually" in line for line in op_log(op.id))


@pytest.mark.safeguard("reshard-16")
def test_a_finalize_failure_after_the_drop_stays_running_and_exits_non_zero(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    op_id = cnpg_world.op.id
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION test_no_success() RETURNS trigger AS $$ BEGIN "
            "IF NEW.state = 'succeeded' THEN RAISE EXCEPTION 'injected finalize failure'; END IF; "
            "RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER test_no_success BEFORE UPDATE ON duckgres_reshard_operations "
            "FOR EACH ROW EXECUTE FUNCTION test_no_success()"
        )
    try:
        runner = run_runner(op_id, runner_state_dir)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_no_success ON duckgres_reshard_operations")
            cursor.execute("DROP FUNCTION test_no_success()")
    assert runner.proc.returncode != 0
    op = reload(cnpg_world.op)
    assert op.state == "running"
    assert op.source_dropped_at is not None
    assert warehouse_of(op).state == "resharding"
    lines = op_log(op_id)
    assert "refusing rollback; retrying cleanup/finalization" in lines
    assert not any(line.startswith("rollback:") for line in lines)
    # the janitor's relaunch (a takeover) finishes it
    backdate(op_id)
    assert run_runner(op_id, runner_state_dir).proc.returncode == 0
    assert reload(cnpg_world.op).state == "succeeded"


# --- 18: a takeover after cutover copies from the durable source ------------------------------
@pytest.mark.safeguard("reshard-18")
def test_kill_at_copying_takeover_copies_from_the_source_store(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(world.op.id, runner_state_dir, "step:copying")
    assert warehouse_of(world.op).metadata_store_id == world.target_store.name  # flipped
    backdate(world.op.id)
    runner = run_runner(world.op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "succeeded", op_log(op.id)
    assert catalog_checksums(target_cluster(world), world.catalog.database) == before
    second = lines_of_epoch(op.id, 2)
    assert not any(line.startswith("source recorded: ") for line in second)
    assert any(line.startswith("takeover at step copying: resuming at copying") for line in second)
    assert not any("dropped" in line and "on the target" in line for line in second)


# --- 19: a crash after NOLOGIN, before source_fenced_at ---------------------------------------
@pytest.mark.safeguard("reshard-19")
@pytest.mark.safeguard("reshard-73")
def test_kill_after_nologin_takeover_redoes_the_fence_and_succeeds(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    """Before the cutover a takeover redoes the steps (reshard-73): this op's own NOLOGIN is
    accepted by ``preparing_access`` and re-applied by ``fencing_source``."""
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(world.op.id, runner_state_dir, "after_nologin")
    op = reload(world.op)
    assert op.source_fence_requested_at is not None
    assert op.source_fenced_at is None
    assert role_can_login(world.catalog.cluster, world.catalog.role) is False
    backdate(op.id)
    assert run_runner(op.id, runner_state_dir).proc.returncode == 0
    op = reload(op)
    assert (op.state, op.error) == ("succeeded", ""), op_log(op.id)
    assert op.source_fenced_at is not None
    assert any(
        line.startswith("takeover at step fencing_source (before the cutover): redoing")
        for line in lines_of_epoch(op.id, 2)
    )
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.target_store.name)
    assert catalog_checksums(target_cluster(world), world.catalog.database) == before


# --- 2: takeover at backup_catalog with cancel (real kill) ------------------------------------
@pytest.mark.safeguard("reshard-2")
def test_kill_at_backup_with_cancel_is_cancelled_ready_login_and_prior_restored(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    killed_at(world.op.id, runner_state_dir, "step:backup_catalog")
    assert warehouse_of(world.op).compaction_enabled is False
    ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
    backdate(world.op.id)
    assert run_runner(world.op.id, runner_state_dir).proc.returncode == 0
    op = reload(world.op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator")
    wh = warehouse_of(op)
    assert (wh.state, wh.compaction_enabled) == ("ready", True)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True


# --- 52: cancel after the point of no return ---------------------------------------------------
@pytest.mark.safeguard("reshard-52")
def test_cancel_during_cnpg_copying_is_recorded_not_acted_on(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    runner = start_runner(world.op.id, runner_state_dir, env_extra=pause("step:copying"))
    wait_until(lambda: reload(world.op).step == "copying", 60, "step copying")
    ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
    assert runner.wait(90) == 0, runner.output()
    op = reload(world.op)
    assert (op.state, op.cancel_requested) == ("succeeded", True)
    lines = op_log(op.id)
    assert lines.count(LATE_CANCEL) == 1
    assert "cancel requested: after the point of no return" in lines


@pytest.mark.safeguard("reshard-52")
def test_cancel_during_orphaning_source_of_cnpg_to_external_completes(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    with password_url(world.target.password) as url:
        runner = start_runner(
            world.op.id,
            runner_state_dir,
            env_extra={
                **pause("step:orphaning_source"),
                **with_bucket(world.op.org_id, runner_s3),
            },
            DUCKGRES_RESHARD_PASSWORD_URL=url,
        )
        wait_until(lambda: reload(world.op).step == "orphaning_source", 60, "orphaning_source")
        ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
        assert runner.wait(90) == 0, runner.output()
    op = reload(world.op)
    assert op.state == "succeeded", op_log(op.id)
    assert op_log(op.id).count(LATE_CANCEL) == 1


@pytest.mark.safeguard("reshard-52")
def test_cancel_during_backup_of_cnpg_to_external_is_cancelled(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    Warehouse.objects.filter(org_id=world.op.org_id).update(data_bucket=runner_s3.bucket)
    with password_url(world.target.password) as url:
        runner = start_runner(
            world.op.id,
            runner_state_dir,
            env_extra={**pause("step:backup_catalog"), **runner_s3.env()},
            DUCKGRES_RESHARD_PASSWORD_URL=url,
        )
        wait_until(lambda: reload(world.op).step == "backup_catalog", 60, "backup_catalog")
        ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
        assert runner.wait(90) == 0, runner.output()
    op = reload(world.op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator"), op_log(op.id)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True
    assert "==== reshard report (cancelled) ====" in op_log(op.id)


@pytest.mark.safeguard("reshard-52")
def test_cancel_during_the_cnpg_cutover_wait_flips_back(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    runner = start_runner(world.op.id, runner_state_dir, env_extra=pause("after_flip"))
    wait_until(
        lambda: warehouse_of(world.op).metadata_store_id == world.target_store.name, 60, "flip"
    )
    ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
    assert runner.wait(90) == 0, runner.output()
    op = reload(world.op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator"), op_log(op.id)
    assert op.target_login_ready_at is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before


# --- 22 and 10: a rollback that cannot restore the source must not unblock --------------------
@pytest.mark.safeguard("reshard-22")
@pytest.mark.safeguard("reshard-10")
def test_rollback_with_a_wrong_source_password_stays_blocked(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    wrong = "wrong-" + world.catalog.password[:12]
    # the target stops after submit: pre-flip failure after the source was fenced
    MetadataStore.objects.filter(name=world.target_store.name).update(port=1)
    runner = run_runner(
        world.op.id,
        runner_state_dir,
        env_extra={
            world.catalog.password_var: wrong,
            "DUCKGRES_RESHARD_FLIP_TIMEOUT": "4",
        },
    )
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "failed"
    assert op.recovery_required is True
    assert op.unblocked_at is None
    assert warehouse_of(op).state == "resharding"
    lines = op_log(op.id)
    classified = [line for line in lines if "authentication failed for role" in line]
    assert len(classified) >= 2, lines
    assert any("<the password in secret" in line for line in classified)
    assert any(
        line.startswith("source tenant access recovery failed:") and "last observation" in line
        for line in lines
    )
    text = "\n".join(lines) + runner.output() + op.error
    assert wrong not in text
    assert world.catalog.password not in text


# --- 44 and 45: target identity re-checked in the runner ----------------------------------------
@pytest.mark.safeguard("reshard-44")
def test_external_target_bound_to_another_warehouse_after_submit_fails_before_writes(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    other = new_warehouse(
        catalog=world.target,
        metadata_store_kind="external",
    )
    with password_url(world.target.password) as url:
        runner = run_runner(
            world.op.id,
            runner_state_dir,
            env_extra=with_bucket(world.op.org_id, runner_s3),
            DUCKGRES_RESHARD_PASSWORD_URL=url,
        )
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "failed"
    assert op.error == (
        f"target database {world.target.database} on {world.target.cluster.host}:"
        f"{world.target.cluster.port} is the catalog of another warehouse ({other.org_id})"
    )
    assert op.step == "copying"
    assert catalog_checksums(world.target.cluster, world.target.database) == {}
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)


@pytest.mark.safeguard("reshard-45")
def test_cnpg_target_database_created_by_another_owner_after_submit_is_refused(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    target = target_cluster(world)
    with target.superuser_conn() as conn:
        conn.execute(f'CREATE DATABASE "{world.catalog.database}" OWNER postgres')
    try:
        runner = run_runner(world.op.id, runner_state_dir)
        assert runner.proc.returncode == 0, runner.output()
        op = reload(world.op)
        assert op.state == "failed"
        assert op.error == (
            f"target database {world.catalog.database} on store {world.target_store.name} "
            f"already exists and is owned by postgres, not the tenant role {world.catalog.role} "
            "— refusing to adopt it"
        )
        assert op.target_rendered_at is None
        wh = warehouse_of(op)
        assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
        with target.superuser_conn() as conn:
            row = conn.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
                [world.catalog.database],
            ).fetchone()
        assert row == ("postgres",)
    finally:
        with target.superuser_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{world.catalog.database}" WITH (FORCE)')
    assert database_exists(world.catalog.cluster, world.catalog.database)


# --- 12: keep the source until verified; recover by re-pointing, never copy back --------------
@pytest.mark.safeguard("reshard-12")
def test_external_target_failing_after_the_flip_re_points_at_the_intact_source(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    org = world.op.org_id
    before = world.catalog.row_counts()
    ReshardOperation.objects.filter(id=world.op.id).update(cutover_timeout_seconds=3)
    Warehouse.objects.filter(org_id=org).update(compaction_enabled=True)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE test_binding_writes (id bigserial, kind text, compaction boolean)"
        )
        cursor.execute(
            "CREATE OR REPLACE FUNCTION test_binding_write() RETURNS trigger AS $$ BEGIN "
            "INSERT INTO test_binding_writes (kind, compaction) "
            "VALUES (NEW.metadata_store_kind, NEW.compaction_enabled); RETURN NEW; END $$ "
            # The runner's own login may not write this test table: the recorder runs as its
            # owner (SECURITY DEFINER), as an audit trigger would.
            "LANGUAGE plpgsql SECURITY DEFINER SET search_path = public"
        )
        cursor.execute(
            "CREATE TRIGGER test_binding_write AFTER UPDATE ON duckgres_managed_warehouses "
            "FOR EACH ROW WHEN (OLD.metadata_store_kind IS DISTINCT FROM NEW.metadata_store_kind "
            "OR OLD.compaction_enabled IS DISTINCT FROM NEW.compaction_enabled) "
            "EXECUTE FUNCTION test_binding_write()"
        )
    try:
        with password_url(world.target.password) as url:
            runner = start_runner(
                world.op.id,
                runner_state_dir,
                env_extra={**pause("after_flip", 3), **with_bucket(org, runner_s3)},
                DUCKGRES_RESHARD_PASSWORD_URL=url,
            )
            wait_until(lambda: warehouse_of(world.op).metadata_store_kind == "external", 60, "flip")
            # the external target stops accepting the tenant (its password changed)
            with world.target.cluster.superuser_conn() as conn:
                conn.execute(f"ALTER ROLE \"{world.target.role}\" PASSWORD 'rotated-elsewhere'")
            assert runner.wait(120) == 0, runner.output()
        with connection.cursor() as cursor:
            cursor.execute("SELECT kind, compaction FROM test_binding_writes ORDER BY id")
            writes = cursor.fetchall()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_binding_write ON duckgres_managed_warehouses")
            cursor.execute("DROP FUNCTION test_binding_write()")
            cursor.execute("DROP TABLE test_binding_writes")
    op = reload(world.op)
    assert op.state == "failed", op_log(op.id)
    assert op.error.startswith("external target did not accept the new binding within 3 s")
    assert op.external_verified_at is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind, wh.metadata_store_id) == (
        "ready",
        "cnpg",
        world.source_store.name,
    )
    assert database_exists(world.catalog.cluster, world.catalog.database)  # no DROP on the source
    assert world.catalog.row_counts() == before
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True
    lines = op_log(op.id)
    assert sum(line.startswith("copy complete: ") for line in lines) == 1  # exactly one copy
    # binding writes: pause compaction, external, source, restore compaction
    assert writes == [("cnpg", False), ("external", False), ("cnpg", False), ("cnpg", True)]


# --- 7 (runner part): no pulled password → fails at copying, nothing flipped -------------------
@pytest.mark.safeguard("reshard-7")
def test_cnpg_to_external_without_the_password_fails_at_copying(
    external_target_world: ExternalTargetWorld, runner_state_dir: Any, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    runner = run_runner(
        world.op.id, runner_state_dir, env_extra=with_bucket(world.op.org_id, runner_s3)
    )
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert (op.state, op.step) == ("failed", "copying")
    assert op.error == (
        "external target password is not available to this runner (takeover after a crash?) "
        "— cancel and re-run the operation"
    )
    assert op.tables_copied == 0
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert catalog_checksums(world.target.cluster, world.target.database) == {}
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True


# --- takeover at cleaning_up before the commit point: finalize, never drop ----------------------
def test_takeover_at_cleaning_up_without_the_commit_point_finalizes_without_dropping(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    killed_at(world.op.id, runner_state_dir, "step:cleaning_up")
    assert reload(world.op).source_drop_committed_at is None
    backdate(world.op.id)
    assert run_runner(world.op.id, runner_state_dir).proc.returncode == 0
    op = reload(world.op)
    assert op.state == "succeeded", op_log(op.id)
    assert op.source_dropped_at is None
    assert database_exists(world.catalog.cluster, world.catalog.database)  # cruft, not dropped
    assert warehouse_of(op).metadata_store_id == world.target_store.name
    assert (
        f"source database {world.catalog.database} on store {world.source_store.name} was not "
        "dropped; drop it manually"
    ) in lines_of_epoch(op.id, 2)


# --- 13: the per-op cutover timeout bounds only the target waits --------------------------------
@pytest.mark.safeguard("reshard-13")
def test_short_cutover_timeout_fails_a_slow_target_but_fence_waits_keep_the_default(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    ReshardOperation.objects.filter(id=world.op.id).update(cutover_timeout_seconds=1)
    # tenant logins on the target go through a pooler that is not there: never ready
    MetadataStore.objects.filter(name=world.target_store.name).update(
        pooler_host="127.0.0.1", pooler_port=1
    )
    runner = run_runner(world.op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "failed"
    assert op.error.startswith(
        f"target shard {world.target_store.name} did not become ready within 1 s; last "
        "observation: probe of store"
    )
    lines = op_log(op.id)
    assert any(
        line.startswith("waiting up to 900 s for tenant role") and "NOLOGIN" in line
        for line in lines
    )
    assert any(line.startswith("waiting up to 900 s for source tenant access") for line in lines)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True


@pytest.mark.safeguard("reshard-52")
def test_cancel_during_the_cutover_wait_of_external_to_cnpg_flips_back_to_the_external_source(
    external_source_world: ExternalSourceWorld, runner_state_dir: Any
) -> None:
    world = external_source_world
    runner = start_runner(world.op.id, runner_state_dir, env_extra=pause("after_flip"))
    wait_until(lambda: warehouse_of(world.op).metadata_store_kind == "cnpg", 60, "flip")
    ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
    assert runner.wait(90) == 0, runner.output()
    op = reload(world.op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator"), op_log(op.id)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind, wh.metadata_store_host) == (
        "ready",
        "external",
        world.catalog.cluster.host,
    )
    assert wh.metadata_store_port == world.catalog.cluster.port
    lines = op_log(op.id)
    assert "rollback: binding flipped back to the source" in lines
    assert any(line.startswith("rollback: source tenant access verified") for line in lines)
    # the rendered target tenant is NOLOGIN again; the external source was never touched
    target = StoreCluster("target", world.target_store.host, world.target_store.port)
    assert role_can_login(target, world.catalog.role) is False
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True


# --- 3(c): never write a binding the data plane cannot use --------------------------------------
@pytest.mark.safeguard("reshard-3")
def test_source_store_row_removed_mid_op_leaves_the_warehouse_blocked(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    world = cnpg_world
    runner = start_runner(world.op.id, runner_state_dir, env_extra=pause("after_flip"))
    wait_until(
        lambda: warehouse_of(world.op).metadata_store_id == world.target_store.name, 60, "flip"
    )
    MetadataStore.objects.filter(name=world.source_store.name).delete()
    ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
    assert runner.wait(90) == 0, runner.output()
    op = reload(world.op)
    assert op.state == "cancelled"
    assert op.recovery_required is True
    assert op.unblocked_at is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("resharding", world.target_store.name)
    lines = op_log(op.id)
    assert any(
        line.startswith("rollback: not re-pointing the binding (source store") for line in lines
    )
    assert any(
        line.startswith("warehouse intentionally left in the resharding state: ") for line in lines
    )


# --- takeover after a flip-back: never resume forward onto the source --------------------------
@pytest.mark.safeguard("reshard-18")
def test_takeover_after_a_completed_flip_back_does_not_resume_and_never_drops_the_source(
    cnpg_world: CnpgWorld, runner_state_dir: Any
) -> None:
    """A runner rolled back (binding re-pointed at the source) but died before its terminal
    write; ``step`` still says ``copying``. The takeover must not copy from, and then drop, the
    catalog the binding names: it rolls back again (idempotently) and the source survives."""
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed_at(world.op.id, runner_state_dir, "step:copying")
    op = reload(world.op)
    assert op.step == "copying"
    # What the dead runner's rollback had already committed: the flip-back to the source.
    Warehouse.objects.filter(org_id=op.org_id).update(
        metadata_store_kind="cnpg",
        metadata_store=MetadataStore.objects.get(name=op.from_shard),
        metadata_store_database=op.source_database,
        metadata_store_user=op.source_user,
        metadata_store_password_ref=op.source_password_secret_ref,
    )
    backdate(op.id)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "failed", lines
    assert "cannot be resumed safely" in op.error
    assert op.source_drop_committed_at is None
    assert op.source_dropped_at is None
    assert database_exists(world.catalog.cluster, world.catalog.database), "source kept"
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", op.from_shard)
