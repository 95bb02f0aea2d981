"""Faults leave nothing behind (safeguards reshard-74, 75, 76): open backup uploads are aborted
on every terminal path and by the janitor's sweep; a rollback or ``reshard_recover --execute``
drops what a copy killed part-way wrote, decided by re-reading the target.

Real runner processes killed with the test-only hooks of ``reshard.engines.testhooks``
(``backup_part_uploaded``: a part stored, the upload open; ``copy_table_done``: one table
committed on the target, the copy unfinished), a real S3 server (moto over HTTP) and the real
store clusters."""

from __future__ import annotations

import io
import signal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from duckgres_admin.models import ReshardLogEntry, ReshardOperation, Warehouse
from reshard.engines import uploads
from reshard.engines.backup import KEY_PREFIX
from tests.fixtures.janitor import FakeLauncher, janitor_env, make_janitor
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.runner import (
    CnpgWorld,
    ExternalTargetWorld,
    RunnerS3,
    catalog_checksums,
    external_target_world,
    op_log,
    password_url,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
    warehouse_of,
)
from tests.fixtures.stores import StoreCluster, ducklake_tables

__all__ = ["external_target_world", "janitor_env", "runner_moto_server", "runner_s3"]

pytestmark = pytest.mark.faults


def hooks(point: str) -> dict[str, str]:
    return {"DUCKGRES_RESHARD_TEST_HOOKS": "1", "DUCKGRES_RESHARD_TEST_KILL_AT": point}


def with_bucket(org_id: str, s3: RunnerS3) -> dict[str, str]:
    Warehouse.objects.filter(org_id=org_id).update(data_bucket=s3.bucket)
    return s3.env()


def client(s3: RunnerS3) -> Any:
    return s3.client()


def open_uploads(s3: RunnerS3, prefix: str = KEY_PREFIX) -> list[str]:
    return s3.open_uploads(prefix)


def killed(op_id: int, state_dir: Path, point: str, env: dict[str, str], **extra: str) -> None:
    runner = run_runner(op_id, state_dir, env_extra={**hooks(point), **env, **extra})
    assert runner.proc.returncode == -signal.SIGKILL, runner.output()


def backdate(op_id: int, **fields: Any) -> None:
    sets = "".join(f", {name} = %s" for name in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET heartbeat_at = now() - interval '10 minutes'"
            f"{sets} WHERE id = %s",
            [*fields.values(), op_id],
        )


def s3_settings(settings: Any, monkeypatch: pytest.MonkeyPatch, s3: RunnerS3) -> None:
    """This process (the janitor) reaches the S3 server like the control worker does."""
    settings.DUCKGRES_S3_ENDPOINT_URL = s3.endpoint_url
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def target_tables(cluster: Any, database: str) -> list[str]:
    return list(ducklake_tables(cluster, database))


def bucket_warehouse(store: Any, bucket: str) -> Warehouse:
    """A cnpg-bound warehouse row with a data bucket (no catalog: the sweep never connects)."""
    name = unique("cat")
    return new_warehouse(
        store=store,
        data_bucket=bucket,
        metadata_store_database=name,
        metadata_store_user=name,
        metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
    )


def target_cluster(world: CnpgWorld) -> StoreCluster:
    return StoreCluster("target", world.target_store.host, world.target_store.port)


