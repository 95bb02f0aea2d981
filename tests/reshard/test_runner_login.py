"""A runner's config-store login reaches its own operation only (safeguard reshard-133).

Against the real config store: the login the launcher mints for one operation is used the way a
compromised runner would use it — reading Django's users and sessions, other operations and
other warehouses, widening its own op row, switching the row filter off, changing role — and
each attempt is refused or sees nothing. The janitor drops the login once the operation ended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models.functions import Now
from psycopg import errors

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines.restore.stream import installation_tag
from reshard.launchers import login
from tests.fixtures.janitor import FakeLauncher, janitor_env, make_janitor
from tests.fixtures.rows import new_op, new_store, new_warehouse

assert janitor_env  # a fixture, used by name below

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.safeguard("reshard-133")]


@pytest.fixture
def two_ops() -> tuple[ReshardOperation, ReshardOperation]:
    store = new_store()

    def bound(n: int) -> Any:
        return new_warehouse(
            store=store,
            metadata_store_database=f"cat_{n}",
            metadata_store_user=f"tenant_{n}",
            metadata_store_password_ref=f"env:TENANT_{n}",
        )

    mine = new_op(bound(1), to_store=new_store(), state="running")
    theirs = new_op(bound(2), to_store=new_store(), state="running")
    return mine, theirs


@pytest.fixture
def as_runner(
    two_ops: tuple[ReshardOperation, ReshardOperation],
) -> Iterator[Callable[[str], Any]]:
    """Run one statement as the first op's minted login, on a fresh autocommit connection."""
    dsn = login.mint(two_ops[0].id)
    conn = psycopg.connect(dsn, autocommit=True)

    def run(statement: str) -> Any:
        return conn.execute(statement)

    yield run
    conn.close()
    login.drop(login.role_name(two_ops[0].id))


def test_the_login_is_its_own_rightless_role(two_ops, as_runner) -> None:
    mine, _ = two_ops
    row = as_runner(
        "SELECT session_user, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls "
        "FROM pg_roles r WHERE r.rolname = session_user"
    ).fetchone()
    assert row == (f"duckgres_runner_{installation_tag()}_op{mine.id}",) + (False,) * 4
    assert connection.settings_dict["USER"] not in row[0]


@pytest.mark.parametrize(
    "table",
    [
        "auth_user",
        "django_session",
        "duckgres_operators",
        "duckgres_audit_log",
        "knox_authtoken",
        "duckgres_store_drains",
        "duckgres_notifications",
        "django_celery_beat_periodictask",
        "duckgres_leases",
    ],
)
def test_nothing_of_the_control_plane_is_readable(as_runner, table: str) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner(f"SELECT 1 FROM {table} LIMIT 1")


def test_another_operation_is_invisible_and_untouchable(two_ops, as_runner) -> None:
    mine, theirs = two_ops
    ids = [r[0] for r in as_runner("SELECT id FROM duckgres_reshard_operations")]
    assert ids == [mine.id]
    moved = as_runner(
        f"UPDATE duckgres_reshard_operations SET error = 'x' WHERE id = {theirs.id}"
    ).rowcount
    assert moved == 0
    assert ReshardOperation.objects.get(id=theirs.id).error == ""
    assert (
        as_runner(
            f"UPDATE duckgres_reshard_operations SET error = 'mine' WHERE id = {mine.id}"
        ).rowcount
        == 1
    )
    with pytest.raises(errors.InsufficientPrivilege):  # a row of another op: WITH CHECK
        as_runner(
            "INSERT INTO duckgres_reshard_operation_log (operation_id, ts, source, level, message) "
            f"VALUES ({theirs.id}, now(), 'runner', 'info', 'forged')"
        )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("runner_image", "'attacker/image:1'"),
        ("target_password_secret_ref", "'k8s:duckgres/duckgres-admin#internal-secret'"),
        ("org_id", "'other-org'"),
        ("restore_backup_sha256", "'00'"),
        ("respawn_attempts", "0"),
    ],
)
def test_the_columns_that_choose_the_next_runner_are_not_writable(
    two_ops, as_runner, column: str, value: str
) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner(
            f"UPDATE duckgres_reshard_operations SET {column} = {value} WHERE id = {two_ops[0].id}"
        )


def test_only_its_own_warehouse_and_only_the_binding_columns(two_ops, as_runner) -> None:
    mine, theirs = two_ops
    orgs = [r[0] for r in as_runner("SELECT org_id FROM duckgres_managed_warehouses")]
    assert orgs == [mine.org_id]
    assert (
        as_runner(
            "UPDATE duckgres_managed_warehouses SET metadata_store_host = 'evil.example' "
            f"WHERE org_id = '{theirs.org_id}'"
        ).rowcount
        == 0
    )
    assert Warehouse.objects.get(org_id=theirs.org_id).metadata_store_host != "evil.example"
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner(f"UPDATE duckgres_managed_warehouses SET data_role_arn = 'arn:x' "
                  f"WHERE org_id = '{mine.org_id}'")  # fmt: skip
    # The server checks still see every binding's coordinates, and nothing else of it.
    seen = {r[0] for r in as_runner("SELECT org_id FROM duckgres_binding_coordinates")}
    assert {mine.org_id, theirs.org_id} <= seen
    with pytest.raises(errors.UndefinedColumn):
        as_runner("SELECT metadata_store_password_ref FROM duckgres_binding_coordinates")


