"""The online reshard end to end (docs/copy.md "Online copy", docs/runner.md "The online mode"):
a real runner process moves a catalog written by the real DuckDB DuckLake extension while a
tenant keeps committing through DuckDB during the pre-copy; the block pays only for the
catch-up, the check and the flip. DuckDB on the target then reads every commit, the same time
travel, and writes there. Both placements of the backup are run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines.copy.catalog import AUTOVACUUM_NOTE
from reshard.operation import sequences
from tests.fixtures.ducklake import Writer, attach, extensions, history, tenant_work
from tests.fixtures.online import (
    AFTER_THE_SNAPSHOT,
    CaptureProbe,
    OnlineTenant,
    assert_moved_with_writes,
    online_op,
    run_with_writer,
)
from tests.fixtures.rows import new_store, new_warehouse
from tests.fixtures.runner import (
    RunnerS3,
    database_exists,
    op_log,
    reload,
    runner_moto_server,
    runner_s3,
    runner_state_dir,
    start_runner,
    step_rows,
    wait_until,
    warehouse_of,
)
from tests.fixtures.stores import StoreClusters, TenantCatalogFactory

__all__ = [
    "extensions",
    "runner_moto_server",
    "runner_s3",
    "runner_state_dir",
]  # fixtures used here


def _lake_on_the_source(
    clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    data: Path,
    bucket: str,
) -> tuple[OnlineTenant, Warehouse, int, dict[str, Any]]:
    """A real DuckLake with a tenant's work on the source cluster, the warehouse bound to it;
    the snapshot that created ``events`` and what DuckDB read before the move."""
    catalog = tenant_catalog(clusters.source, with_tables=False)
    tenant = OnlineTenant(clusters.source, catalog, data)
    with attach(extensions, tenant.cluster, catalog, tenant.data) as lake:
        created = tenant_work(lake)
        before = history(lake, created)
    warehouse = new_warehouse(store=new_store(clusters.source), catalog=catalog, data_bucket=bucket)
    return tenant, warehouse, created, before


@pytest.mark.safeguard("reshard-147")
@pytest.mark.parametrize("after_unblock", [True, False], ids=["backup-after-unblock", "before"])
def test_an_online_reshard_moves_a_ducklake_written_during_its_pre_copy(
    after_unblock: bool,
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    tenant, warehouse, created, before = _lake_on_the_source(
        store_clusters, tenant_catalog, extensions, tmp_path / "lake-data", runner_s3.bucket
    )
    catalog = tenant.catalog
    op = online_op(warehouse, new_store(store_clusters.target), after_unblock=after_unblock)
    runner, writer = run_with_writer(
        op, tenant, extensions, runner_state_dir, runner_s3.env(), timeout=180
    )
    op = reload(op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines), runner.output())
    assert not writer.errors, writer.errors
    assert len(writer.commits) >= 20
    assert [s for s, _, _ in step_rows(op.id)] == list(
        sequences.ONLINE_CNPG_TO_CNPG if after_unblock else sequences.ONLINE_BACKUP_FIRST
    )
    assert op.copy_mode == "online"
    assert op.capture_removed_at is not None
    assert any("catch-up applied" in line or "catch-up round" in line for line in lines)
    # The CI stores grant the provisioner SET ON deadlock_timeout: its source sessions lower
    # it, so an autovacuum yields to the fence within 50 ms (and nothing says otherwise).
    assert AUTOVACUUM_NOTE not in lines
    assert any(line.startswith("whole-catalog comparison passed") for line in lines)
    assert any(line.startswith("catalog backup complete: s3://") for line in lines)
    assert warehouse_of(op).metadata_store_id == op.to_shard
    assert not database_exists(store_clusters.source, catalog.database)  # dropped on success
    CaptureProbe(store_clusters.target, catalog.database).assert_nothing_left()

    with attach(extensions, store_clusters.target, catalog, tenant.data) as lake:
        assert_moved_with_writes(lake, before, writer, created)
        lake.sql("INSERT INTO lake.dims VALUES ('z', 3)")
        assert lake.rows("dims") == [*before["dims"], ("z", 3)]


@pytest.mark.safeguard("reshard-144")
@pytest.mark.safeguard("reshard-145")
def test_a_cancel_during_the_pre_copy_removes_the_capture_while_the_tenant_writes(
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    runner_state_dir: Path,
    runner_s3: RunnerS3,
    tmp_path: Path,
) -> None:
    """The rollback's removal of the capture competes with the tenant's commits (the warehouse
    was never blocked): it retries until it finds the tables free, never gives up because the
    cancel that started it is still set, and no commit of the tenant fails."""
    tenant, warehouse, _, _ = _lake_on_the_source(
        store_clusters, tenant_catalog, extensions, tmp_path / "lake-data", runner_s3.bucket
    )
    catalog = tenant.catalog
    op = online_op(warehouse, new_store(store_clusters.target))
    env = {**runner_s3.env(), **AFTER_THE_SNAPSHOT, "DUCKGRES_RESHARD_TEST_PAUSE_SECONDS": "3"}
    with Writer(extensions, tenant, pause=0.005) as writer:
        runner = start_runner(op.id, runner_state_dir, env_extra=env)
        wait_until(lambda: any("pre-copy complete" in line for line in op_log(op.id)), 60)
        ReshardOperation.objects.filter(id=op.id).update(cancel_requested=True)
        runner.wait(120)
        time.sleep(0.5)  # the tenant keeps writing after the rollback
    op = reload(op)
    assert op.state == "cancelled", (op.error, op_log(op.id))
    assert op.capture_removed_at is not None
    assert not writer.errors, writer.errors
    CaptureProbe(store_clusters.source, catalog.database).assert_nothing_left()
    assert warehouse_of(op).metadata_store_id == warehouse.metadata_store_id
    with attach(extensions, store_clusters.source, catalog, tenant.data) as lake:
        online = [r for r in lake.rows("events") if r[1] == "online"]
    assert len(online) == len(writer.commits)
