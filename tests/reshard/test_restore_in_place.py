"""A restore onto the store the warehouse is on (docs/restore.md "Onto the current store";
safeguards reshard-104, reshard-105), against real services: real runner processes, the real
store clusters, a real S3 server (moto over HTTP).

``moved`` left the warehouse on store B with a snapshot its backup lacks. Restoring that backup
onto B puts it into a sibling database on B, fenced: the tenant role stays NOLOGIN while two
catalogs are its, the restore logs in as the operation's own login role (never the
provisioner), and only after the replaced catalog is dropped does the tenant log in again. A
cancel mid-restore, a runner killed mid-``pg_restore`` and one killed after the drop all end
consistent, leaving no database or role behind.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines.restore.stream import login_role_name
from reshard.start import restores
from tests.fixtures.backups_listing import put_backup
from tests.fixtures.faults import backdate
from tests.fixtures.restores import moved, restore_request, snapshots, start_restore
from tests.fixtures.runner import (
    RunnerS3,
    database_exists,
    op_log,
    reload,
    role_can_login,
    run_runner,
    runner_moto_server,
    runner_s3,
    start_runner,
)
from tests.fixtures.stores import TenantCatalog

__all__ = ["moved", "runner_moto_server", "runner_s3"]

pytestmark = pytest.mark.faults


def _in_place(moved: dict[str, Any]) -> ReshardOperation:
    return start_restore(moved, moved["world"].target_store.name)


def _hooks(kind: str, point: str, **extra: str) -> dict[str, str]:
    name = {"kill": "DUCKGRES_RESHARD_TEST_KILL_AT", "pause": "DUCKGRES_RESHARD_TEST_PAUSE_AT"}
    return {"DUCKGRES_RESHARD_TEST_HOOKS": "1", name[kind]: point, **extra}


def _databases(cluster: Any, stem: str) -> list[str]:
    with cluster.superuser_conn() as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY 1", [f"{stem}%"]
        ).fetchall()
    return [str(r[0]) for r in rows]


def _restored(moved: dict[str, Any], op: ReshardOperation) -> TenantCatalog:
    catalog = moved["on_b"]
    return TenantCatalog(
        catalog.cluster, catalog.role, op.target_database, catalog.password, catalog.password_var
    )


def _assert_restored_in_place(moved: dict[str, Any], op: ReshardOperation) -> None:
    """The warehouse is on B, bound to the sibling, which holds the backup's catalog; the
    replaced database and the login role are gone; the tenant logs in."""
    world, cluster = moved["world"], moved["on_b"].cluster
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.state) == (world.target_store.name, "ready")
    assert wh.metadata_store_database == op.target_database
    assert snapshots(_restored(moved, op)) == moved["backup_snapshots"], "the backup's state"
    assert not database_exists(cluster, world.catalog.database), "the replaced one is dropped"
    assert _databases(cluster, world.catalog.database) == [op.target_database], "nothing else"
    assert role_can_login(cluster, login_role_name(op)) is None, "the login role is dropped"
    assert role_can_login(cluster, world.catalog.role) is True


def _record_ddl_sessions(cluster: Any, op: ReshardOperation, seen: dict[str, Any]) -> None:
    """While the runner pauses after the flip (the sibling exists, nothing restored yet): an
    event trigger in the sibling records the session user of every DDL command that follows
    (superuser test setup), and the tenant role's LOGIN is read."""
    deadline = time.monotonic() + 120
    while not database_exists(cluster, op.target_database):
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)
    with cluster.superuser_conn(op.target_database) as conn:
        conn.execute("CREATE SCHEMA observer")
        conn.execute("CREATE TABLE observer.ddl (who text, tag text)")
        conn.execute(
            "CREATE FUNCTION observer.note() RETURNS event_trigger LANGUAGE plpgsql "
            "SECURITY DEFINER AS $$ BEGIN INSERT INTO observer.ddl VALUES (session_user, tg_tag); "
            "END $$"
        )
        conn.execute(
            "CREATE EVENT TRIGGER observer_note ON ddl_command_start "
            "EXECUTE FUNCTION observer.note()"
        )
    seen["tenant_login"] = role_can_login(cluster, op.target_user)