def test_the_filter_cannot_be_switched_off_nor_the_role_changed(two_ops, as_runner) -> None:
    as_runner("SET row_security = off")
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner("SELECT id FROM duckgres_reshard_operations")
    as_runner("RESET row_security")
    owner = connection.settings_dict["USER"] or "postgres"
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner(f'SET ROLE "{owner}"')
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner(f'SET SESSION AUTHORIZATION "{owner}"')
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner("ALTER TABLE duckgres_reshard_operations DISABLE ROW LEVEL SECURITY")


@pytest.mark.usefixtures("janitor_env")
def test_the_janitor_drops_the_login_once_the_operation_ended(two_ops) -> None:
    mine, theirs = two_ops
    for op in two_ops:
        login.mint(op.id)
    ReshardOperation.objects.filter(id=mine.id).update(state="failed", finished_at=Now())
    ReshardOperation.objects.filter(id=theirs.id).update(heartbeat_at=Now())
    launcher = FakeLauncher()
    launcher.put(mine.id, "Running")  # its runner still exists: the login stays
    janitor = make_janitor(launcher)
    report = janitor.reconcile()
    assert report.completed, report
    assert login.role_name(mine.id) in login.logins()
    launcher.runners.pop(mine.id)  # the runner is gone: the next tick drops the login
    janitor.reconcile()
    left = login.logins()
    assert login.role_name(mine.id) not in left
    assert ("forget_login", mine.id) in launcher.calls
    assert login.role_name(theirs.id) in left  # still running: kept
    login.drop(login.role_name(theirs.id))


def test_it_records_only_password_references_that_are_already_its_own(two_ops, as_runner) -> None:
    """The launcher mounts the Secrets the op's and binding's references name into the next
    runner pod: a runner may copy its binding's reference and put back its op's source or
    target one, never name another."""
    mine, theirs = two_ops
    foreign = "k8s:duckgres/another-tenant#password"
    with pytest.raises(errors.InsufficientPrivilege, match="warehouse binding holds"):
        as_runner(
            f"UPDATE duckgres_reshard_operations SET source_password_secret_ref = '{foreign}' "
            f"WHERE id = {mine.id}"
        )
    with pytest.raises(errors.InsufficientPrivilege, match="source or target"):
        as_runner(
            f"UPDATE duckgres_managed_warehouses SET metadata_store_password_ref = '{foreign}' "
            f"WHERE org_id = '{mine.org_id}'"
        )
    theirs_ref = Warehouse.objects.get(org_id=theirs.org_id).metadata_store_password_ref
    with pytest.raises(errors.InsufficientPrivilege):
        as_runner(
            f"UPDATE duckgres_managed_warehouses SET metadata_store_password_ref = "
            f"'{theirs_ref}' WHERE org_id = '{mine.org_id}'"
        )
    # What the steps do: record the binding's reference, bind the op's target one.
    binding_ref = Warehouse.objects.get(org_id=mine.org_id).metadata_store_password_ref
    assert (
        as_runner(
            f"UPDATE duckgres_reshard_operations SET source_password_secret_ref = '{binding_ref}' "
            f"WHERE id = {mine.id}"
        ).rowcount
        == 1
    )
    target_ref = ReshardOperation.objects.get(id=mine.id).target_password_secret_ref
    assert target_ref
    assert (
        as_runner(
            f"UPDATE duckgres_managed_warehouses SET metadata_store_password_ref = '{target_ref}' "
            f"WHERE org_id = '{mine.org_id}'"
        ).rowcount
        == 1
    )


def test_a_createrole_login_that_is_not_a_superuser_mints_and_re_mints(two_ops) -> None:
    """The control plane's login in production: CREATEROLE, owner (here: grant option) of the
    tables, no superuser. A relaunch re-mints the same login's password."""
    mine, _ = two_ops
    minter = f"duckgres_test_minter_{mine.id}"
    tables = ", ".join(g.table for g in login.grants())
    with connection.cursor() as cur:
        cur.execute(f"CREATE ROLE {minter} NOLOGIN CREATEROLE")
        cur.execute(f"GRANT ALL ON {tables} TO {minter} WITH GRANT OPTION")
        cur.execute(f"SET ROLE {minter}")
    try:
        login.mint(mine.id)
        login.mint(mine.id)  # the relaunch
        assert login.role_name(mine.id) in login.logins()
        login.drop(login.role_name(mine.id))  # the janitor, as the same login
        assert login.role_name(mine.id) not in login.logins()
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET ROLE")
            cur.execute(f"REVOKE ALL ON {tables} FROM {minter} CASCADE")
            cur.execute(f"DROP ROLE {minter}")
