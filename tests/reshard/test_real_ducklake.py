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

from tests.fixtures.ducklake import attach, extensions, history, tenant_work
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

__all__ = [
    "extensions",
    "runner_moto_server",
    "runner_s3",
    "runner_state_dir",
]  # fixtures used here


def _count(clusters: StoreClusters, database: str, table: str) -> int:
    with clusters.source.superuser_conn(database) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(str(row[0])) if row else 0


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
        created = tenant_work(lake)
        before = history(lake, created)
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
        assert history(lake, created) == before
        lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
        assert lake.snapshots()[-1] == before["snapshots"][-1] + 1
        assert lake.rows("dims") == [*before["dims"], ("z", 3)]
        assert lake.rows_at("events", before["snapshots"][-1]) == before["events"]