@pytest.mark.safeguard("reshard-104")
def test_a_restore_onto_the_current_store_goes_into_a_sibling_and_fences_the_tenant(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world, cluster = moved["world"], moved["on_b"].cluster
    org, store = world.op.org_id, world.target_store.name
    plan = restores.restore_dry_run(org, moved["key"], restore_request(store))
    assert plan["restore"]["in_place"] is True
    assert plan["cancel_cutoff"] == (
        "a restore in place can be cancelled until cleaning_up, when the replaced catalog is "
        "dropped"
    )
    assert all(entry["ok"] for entry in plan["preflight"]), plan["preflight"]
    op = _in_place(moved)
    assert (op.kind, op.from_shard, op.to_shard, op.in_place) == ("restore", store, store, True)
    assert re.fullmatch(rf"{world.catalog.database}_restored_[0-9a-f]{{8}}", op.target_database)
    seen: dict[str, Any] = {}
    watcher = threading.Thread(target=_record_ddl_sessions, args=(cluster, op, seen))
    watcher.start()
    env = {
        **runner_s3.env(),
        **_hooks("pause", "after_flip", DUCKGRES_RESHARD_TEST_PAUSE_SECONDS="8"),
    }
    runner = run_runner(op.id, runner_state_dir, 240, env_extra=env)
    watcher.join()
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, runner.output(), "\n".join(lines))
    assert seen.get("tenant_login") is False, "the tenant is fenced while two catalogs are its"
    with cluster.superuser_conn(op.target_database) as conn:
        creators = {
            str(r[0])
            for r in conn.execute("SELECT who FROM observer.ddl WHERE tag = 'CREATE TABLE'")
        }
    assert creators == {login_role_name(op)}, "pg_restore logs in as the login role only"
    _assert_restored_in_place(moved, op)
    assert op.target_login_ready_at is not None
    fingerprint = op.catalog_fingerprint
    assert isinstance(fingerprint, dict)
    assert fingerprint["snapshot_id"] == moved["backup_snapshots"] + 1, "B's was backed up"
    assert any(line.startswith("DuckLake verification of the restore matches") for line in lines)
    opened = lines.index(f"ALTER ROLE {op.target_user} LOGIN sent on store {op.to_shard}")
    dropped = next(i for i, line in enumerate(lines) if line.startswith("source database "))
    assert dropped < opened, "the tenant logs in again only after the replaced catalog is gone"


