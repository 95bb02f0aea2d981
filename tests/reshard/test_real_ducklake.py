"""A reshard of a catalog written by the real DuckDB DuckLake extension: a real runner process
moves it from the source cluster (5433) to the target (5434), and DuckDB on the target then
reads the same snapshots, the same time-travel results and the same rows, and writes there.

The catalog holds what a tenant's work leaves: inlined inserts (small ones stay in the
catalog's ``ducklake_inlined_data_*`` tables), a bulk insert written as Parquet, an update, a
delete, a table created and dropped, and a second table. (The online mode's real-DuckLake tests
add writes during its pre-copy; this one pins the offline move they are compared with.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.ducklake import Lake, attach, extension_dir
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.runner import (
    RunnerS3,
    op_log,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
    runner_state_dir,
)
from tests.fixtures.stores import StoreClusters, TenantCatalogFactory

__all__ = ["runner_moto_server", "runner_s3", "runner_state_dir"]  # fixtures used here


def _work(lake: Lake) -> int:
    """A tenant's work; returns the snapshot that created ``events``."""
    lake.sql("CREATE TABLE lake.events (id BIGINT, kind VARCHAR, amount DOUBLE)")
    created = lake.snapshots()[-1]
    lake.sql("INSERT INTO lake.events VALUES (1, 'a', 1.5), (2, 'b', 2.5)")
    lake.sql("INSERT INTO lake.events SELECT i, 'bulk', i * 0.5 FROM range(3, 5003) t(i)")
    lake.sql("UPDATE lake.events SET amount = amount + 100 WHERE id <= 10")
    lake.sql("DELETE FROM lake.events WHERE id % 7 = 0")
    lake.sql("CREATE TABLE lake.scratch (x INTEGER)")
    lake.sql("INSERT INTO lake.scratch VALUES (1), (2)")
    lake.sql("DROP TABLE lake.scratch")
    lake.sql("CREATE TABLE lake.dims (k VARCHAR, v INTEGER)")
    lake.sql("INSERT INTO lake.dims VALUES ('x', 1), ('y', 2)")
    return created


def _history(lake: Lake, created: int) -> dict[str, Any]:
    snapshots = lake.snapshots()
    return {
        "snapshots": snapshots,
        "tables": lake.tables(),
        "events_at": {s: lake.rows_at("events", s) for s in snapshots if s >= created},
        "events": lake.rows("events"),
        "dims": lake.rows("dims"),
    }


def _count(clusters: StoreClusters, database: str, table: str) -> int:
    with clusters.source.superuser_conn(database) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(str(row[0])) if row else 0


@pytest.fixture(scope="module")
def extensions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extension_dir(tmp_path_factory.mktemp("duckdb-extensions"))


def test_a_reshard_of_a_real_ducklake_keeps_its_snapshots_time_travel_and_writes(
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    data = tmp_path / "lake-data"
    catalog = tenant_catalog(store_clusters.source, with_tables=False)
    with attach(extensions, store_clusters.source, catalog, data) as lake:
        created = _work(lake)
        before = _history(lake, created)
    assert _count(store_clusters, catalog.database, "ducklake_data_file") > 0, "Parquet written"
    assert _count(store_clusters, catalog.database, "ducklake_inlined_data_tables") > 0, "inlined"
    assert len(before["events_at"]) >= 5

    source, target = new_store(store_clusters.source), new_store(store_clusters.target)
    warehouse = new_warehouse(store=source, catalog=catalog, data_bucket=runner_s3.bucket)
    op = new_op(warehouse, to_store=target)
    runner = run_runner(op.id, runner_state_dir, timeout=180, env_extra=runner_s3.env())
    op = reload(op)
    assert op.state == "succeeded", (op.error, "\n".join(op_log(op.id)), runner.output())

    with attach(extensions, store_clusters.target, catalog, data) as lake:
        assert _history(lake, created) == before
        lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
        assert lake.snapshots()[-1] == before["snapshots"][-1] + 1
        assert lake.rows("dims") == [*before["dims"], ("z", 3)]
        assert lake.rows_at("events", before["snapshots"][-1]) == before["events"]
