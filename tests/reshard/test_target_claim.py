"""A target database is adopted only empty, and a rollback drops only what its operation
created (docs/restore.md "What a rollback drops"; safeguard reshard-108), against real
services: real runner processes, the real store clusters, a real S3 server (moto over HTTP).

The situation a user met: the warehouse was moved away from store A (its database there
dropped, its role left NOLOGIN); later a database of the same name, owned by the tenant role,
appeared on A holding two tables of someone's (``public.operator_notes`` and a planted
``public.ducklake_inlined_data_999_999``, one row each). A restore onto A used to pass every
check, fail inside the window on ``pg_restore --clean`` and then drop the planted table. Now the
dry run and the start refuse such a target naming what it holds, the runner refuses to adopt one
that appeared after the start, and no rollback or recovery drops a table in a database its
operation did not create or adopt empty.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from psycopg import sql

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.start import restores
from tests.fixtures.faults import backdate
from tests.fixtures.restores import moved, restore_request, snapshots, start_restore
from tests.fixtures.runner import (
    ExternalTargetWorld,
    RunnerS3,
    external_target_world,
    op_log,
    password_url,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
)
from tests.fixtures.stores import StoreCluster
from tests.fixtures.strangers import plant_tables, strangers_intact

__all__ = ["external_target_world", "moved", "runner_moto_server", "runner_s3"]

pytestmark = [pytest.mark.faults, pytest.mark.safeguard("reshard-108")]


def _plant(cluster: StoreCluster, database: str, owner: str) -> None:
    """A database of that name owned by the tenant role, holding the strangers' tables."""
    with cluster.superuser_conn() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(owner)
            )
        )
    plant_tables(cluster, database, owner)


def test_a_restore_onto_a_stale_database_is_refused_by_the_dry_run_and_the_start(
    moved: dict[str, Any],
) -> None:
    world = moved["world"]
    cluster, org = world.catalog.cluster, world.op.org_id
    _plant(cluster, world.catalog.database, world.catalog.role)
    request = restore_request(world.source_store.name)

    plan = restores.restore_dry_run(org, moved["key"], request)
    checks = {entry["check"]: entry for entry in plan["preflight"]}
    empty = checks["target_database_empty"]
    assert empty["ok"] is False, plan["preflight"]
    assert f"target database {world.catalog.database} on store" in empty["detail"]
    assert (
        "holds 2 tables (public.ducklake_inlined_data_999_999, public.operator_notes)"
        in empty["detail"]
    ), empty["detail"]
    assert "(start would answer 400 target_database_not_empty)" in empty["detail"]
    # Every other check is still reported (a report, not one error).
    assert checks["target_database_owner"]["ok"] is True

    with pytest.raises(ServiceError) as caught:
        restores.restore_start(org_id=org, key=moved["key"], request=request, actor="t")
    assert caught.value.status == 400
    assert caught.value.code == "target_database_not_empty"
    assert "public.operator_notes" in caught.value.message
    assert ReshardOperation.objects.filter(org_id=org, kind="restore").count() == 0
    wh = Warehouse.objects.get(org_id=org)
    assert (wh.metadata_store_id, wh.state) == (world.target_store.name, "ready")
    strangers_intact(cluster, world.catalog.database)


def test_a_stale_database_that_appears_after_the_start_is_not_adopted_nor_emptied(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    """The start passed (nothing on A yet); the database appears before the runner renders the
    target: the cutover refuses to adopt it, the rollback drops nothing of it, and B's catalog
    stays bound and intact."""
    world = moved["world"]
    cluster = world.catalog.cluster
    op = start_restore(moved, world.source_store.name)
    _plant(cluster, world.catalog.database, world.catalog.role)
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "failed", (op.error, runner.output(), "\n".join(lines))
    assert "already exists and holds 2 tables" in op.error, op.error
    assert op.target_claimed_at is None
    assert not any(line.startswith("dropped ducklake_") for line in lines), lines
    strangers_intact(cluster, world.catalog.database)
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.metadata_store_database, wh.state) == (
        world.target_store.name,
        world.catalog.database,
        "ready",
    )
    assert snapshots(moved["on_b"]) == moved["backup_snapshots"] + 1


