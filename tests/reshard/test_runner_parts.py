"""Runner parts: the buffered op log, the Trino re-check under the block lock, an external
source's recordSource, progress reconstruction and the step registry."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from reshard.operation import sequences
from reshard.runner import logwriter as oplog_module
from reshard.runner.errors import StepError
from reshard.runner.execute import before_cancel_cutoff, reconstruct
from reshard.runner.logwriter import OpLogWriter
from reshard.runner.steps import REGISTRY
from reshard.runner.steps.blocking import block_warehouse
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.runner import CnpgWorld, op_log, reload, run_runner, warehouse_of


def test_op_log_buffers_failed_appends_bounded_and_flushes_later(transactional_db, monkeypatch):
    op_id = 424242
    real_connect = oplog_module.config_store_connect

    def down(_name: str) -> psycopg.Connection:
        raise psycopg.OperationalError("config store down (injected)")

    monkeypatch.setattr(oplog_module, "config_store_connect", down)
    monkeypatch.setattr(oplog_module, "MAX_BUFFERED_LINES", 3)
    writer = OpLogWriter(op_id, Scrubber("hunter2-secret"))
    for n in range(5):
        writer.info(f"line {n} hunter2-secret")
    assert writer.pending == 3
    assert writer.dropped == 2
    assert op_log(op_id) == []
    monkeypatch.setattr(oplog_module, "config_store_connect", real_connect)
    assert writer.flush() is True
    writer.persist_marker("pod-x", "uid-y", 7)
    writer.close()
    assert op_log(op_id) == [
        "line 2 ***",
        "line 3 ***",
        "line 4 ***",
        "runner log persisted: pod pod-x uid uid-y epoch 7, 3 lines (2 dropped)",
    ]


@pytest.mark.safeguard("reshard-42")
def test_trino_enabled_after_submit_fails_the_block_and_leaves_the_warehouse_ready(
    cnpg_world: CnpgWorld, claimed_env
):
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('duckgres_managed_warehouse_trino') IS NULL")
        row = cursor.fetchone()
        created = bool(row and row[0])
        if created:  # until Trino part 1 ships the table, stand it in (its §2.1 columns)
            cursor.execute(
                "CREATE TABLE duckgres_managed_warehouse_trino "
                "(org_id text PRIMARY KEY, enabled boolean NOT NULL DEFAULT false)"
            )
        cursor.execute(
            "INSERT INTO duckgres_managed_warehouse_trino (org_id, enabled) VALUES (%s, true)",
            [cnpg_world.op.org_id],
        )
    try:
        env = claimed_env(cnpg_world.op)
        with pytest.raises(StepError, match="Trino was enabled for this warehouse"):
            block_warehouse(env)
        assert warehouse_of(env.op).state == "ready"
        assert reload(env.op).blocked_at is None
    finally:
        with connection.cursor() as cursor:
            if created:
                cursor.execute("DROP TABLE duckgres_managed_warehouse_trino")
            else:
                cursor.execute(
                    "DELETE FROM duckgres_managed_warehouse_trino WHERE org_id = %s",
                    [cnpg_world.op.org_id],
                )


@pytest.mark.safeguard("reshard-3")
@pytest.mark.safeguard("reshard-14")
def test_external_source_records_the_binding_with_its_sslmode(
    transactional_db, store_clusters, tenant_catalog, runner_state_dir
):
    catalog = tenant_catalog(store_clusters.source)
    warehouse = new_warehouse(catalog=catalog, metadata_store_kind="external")
    target = new_store(store_clusters.target)
    op = new_op(warehouse, to_store=target)
    # The target shard stops after submit (safeguard 14): a pre-flip failure.
    MetadataStore.objects.filter(name=target.name).update(port=1)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert op.error.startswith(
        f"destination shard {target.name} stopped accepting PostgreSQL connections before cutover"
    )
    wh = Warehouse.objects.get(org_id=op.org_id)
    assert (wh.metadata_store_kind, wh.metadata_store_host) == ("external", catalog.cluster.host)
    assert (op.source_endpoint, op.source_port, op.source_sslmode) == (
        store_clusters.source.host,
        store_clusters.source.port,
        store_clusters.source.sslmode,  # the binding's (TEST_SSLMODE)
    )
    assert Warehouse.objects.get(org_id=op.org_id).state == "ready"
    lines = op_log(op.id)
    assert "external source: left untouched" in lines
    assert lines[0].startswith("AWS context: ")  # the runner's start line (its AWS context)
    assert lines[1].endswith(
        f"external {store_clusters.source.host}:{store_clusters.source.port} → cnpg {target.name}"
    )
    assert catalog.password not in runner.output()


def test_reconstruct_flags_from_the_row():
    op = ReshardOperation(source_kind="cnpg", target_kind="cnpg", step="")
    assert reconstruct(op).blocked is False
    op.step = "blocking"
    flags = reconstruct(op)
    assert (flags.blocked, flags.fence_requested, flags.flipped) == (True, False, False)
    op.step = "backup_catalog"
    assert reconstruct(op).fence_requested is True
    op.step = "copying"
    op.tables_copied = 3
    flags = reconstruct(op)
    assert (flags.flipped, flags.copied) == (True, True)
    external_source = ReshardOperation(source_kind="external", target_kind="cnpg", step="cutover")
    assert reconstruct(external_source).fence_requested is False
    assert reconstruct(
        ReshardOperation(
            source_kind="cnpg", target_kind="cnpg", compaction_prior={"present": False}
        )
    ).compaction_paused


def test_cancel_cutoff_per_direction():
    to_cnpg = ReshardOperation(source_kind="cnpg", target_kind="cnpg", step="cutover")
    assert before_cancel_cutoff(to_cnpg)
    to_cnpg.step = "copying"
    assert not before_cancel_cutoff(to_cnpg)
    to_ext = ReshardOperation(source_kind="cnpg", target_kind="external", step="verifying")
    assert before_cancel_cutoff(to_ext)
    to_ext.step = "orphaning_source"
    assert not before_cancel_cutoff(to_ext)


@pytest.mark.safeguard("reshard-107")
@pytest.mark.parametrize("from_store", ["cnpg", "external"])
def test_a_restore_onto_another_store_is_cancellable_until_its_commit_point(from_store: str):
    """Each kind's cutoff is its commit point: a restore onto another store keeps the replaced
    catalog until ``cleaning_up``, so the cutover's login-ready wait does not end it."""
    import datetime as dt

    op = ReshardOperation(
        kind="restore",
        source_kind=from_store,
        target_kind="cnpg",
        from_shard="a" if from_store == "cnpg" else "",
        to_shard="b",
        target_login_ready_at=dt.datetime.now(dt.UTC),
    )
    for step in ("cutover", "copying", "verifying"):
        op.step = step
        assert before_cancel_cutoff(op), step
    for step in ("cleaning_up", "finalizing"):
        op.step = step
        assert not before_cancel_cutoff(op), step
    # The reshard to a cnpg store keeps the spec's cutoff: the target login ready.
    reshard = ReshardOperation(source_kind="cnpg", target_kind="cnpg", step="cutover")
    assert before_cancel_cutoff(reshard)
    reshard.target_login_ready_at = dt.datetime.now(dt.UTC)
    assert not before_cancel_cutoff(reshard)


def test_every_registered_step_is_a_stamped_step_name():
    assert set(REGISTRY) <= set(sequences.ALL_STEPS)
    assert "blocking" in REGISTRY