# --- 74: every terminal path aborts the op's open uploads ------------------------------------
@pytest.mark.safeguard("reshard-74")
def test_kill_mid_backup_then_rollback_leaves_no_open_upload(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = cnpg_world
    env = with_bucket(world.op.org_id, runner_s3)
    prefix = uploads.op_prefix(world.op.id)
    killed(world.op.id, runner_state_dir, "backup_part_uploaded", env)
    assert len(open_uploads(runner_s3, prefix)) == 1  # what the killed runner left open
    ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
    backdate(world.op.id)
    runner = run_runner(world.op.id, runner_state_dir, env_extra=env)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "cancelled", op_log(op.id)
    assert open_uploads(runner_s3, prefix) == []
    where = f"s3://{runner_s3.bucket}/{prefix}"
    assert any(line.startswith(f"aborted 1 open backup upload(s) under {where}: ") for line in
               op_log(op.id)), op_log(op.id)  # fmt: skip


@pytest.mark.safeguard("reshard-74")
def test_a_successful_operation_reports_no_open_upload(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = cnpg_world
    env = with_bucket(world.op.org_id, runner_s3)
    # An upload a lost attempt of this op left (as a kill mid-backup does), and one of another op.
    s3 = client(runner_s3)
    mine = f"{uploads.op_prefix(world.op.id)}20260101T000000Z.dump"
    other = f"{KEY_PREFIX}op-{world.op.id}0-20260101T000000Z.dump"  # op-<id>0-: never ours
    for key in (mine, other):
        s3.create_multipart_upload(Bucket=runner_s3.bucket, Key=key)
    runner = run_runner(world.op.id, runner_state_dir, env_extra=env)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "succeeded", op_log(op.id)
    assert open_uploads(runner_s3) == [other]
    assert op.backup_s3_uri  # the backup itself completed and stays


@pytest.mark.safeguard("reshard-74")
def test_the_janitors_force_fail_aborts_the_ops_open_uploads(
    cnpg_world: CnpgWorld,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    janitor_env: None,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = cnpg_world
    env = with_bucket(world.op.org_id, runner_s3)
    prefix = uploads.op_prefix(world.op.id)
    killed(world.op.id, runner_state_dir, "backup_part_uploaded", env)
    assert len(open_uploads(runner_s3, prefix)) == 1
    backdate(world.op.id, respawn_attempts=3)
    s3_settings(settings, monkeypatch, runner_s3)
    report = make_janitor(FakeLauncher()).reconcile()
    assert f"force-fail {world.op.id}" in report.actions
    op = reload(world.op)
    assert op.state == "failed"
    assert open_uploads(runner_s3, prefix) == []
    lines = list(
        ReshardLogEntry.objects.filter(operation_id=op.id, source="janitor").values_list(
            "message", flat=True
        )
    )
    assert any(line.startswith("aborted 1 open backup upload(s) under ") for line in lines), lines


# --- 75: the sweep aborts what a lost process left, and only that ----------------------------
@pytest.mark.safeguard("reshard-75")
def test_the_upload_sweep_aborts_only_uploads_of_terminal_operations(
    transactional_db: None,
    runner_s3: RunnerS3,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    store_clusters: Any,
) -> None:
    s3_settings(settings, monkeypatch, runner_s3)
    store = new_store(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = bucket_warehouse(store, runner_s3.bucket)
    other_wh = bucket_warehouse(store, runner_s3.bucket)
    done = new_op(warehouse, to_store=target, state="failed")
    active = new_op(other_wh, to_store=target, state="running")
    foreign_id = active.id + 1000  # an id no operation here has (another installation's)
    keys = {
        "done": f"{uploads.op_prefix(done.id)}20260101T000000Z.dump",
        "active": f"{uploads.op_prefix(active.id)}20260101T000000Z.dump",
        "foreign": f"{uploads.op_prefix(foreign_id)}20260101T000000Z.dump",
        "odd": f"{KEY_PREFIX}not-an-operation.dump",
    }
    s3 = client(runner_s3)
    for key in keys.values():
        s3.create_multipart_upload(Bucket=runner_s3.bucket, Key=key)

    # Leadership unproven: nothing is aborted.
    report = uploads.sweep(lambda: False)
    assert report.aborted == []
    assert report.truncated
    assert len(open_uploads(runner_s3)) == 4

    report = uploads.sweep(lambda: True)
    assert report.aborted == [f"s3://{runner_s3.bucket}/{keys['done']}"]
    assert (report.left_active, report.left_foreign, report.errors) == (1, 2, [])
    assert open_uploads(runner_s3) == sorted([keys["active"], keys["foreign"], keys["odd"]])
    assert op_log(done.id) == [
        "upload sweep: aborted an open backup upload a lost process left: "
        f"s3://{runner_s3.bucket}/{keys['done']}"
    ]
    assert op_log(active.id) == []


@pytest.mark.safeguard("reshard-75")
def test_the_leader_janitor_sweeps_once_per_interval(
    transactional_db: None,
    runner_s3: RunnerS3,
    janitor_env: None,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    store_clusters: Any,
) -> None:
    from reshard.control import janitor

    s3_settings(settings, monkeypatch, runner_s3)
    settings.DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS = 3600
    monkeypatch.setattr(janitor, "_last_sweep", None)
    warehouse = bucket_warehouse(new_store(store_clusters.source), runner_s3.bucket)
    done = new_op(warehouse, to_store=new_store(store_clusters.target), state="cancelled")
    key = f"{uploads.op_prefix(done.id)}20260101T000000Z.dump"
    s3 = client(runner_s3)
    s3.create_multipart_upload(Bucket=runner_s3.bucket, Key=key)
    leader = make_janitor(FakeLauncher())
    first = leader.reconcile()
    assert f"abort-upload s3://{runner_s3.bucket}/{key}" in first.actions
    assert open_uploads(runner_s3) == []
    s3.create_multipart_upload(Bucket=runner_s3.bucket, Key=key)
    second = leader.reconcile()  # the same leader, within the interval
    assert second.leader
    assert not any(a.startswith("abort-upload") for a in second.actions)
    assert open_uploads(runner_s3) == [key]


# --- 76: a rollback drops what a killed copy wrote, read from the target ----------------------
@pytest.mark.safeguard("reshard-76")
def test_kill_mid_copy_then_rollback_drops_the_partial_target_tables(
    external_target_world: ExternalTargetWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    env = with_bucket(world.op.org_id, runner_s3)
    with password_url(world.target.password) as url:
        killed(
            world.op.id, runner_state_dir, "copy_table_done", env, DUCKGRES_RESHARD_PASSWORD_URL=url
        )
        partial = target_tables(world.target.cluster, world.target.database)
        assert partial  # the killed copy left tables ...
        assert reload(world.op).tables_copied == 0  # ... its counter never recorded
        # cnpg→external copies before its cancel cutoff: the cancel rolls back
        ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
        backdate(world.op.id)
        runner = run_runner(
            world.op.id, runner_state_dir, env_extra=env, DUCKGRES_RESHARD_PASSWORD_URL=url
        )
    assert runner.proc.returncode == 0, runner.output()
    op = reload(world.op)
    assert op.state == "cancelled", op_log(op.id)
    assert target_tables(world.target.cluster, world.target.database) == []
    lines = op_log(op.id)
    dropped = [line for line in lines if line.startswith("rollback: dropped ")]
    assert len(dropped) == 1, lines
    assert "partial target table(s) on database" in dropped[0], lines
    assert warehouse_of(op).metadata_store_id == world.source_store.name


@pytest.mark.safeguard("reshard-76")
def test_kill_mid_copy_then_reshard_recover_drops_the_partial_target_tables(
    cnpg_world: CnpgWorld, runner_state_dir: Path, settings: Any, tmp_path: Path
) -> None:
    world = cnpg_world
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    killed(world.op.id, runner_state_dir, "copy_table_done", {})
    cluster = target_cluster(world)
    assert target_tables(cluster, world.catalog.database)  # partial tables on the target
    assert reload(world.op).tables_copied == 0
    backdate(world.op.id)
    with connection.cursor() as cursor:  # as the janitor's force-fail leaves it
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET state = 'failed', recovery_required = true, "
            "error = 'runner could not be kept alive', finished_at = now() WHERE id = %s",
            [world.op.id],
        )
    settings.DUCKGRES_RESHARD_LOCAL_STATE_DIR = str(tmp_path / "no-runners")
    out = io.StringIO()
    call_command("reshard_recover", str(world.op.id), stdout=out)
    plan = out.getvalue()
    assert "drop every ducklake_* table the target database" in plan, plan
    out = io.StringIO()
    call_command("reshard_recover", str(world.op.id), "--execute", stdout=out)
    op = reload(world.op)
    assert op.recovery_outcome == "rolled_back", out.getvalue()
    assert target_tables(cluster, world.catalog.database) == []
    lines = op_log(op.id)
    assert any(line.startswith("rollback: dropped ") for line in lines), lines
    nologin = [line for line in lines if "set NOLOGIN on store" in line]
    assert nologin, lines
    assert "is left in place holding nothing (" in nologin[0], lines
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", world.source_store.name)
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