@pytest.mark.safeguard("reshard-105")
def test_a_cancel_mid_restore_in_place_rolls_back_and_leaves_nothing(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world, cluster = moved["world"], moved["on_b"].cluster
    op = _in_place(moved)
    env = {
        **runner_s3.env(),
        **_hooks("pause", "restore_chunk_written", DUCKGRES_RESHARD_TEST_PAUSE_SECONDS="30"),
    }
    runner = start_runner(op.id, runner_state_dir, env_extra=env)
    deadline = time.monotonic() + 120
    while reload(op).step != "copying" or not any(
        line.startswith("restoring s3://") for line in op_log(op.id)
    ):
        assert time.monotonic() < deadline, runner.output()
        time.sleep(0.2)
    ReshardOperation.objects.filter(id=op.id).update(cancel_requested=True)
    assert runner.wait(120) == 0, runner.output()
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "cancelled", (op.error, "\n".join(lines))
    wh = Warehouse.objects.get(org_id=world.op.org_id)
    assert (wh.metadata_store_id, wh.metadata_store_database, wh.state) == (
        world.target_store.name,
        world.catalog.database,
        "ready",
    )
    assert snapshots(moved["on_b"]) == moved["backup_snapshots"] + 1, "B's catalog untouched"
    assert _databases(cluster, world.catalog.database) == [world.catalog.database], "no sibling"
    assert role_can_login(cluster, login_role_name(op)) is None, "no login role"
    assert role_can_login(cluster, world.catalog.role) is True
    assert any("sibling database" in line and "dropped" in line for line in lines)


@pytest.mark.safeguard("reshard-105")
@pytest.mark.parametrize(
    ("point", "step"), [("restore_chunk_written", "copying"), ("after_source_drop", "cleaning_up")]
)
def test_a_runner_killed_in_place_is_taken_over_and_ends_consistent(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3, point: str, step: str
) -> None:
    """Killed mid-``pg_restore`` (the takeover restores again) and after the replaced catalog's
    drop, past the commit point with the tenant still NOLOGIN (the roll-forward opens it)."""
    world, cluster = moved["world"], moved["on_b"].cluster
    op = _in_place(moved)
    killed = start_runner(
        op.id, runner_state_dir, env_extra={**runner_s3.env(), **_hooks("kill", point)}
    )
    assert killed.wait(180) == -9, killed.output()
    op = reload(op)
    assert (op.state, op.step) == ("running", step), op.error
    assert role_can_login(cluster, world.catalog.role) is False, "still fenced"
    backdate(op.id)  # the janitor's view: a runner that stopped heartbeating
    runner = run_runner(op.id, runner_state_dir, 180, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, runner.output(), "\n".join(lines))
    assert op.step == "finalizing", "a rolled-forward success does not keep its takeover step"
    _assert_restored_in_place(moved, op)


@pytest.mark.safeguard("reshard-104")
def test_an_archive_that_changes_the_login_role_cannot_empty_the_restored_catalog(
    moved: dict[str, Any], runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    """The backup is replaced (before the start, so its ETag is the one recorded) by an archive
    whose check function, run by pg_restore as the login role, resets the role and sets the
    login role's own defaults: every later session of it as the tenant, read-only. Had the
    runner acted on ``CURRENT_USER`` in such a session, its cleanup's ``DROP OWNED`` would have
    dropped the tenant's restored catalog after the commit point; it names the role and resets
    the defaults first, so the restore ends with the backup's catalog, and nothing left."""
    world, on_b = moved["world"], moved["on_b"]
    tenant = world.catalog.role
    with on_b.tenant_conn() as conn:  # B back to the backup's state, plus the hostile check
        conn.execute(
            "DELETE FROM ducklake_snapshot WHERE snapshot_id = "
            "(SELECT max(snapshot_id) FROM ducklake_snapshot)"
        )
        conn.execute(
            "CREATE FUNCTION public.hostile() RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN "
            "IF session_user::text LIKE 'duckgres_restore_%' THEN EXECUTE 'RESET ROLE'; "
            f"EXECUTE format('ALTER ROLE %I SET role = %L', session_user, '{tenant}'); "
            "EXECUTE format('ALTER ROLE %I SET default_transaction_read_only = on', "
            "session_user); END IF; RETURN true; END $f$"
        )
        conn.execute(
            "ALTER TABLE ducklake_metadata ADD CONSTRAINT hostile CHECK (public.hostile())"
        )
    cluster = on_b.cluster
    dump = subprocess.run(
        ["pg_dump", "--format=custom", "--compress=1", "--no-owner", "--schema=public",
         "-h", cluster.host, "-p", str(cluster.port), "-U", "postgres", on_b.database],
        capture_output=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    # The backup as its operation wrote and recorded it held the hostile check (the tenant
    # controls its catalog's contents): recorded like the runner records what it wrote.
    put_backup(runner_s3.client(), runner_s3.bucket, moved["key"], dump)
    op = _in_place(moved)
    runner = run_runner(op.id, runner_state_dir, 240, env_extra=runner_s3.env())
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, runner.output(), "\n".join(lines))
    _assert_restored_in_place(moved, op)
    with _restored(moved, op).tenant_conn() as conn:
        row = conn.execute("SELECT count(*) FROM ducklake_metadata").fetchone()
    assert row is not None
    assert int(str(row[0])) > 0, "the restored catalog kept its rows"
