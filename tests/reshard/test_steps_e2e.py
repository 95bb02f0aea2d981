"""The step machine end to end: a real runner process on a pending op, per direction, against
the store clusters (5433 source, 5434 target) and a moto S3 server for the backup."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.models import Warehouse
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

__all__ = [
    "external_source_world",
    "external_target_world",
    "runner_moto_server",
    "runner_s3",
]  # fixtures used here

CNPG_TO_CNPG = [
    "blocking",
    "preparing_access",
    "draining",
    "fencing_source",
    "pausing_compaction",
    "backup_catalog",
    "cutover",
    "copying",
    "verifying",
    "cleaning_up",
    "finalizing",
]


def _with_bucket(warehouse: Warehouse, s3: RunnerS3) -> None:
    Warehouse.objects.filter(id=warehouse.id).update(data_bucket=s3.bucket)


@pytest.mark.safeguard("reshard-55")
def test_cnpg_to_cnpg_end_to_end(cnpg_world: CnpgWorld, runner_state_dir, runner_s3: RunnerS3):
    world = cnpg_world
    _with_bucket(world.warehouse, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    assert before
    runner = run_runner(world.op.id, runner_state_dir, env_extra=runner_s3.env())
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines), runner.output())
    assert runner.proc.returncode == 0
    assert [s for s, _, _ in step_rows(op.id)] == CNPG_TO_CNPG
    assert all(o == "ok" for _, o, _ in step_rows(op.id))
    target = world.target_store
    after = catalog_checksums(target_cluster(world), world.catalog.database)
    assert after == before
    wh = warehouse_of(op)
    assert wh.state == "ready"
    assert wh.status_message == "metadata-store reshard complete"
    assert wh.metadata_store_id == target.name
    assert wh.metadata_store_database == world.catalog.database
    assert wh.compaction_enabled is True  # prior restored
    # milestones
    for name in (
        "source_access_verified_at",
        "source_fence_requested_at",
        "source_fenced_at",
        "target_rendered_at",
        "target_login_ready_at",
        "source_drop_committed_at",
        "source_dropped_at",
        "unblocked_at",
        "finished_at",
    ):
        assert getattr(op, name) is not None, name
    assert op.tables_copied == len(before)
    assert op.rows_copied > 0
    assert op.bytes_copied > 0
    assert op.backup_s3_uri.startswith(f"s3://{runner_s3.bucket}/_reshard_catalog_backups/")
    assert op.backup_bytes > 0
    assert runner_s3.keys()
    # live progress of the long steps (safeguard 55): backup and copy keys, database time
    assert op.progress["bytes_dumped"] == op.backup_bytes, "the final backup figure is recorded"
    assert op.progress["tables_total"] == op.tables_copied
    assert op.progress["tables_done"] == op.tables_copied, "the final copy figure is recorded"
    assert op.progress["rows_copied"] == op.rows_copied
    assert op.progress["updated_at"]
    # source dropped, its tenant role stays NOLOGIN; target tenant logs in
    assert not database_exists(world.catalog.cluster, world.catalog.database)
    assert role_can_login(world.catalog.cluster, world.catalog.role) is False
    assert role_can_login(target_cluster(world), world.catalog.role) is True
    with target_cluster(world).connect(
        world.catalog.role, world.catalog.password, world.catalog.database
    ) as conn:
        assert conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone()
    # report and key lines
    assert "==== reshard report (succeeded) ====" in lines
    assert any(line.startswith("copied: ") for line in lines)
    assert any(line.startswith("DuckLake verification passed: snapshot ") for line in lines)
    assert "commit point reached: all subsequent failures roll forward" in lines
    assert any(line.startswith("catalog backup complete: s3://") for line in lines)
    assert world.catalog.password not in "\n".join(lines) + runner.output()


def target_cluster(world: CnpgWorld) -> Any:
    from tests.fixtures.stores import StoreCluster

    return StoreCluster("target", world.target_store.host, world.target_store.port)


EXTERNAL_TO_CNPG = [
    "blocking",
    "draining",
    "pausing_compaction",
    "backup_catalog",
    "cutover",
    "copying",
    "verifying",
    "cleaning_up",
    "finalizing",
]
CNPG_TO_EXTERNAL = [
    "blocking",
    "preparing_access",
    "draining",
    "fencing_source",
    "pausing_compaction",
    "backup_catalog",
    "copying",
    "verifying",
    "orphaning_source",
    "cutover",
    "verifying_external",
    "cleaning_up",
    "finalizing",
]


def test_external_to_cnpg_end_to_end(
    external_source_world: ExternalSourceWorld, runner_state_dir, runner_s3: RunnerS3
):
    world = external_source_world
    _with_bucket(world.warehouse, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    runner = run_runner(world.op.id, runner_state_dir, env_extra=runner_s3.env())
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines), runner.output())
    assert [s for s, _, _ in step_rows(op.id)] == EXTERNAL_TO_CNPG
    from tests.fixtures.stores import StoreCluster

    target = StoreCluster("target", world.target_store.host, world.target_store.port)
    assert catalog_checksums(target, world.catalog.database) == before
    # the external source is never touched
    assert catalog_checksums(world.catalog.cluster, world.catalog.database) == before
    assert role_can_login(world.catalog.cluster, world.catalog.role) is True
    assert op.source_dropped_at is None
    assert op.source_fence_requested_at is None
    assert op.source_drop_committed_at is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind, wh.metadata_store_id) == (
        "ready",
        "cnpg",
        world.target_store.name,
    )
    assert wh.metadata_store_host == ""
    assert "external source left untouched (never deleted)" in lines
    assert "external source: left untouched" in lines
    assert "==== reshard report (succeeded) ====" in lines
    assert op.backup_s3_uri


@pytest.mark.safeguard("reshard-44")
def test_cnpg_to_external_end_to_end(
    external_target_world: ExternalTargetWorld, runner_state_dir, runner_s3: RunnerS3
):
    world = external_target_world
    _with_bucket(world.warehouse, runner_s3)
    before = catalog_checksums(world.catalog.cluster, world.catalog.database)
    # An empty external database is adopted (one holding anything is refused, even the same
    # org's leftovers: tests/reshard/test_target_claim.py, safeguard 108).
    with password_url(world.target.password) as url:
        runner = run_runner(
            world.op.id,
            runner_state_dir,
            DUCKGRES_RESHARD_PASSWORD_URL=url,
            env_extra=runner_s3.env(),
        )
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines), runner.output())
    assert [s for s, _, _ in step_rows(op.id)] == CNPG_TO_EXTERNAL
    assert catalog_checksums(world.target.cluster, world.target.database) == before
    assert not database_exists(world.catalog.cluster, world.catalog.database)
    assert op.external_verified_at is not None
    assert op.source_dropped_at is not None
    assert op.target_rendered_at is None  # no cnpg target to render
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind, wh.metadata_store_id) == ("ready", "external", None)
    assert (wh.metadata_store_host, wh.metadata_store_port) == (
        world.target.cluster.host,
        world.target.cluster.port,
    )
    assert wh.metadata_store_database == world.target.database
    assert wh.compaction_enabled is False  # prior false restored exactly
    assert any(line.startswith("source catalog retained on ") for line in lines)
    assert "==== reshard report (succeeded) ====" in lines
    assert world.target.password not in "\n".join(lines) + runner.output()
