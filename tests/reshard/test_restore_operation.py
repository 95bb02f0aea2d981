"""Restore as an operation (docs/restore.md; safeguards reshard-102, reshard-103), against real
services: real runner processes, the real store clusters, a real S3 server (moto over HTTP).

A real reshard moves a catalog from store A to store B and leaves its backup in S3 (with the
DuckLake fingerprint it verified). The tenant then writes on B. A restore of that backup onto A
brings the catalog back to the backup's state: the binding names A again, the catalog on A is
the backup's (not B's newer one), B's catalog was backed up before it was dropped. A runner
SIGKILLed in the middle of ``pg_restore`` is taken over and the restore ends consistent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import BackupVerification, ReshardOperation, Warehouse
from reshard.start import restores
from tests.fixtures.admin import admin_client
from tests.fixtures.backups_listing import warehouse_with_bucket
from tests.fixtures.faults import backdate
from tests.fixtures.restores import moved, restore_request, snapshots, start_restore
from tests.fixtures.rows import new_op
from tests.fixtures.runner import (
    RunnerS3,
    database_exists,
    op_log,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
    start_runner,
)

__all__ = ["admin_client", "moved", "runner_moto_server", "runner_s3"]

pytestmark = pytest.mark.faults


def _start(moved: dict[str, Any]) -> ReshardOperation:
    return start_restore(moved, moved["world"].source_store.name)


@pytest.mark.safeguard("reshard-102")
def test_a_restore_brings_the_backups_catalog_back_onto_another_store(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3, store_clusters: Any
) -> None:
    world = moved["world"]
    plan = restores.restore_dry_run(
        world.op.org_id, moved["key"], restore_request(world.source_store.name)
    )
    assert plan["kind"] == "restore"
    assert plan["cancel_cutoff"] == (
        "a restore onto another store can be cancelled until cleaning_up, when the replaced "
        "catalog is dropped"
    )
    assert plan["restore"]["made_by_op"] == moved["op"].id
    assert "fingerprint operation" in plan["restore"]["verification"]
    assert plan["backup"]["mandatory"] is True
    assert all(entry["ok"] for entry in plan["preflight"]), plan["preflight"]

    op = _start(moved)
    assert (op.kind, op.state, op.to_shard) == ("restore", "pending", world.source_store.name)
    assert op.restore_fingerprint == moved["op"].catalog_fingerprint
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, runner.output(), "\n".join(lines))
    # The binding is on A again, with the backup's catalog (not B's newer snapshot).
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.state) == (world.source_store.name, "ready")
    assert snapshots(world.catalog) == moved["backup_snapshots"]
    assert not database_exists(store_clusters.target, world.catalog.database), "B's is dropped"
    # ... after B's catalog (with its newer snapshot) was backed up.
    assert op.backup_s3_uri.startswith(f"s3://{runner_s3.bucket}/")
    assert op.catalog_fingerprint is not None
    assert op.catalog_fingerprint["snapshot_id"] == moved["backup_snapshots"] + 1
    assert any(line.startswith("restoring s3://") for line in lines)
    assert any(line.startswith("DuckLake verification of the restore matches") for line in lines)
    assert any(line.startswith("restore complete: ") for line in lines)


@pytest.mark.safeguard("reshard-103")
def test_a_restore_only_takes_the_orgs_own_backup_onto_another_store(
    moved: dict[str, Any], runner_s3: RunnerS3
) -> None:
    world = moved["world"]
    org = world.op.org_id
    other = warehouse_with_bucket(runner_s3.bucket)
    foreign_op = new_op(other, to_store=world.target_store, state="succeeded")
    foreign_key = moved["key"].replace(f"op-{moved['op'].id}-", f"op-{foreign_op.id}-")
    runner_s3.client().put_object(Bucket=runner_s3.bucket, Key=foreign_key, Body=b"PGDMP")

    def refused(key: str, store: str) -> ServiceError:
        with pytest.raises(ServiceError) as caught:
            restores.restore_start(org_id=org, key=key, request=restore_request(store), actor="t")
        return caught.value

    shared = refused(foreign_key, world.source_store.name)
    assert shared.status == 404, "another warehouse's backup in the same bucket"
    assert "is not a recorded backup of this warehouse" in shared.message
    outside = refused("elsewhere/op-1.dump", world.source_store.name)
    assert outside.status == 400
    BackupVerification.objects.create(
        org_id=org, bucket=runner_s3.bucket, key=moved["key"], op_id=moved["op"].id,
        result="failed", detail="pg_restore exited with status 1", store="scratch",
    )  # fmt: skip
    failed = refused(moved["key"], world.source_store.name)
    assert failed.status == 409
    assert "restore test of this backup failed (pg_restore exited with status 1)" in failed.message
    assert ReshardOperation.objects.filter(org_id=org, kind="restore").count() == 0


@pytest.mark.safeguard("reshard-102")
def test_a_runner_killed_mid_pg_restore_is_taken_over_and_ends_consistent(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3, store_clusters: Any
) -> None:
    world = moved["world"]
    op = _start(moved)
    hooks = {
        "DUCKGRES_RESHARD_TEST_HOOKS": "1",
        "DUCKGRES_RESHARD_TEST_KILL_AT": "restore_chunk_written",
    }
    killed = start_runner(op.id, runner_state_dir, env_extra={**runner_s3.env(), **hooks})
    assert killed.wait(180) == -9, killed.output()
    op = reload(op)
    assert (op.state, op.step) == ("running", "copying"), op.error
    backdate(op.id)  # the janitor's view: a runner that stopped heartbeating
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, runner.output(), "\n".join(lines))
    assert sum(line.startswith("restoring s3://") for line in lines) == 2, "restored again"
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert wh.metadata_store_id == world.source_store.name
    assert snapshots(world.catalog) == moved["backup_snapshots"]
    assert not database_exists(store_clusters.target, world.catalog.database)


@pytest.mark.safeguard("reshard-102")
def test_the_admin_plans_then_starts_a_restore(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3, admin_client: Any
) -> None:
    world = moved["world"]
    org, store = world.op.org_id, world.source_store.name
    backups_page = admin_client.get(f"/admin/duckgres_admin/warehouse/{org}/backups/")
    page = f"/admin/duckgres_admin/warehouse/{org}/restore/"
    assert f"{page}?key=" in backups_page.content.decode(), "each backup links its restore"
    form = {"backup_key": moved["key"], "cnpg_shard": store, "drain_timeout_seconds": "1800"}
    planned = admin_client.post(page, {**form, "stage": "plan"})
    html = planned.content.decode()
    assert planned.status_code == 200
    assert 'id="restore-plan"' in html
    assert f"made by operation {moved['op'].id}" in html
    assert 'id="confirm-restore"' in html, "every preflight check passed"
    assert not ReshardOperation.objects.filter(kind="restore").exists(), "a plan creates nothing"
    started = admin_client.post(page, {**form, "stage": "start"})
    op = ReshardOperation.objects.get(kind="restore", org_id=org)
    assert started.status_code == 302
    assert started["Location"].endswith(f"/reshardoperation/{op.id}/change/")
    run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    detail = admin_client.get(f"/admin/duckgres_admin/reshardoperation/{op.id}/change/")
    assert reload(op).state == "succeeded"
    assert f"restore of {moved['key']}" in detail.content.decode()
    in_place = admin_client.post(page, {**form, "cnpg_shard": store, "stage": "plan"})
    assert f"in place on store {store}" in in_place.content.decode(), "now on A: in place"


@pytest.mark.safeguard("reshard-103")
def test_an_object_replaced_after_the_start_is_not_restored(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    """The start records the object's ETag; the runner reads it only while it is unchanged,
    so a backup overwritten in between fails the restore, which rolls back."""
    world = moved["world"]
    op = _start(moved)
    assert op.restore_backup_bucket == runner_s3.bucket
    assert op.restore_backup_etag
    runner_s3.client().put_object(Bucket=runner_s3.bucket, Key=moved["key"], Body=b"PGDMP other")
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "failed", (runner.output(), "\n".join(lines))
    assert "could not read the backup" in op.error, op.error
    assert "PreconditionFailed" in op.error or "412" in op.error, op.error
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.state) == (world.target_store.name, "ready"), "rolled back"
    assert snapshots(moved["on_b"]) == moved["backup_snapshots"] + 1, "B's catalog untouched"


@pytest.mark.safeguard("reshard-107")
def test_a_cancel_of_a_restore_onto_another_store_during_copying_rolls_back(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3, store_clusters: Any
) -> None:
    """Nothing is irreversible before the replaced catalog's drop: a cancel while pg_restore
    runs (the target login long ready) is answered 202, kills pg_restore and rolls back — the
    binding names B again with B's catalog intact, the partial restore on A is dropped."""
    import time

    from reshard.start import operations

    world = moved["world"]
    op = _start(moved)
    hooks = {
        "DUCKGRES_RESHARD_TEST_HOOKS": "1",
        "DUCKGRES_RESHARD_TEST_PAUSE_AT": "restore_chunk_written",
        "DUCKGRES_RESHARD_TEST_PAUSE_SECONDS": "30",
    }
    runner = start_runner(op.id, runner_state_dir, env_extra={**runner_s3.env(), **hooks})
    deadline = time.monotonic() + 120
    while reload(op).step != "copying" or not any(
        line.startswith("restoring s3://") for line in op_log(op.id)
    ):
        assert time.monotonic() < deadline, runner.output()
        time.sleep(0.2)
    assert reload(op).target_login_ready_at is not None, "past the reshard's cutoff"
    outcome = operations.reshard_op_cancel(op_id=op.id, actor="t")
    assert (outcome.status, outcome.body) == (202, {"cancel_requested": True})
    assert runner.wait(120) == 0, runner.output()
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "cancelled", (op.error, "\n".join(lines))
    assert not any("after the point of no return" in line for line in lines)
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.metadata_store_database, wh.state) == (
        world.target_store.name,
        world.catalog.database,
        "ready",
    )
    assert snapshots(moved["on_b"]) == moved["backup_snapshots"] + 1, "B's catalog is intact"
    assert database_exists(store_clusters.target, world.catalog.database)
    with store_clusters.source.superuser_conn(world.catalog.database) as conn:
        left = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert left == (0,), "the partial restore on A was dropped"