def test_recovery_drops_nothing_in_a_target_its_operation_never_claimed(
    moved: dict[str, Any], settings: Any, tmp_path: Path
) -> None:
    """An operation that reached ``copying`` without a claim (e.g. one started before the claim
    was recorded) leaves the target as found: the plan says so and a planted ``ducklake_*``
    table survives the recovery."""
    world = moved["world"]
    cluster = world.catalog.cluster
    op = start_restore(moved, world.source_store.name)
    _plant(cluster, world.catalog.database, world.catalog.role)
    # As a runner killed mid-restore leaves it: the warehouse blocked, the binding on A.
    ReshardOperation.objects.filter(pk=op.id).update(
        step="copying", state="running", blocked_at=timezone.now(),
        target_rendered_at=timezone.now(),  # rendered, but no claim recorded (an older version)
    )  # fmt: skip
    Warehouse.objects.filter(org_id=world.op.org_id).update(
        state="resharding", metadata_store_id=world.source_store.name
    )
    backdate(op.id)
    with connection.cursor() as cursor:  # as the janitor's force-fail leaves it
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET state = 'failed', recovery_required = true, "
            "error = 'runner could not be kept alive', finished_at = now() WHERE id = %s",
            [op.id],
        )
    settings.DUCKGRES_RESHARD_LOCAL_STATE_DIR = str(tmp_path / "no-runners")
    out = io.StringIO()
    call_command("reshard_recover", str(op.id), stdout=out)
    assert "nothing is dropped on the target database" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    call_command("reshard_recover", str(op.id), "--execute", stdout=out)
    lines = op_log(op.id)
    assert any("was not created or adopted empty by this operation" in line for line in lines)
    assert not any(line.startswith("dropped ducklake_") for line in lines), lines
    strangers_intact(cluster, world.catalog.database)
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.state) == (world.target_store.name, "ready"), "B again"


def test_an_in_place_restore_never_adopts_nor_drops_a_sibling_it_did_not_create(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    """The in-place restore's sibling database already exists when its runner renders it (a
    stranger's, holding a planted ``ducklake_*`` table): the cutover refuses it before creating
    anything, records no claim, and the rollback leaves that database and its tables as found
    while the current catalog on B stays bound and intact."""
    world, on_b = moved["world"], moved["on_b"]
    op = start_restore(moved, world.target_store.name)
    assert op.in_place
    _plant(on_b.cluster, op.target_database, on_b.role)
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "failed", (op.error, runner.output(), "\n".join(lines))
    # Refused before anything is created (here by the tenant-role identity check, which sees
    # the role owning a second database; a sibling owned by anyone else fails the owner check).
    assert op.target_database in op.error, op.error
    assert op.target_claimed_at is None
    assert any(
        f"database {op.target_database} on store {world.target_store.name} was not created by "
        "this operation" in line
        for line in lines
    ), lines
    assert not any(line.startswith("dropped ducklake_") for line in lines), lines
    strangers_intact(on_b.cluster, op.target_database)
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.metadata_store_database, wh.state) == (
        world.target_store.name,
        world.catalog.database,
        "ready",
    )
    assert snapshots(on_b) == moved["backup_snapshots"] + 1


def test_an_external_target_that_fills_after_the_start_is_not_claimed_nor_emptied(
    external_target_world: ExternalTargetWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    """cnpg→external: the start saw the external database empty; tables appear in it before
    the runner's first write. The copy refuses to claim it, nothing is written or dropped there,
    and the source catalog stays bound, un-fenced and intact."""
    world = external_target_world
    Warehouse.objects.filter(org_id=world.op.org_id).update(data_bucket=runner_s3.bucket)
    plant_tables(world.target.cluster, world.target.database, world.target.role)
    with password_url(world.target.password) as url:
        runner = run_runner(
            world.op.id,
            runner_state_dir,
            180,
            env_extra=runner_s3.env(),
            DUCKGRES_RESHARD_PASSWORD_URL=url,
        )
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "failed", (op.error, runner.output(), "\n".join(lines))
    assert "already exists and holds 2 tables" in op.error, op.error
    assert op.target_claimed_at is None
    assert not any(line.startswith("dropped ducklake_") for line in lines), lines
    strangers_intact(world.target.cluster, world.target.database)
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.metadata_store_database, wh.state) == (
        world.source_store.name,
        world.catalog.database,
        "ready",
    )
    with world.catalog.tenant_conn() as conn:  # un-fenced: the tenant logs in again
        assert conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone() is not None
