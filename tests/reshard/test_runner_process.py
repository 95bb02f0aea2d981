"""The runner as a real process: claim, blocking, recordSource, honest failure at the first
step this build does not have, rollback (unblock), report, terminal write, exit code and files.
"""

from __future__ import annotations

import json
import signal

import pytest
from django.db import connection

from duckgres_admin.models import ReshardOperation, ReshardStepTiming, Warehouse
from tests.fixtures.runner import (
    CnpgWorld,
    op_log,
    reload,
    run_runner,
    start_runner,
    step_rows,
    wait_until,
    warehouse_of,
)


def _grant_message(world: CnpgWorld) -> str:
    role = world.catalog.role
    return (
        f"provisioner provisioner cannot act as tenant role {role} on store "
        f"{world.source_store.name}: GRANT {role} TO provisioner"
    )


def _sql(query: str, params: list[int] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(query, params or [])


@pytest.mark.safeguard("reshard-9")
def test_missing_membership_fails_preparing_access_at_once_naming_the_grant(
    cnpg_world: CnpgWorld, runner_state_dir
):
    """Also the process-level contract: report, marker line, exit file, structured log."""
    world = cnpg_world
    with world.catalog.cluster.superuser_conn() as conn:
        conn.execute(f'REVOKE "{world.catalog.role}" FROM provisioner')
    runner = run_runner(world.op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()

    op = reload(world.op)
    assert op.state == "failed"
    assert op.error == _grant_message(world)
    assert op.source_access_verified_at is None
    assert op.source_fence_requested_at is None
    assert op.finished_at is not None
    assert op.started_at is not None
    assert (op.finished_at - op.started_at).total_seconds() < 30  # at once, not a timeout
    assert op.runner_epoch == 1
    assert op.runner_id == f"duckgres-reshard-op-{op.id}"
    assert op.finished_at is not None
    assert op.started_at is not None
    assert op.blocked_at is not None
    assert op.unblocked_at is not None
    assert op.unblocked_at >= op.blocked_at
    assert op.step == "preparing_access"
    # recordSource persisted the source (cnpg: the store's direct endpoint).
    assert (op.source_endpoint, op.source_port, op.source_sslmode) == (
        world.source_store.host,
        world.source_store.port,
        world.source_store.sslmode,
    )
    assert op.source_database == world.catalog.database
    assert op.source_user == world.catalog.role
    assert op.source_password_secret_ref == world.catalog.password_ref

    wh = warehouse_of(op)
    assert wh.state == "ready"
    assert wh.status_message == "metadata-store reshard rolled back"
    assert wh.metadata_store_id == world.source_store.name  # binding unchanged
    assert wh.metadata_store_database == world.catalog.database
    assert wh.compaction_enabled is True  # never paused → untouched

    assert [(s, o) for s, o, _ in step_rows(op.id)] == [
        ("blocking", "ok"),
        ("preparing_access", "failed"),
    ]
    lines = op_log(op.id)
    assert lines[0].startswith("AWS context: ")  # the runner's start line (its AWS context)
    assert lines[1] == (
        f"operation claimed by duckgres-reshard-op-{op.id} (epoch 1): "
        f"cnpg {world.source_store.name} → cnpg {world.target_store.name}"
    )
    assert any(line.startswith("warehouse blocked: ready → resharding") for line in lines)
    assert any(line.startswith("source recorded: ") for line in lines)
    assert any("warehouse unblocked: resharding → ready" in line for line in lines)
    assert "==== reshard report (failed) ====" in lines
    report_at = lines.index("==== reshard report (failed) ====")
    report = lines[report_at:]
    assert (
        report[1]
        == f"org {op.org_id}: cnpg {world.source_store.name} → cnpg {world.target_store.name}"
    )
    assert any(line.startswith("maintenance mode (connections blocked): ") for line in report)
    assert any(line.startswith("step blocking: ") and "(ok, epoch 1)" in line for line in report)
    assert any(line.startswith("step preparing_access: ") and "(failed" in line for line in report)
    assert any(line.startswith("total runtime: ") for line in report)
    # The marker counts run_process's lines: not itself, not the command's AWS context line.
    assert lines[-1] == (
        f"runner log persisted: pod duckgres-reshard-op-{op.id} uid {runner.pod_uid} epoch 1, "
        f"{len(lines) - 2} lines (0 dropped)"
    )
    assert runner.exit_file().read_text().strip() == "0"
    # The process log is structured JSON bound with op id, org id and epoch.
    records = [json.loads(x) for x in runner.output().splitlines() if x.startswith("{")]
    claimed = [r for r in records if r.get("event", "").startswith("operation claimed")]
    assert claimed
    assert claimed[0]["op_id"] == op.id
    assert claimed[0]["org_id"] == op.org_id
    assert claimed[0]["epoch"] == 1


def test_terminal_op_exits_zero_and_unknown_op_exits_one(cnpg_world: CnpgWorld, runner_state_dir):
    ReshardOperation.objects.filter(id=cnpg_world.op.id).update(
        state="cancelled", error="cancelled before start"
    )
    runner = run_runner(cnpg_world.op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    assert reload(cnpg_world.op).runner_epoch == 0  # never claimed
    assert warehouse_of(cnpg_world.op).state == "ready"

    missing = run_runner(cnpg_world.op.id + 1000, runner_state_dir)
    assert missing.proc.returncode == 1
    assert missing.exit_file().read_text().strip() == "1"


@pytest.mark.safeguard("reshard-38")
def test_sigterm_during_the_propagation_wait_rolls_back_and_exits_zero(
    cnpg_world: CnpgWorld, runner_state_dir
):
    op = cnpg_world.op
    runner = start_runner(op.id, runner_state_dir, DUCKGRES_CONFIG_POLL_INTERVAL="20")
    wait_until(lambda: reload(op).blocked_at is not None, what="the block to commit")
    assert warehouse_of(op).state == "resharding"
    assert warehouse_of(op).status_message == "metadata-store reshard in progress"
    runner.proc.send_signal(signal.SIGTERM)
    assert runner.wait(30) == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert op.error == "runner received SIGTERM during step blocking"
    assert op.cancel_requested is False
    assert warehouse_of(op).state == "ready"
    assert op.unblocked_at is not None
    assert [(s, o) for s, o, _ in step_rows(op.id)] == [("blocking", "failed")]
    assert "==== reshard report (failed) ====" in op_log(op.id)


def test_cancel_before_start_is_cancelled_without_blocking(cnpg_world: CnpgWorld, runner_state_dir):
    op = cnpg_world.op
    ReshardOperation.objects.filter(id=op.id).update(cancel_requested=True)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator")
    assert op.blocked_at is None
    assert op.step == ""
    wh = warehouse_of(op)
    assert (wh.state, wh.status_message) == ("ready", "")
    lines = op_log(op.id)
    assert "==== reshard report (cancelled) ====" in lines
    assert "maintenance mode: never entered" in lines
    assert any(line.startswith("cancel requested — rolling back") for line in lines)


def test_cancel_during_the_propagation_wait_unblocks(cnpg_world: CnpgWorld, runner_state_dir):
    op = cnpg_world.op
    runner = start_runner(op.id, runner_state_dir, DUCKGRES_CONFIG_POLL_INTERVAL="20")
    wait_until(lambda: reload(op).blocked_at is not None, what="the block to commit")
    ReshardOperation.objects.filter(id=op.id).update(cancel_requested=True)
    assert runner.wait(30) == 0, runner.output()
    op = reload(op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator")
    wh = warehouse_of(op)
    assert (wh.state, wh.status_message) == ("ready", "metadata-store reshard rolled back")
    assert [(s, o) for s, o, _ in step_rows(op.id)] == [("blocking", "cancelled")]
    assert "==== reshard report (cancelled) ====" in op_log(op.id)


@pytest.mark.safeguard("reshard-3")
def test_binding_edited_after_submit_fails_with_identity_drift(
    cnpg_world: CnpgWorld, runner_state_dir
):
    op = cnpg_world.op
    # The binding now names another cnpg store than the one the op was submitted for.
    Warehouse.objects.filter(org_id=op.org_id).update(metadata_store=cnpg_world.target_store)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert "metadata-store identity drift" in op.error
    assert "refusing to proceed" in op.error
    assert op.source_endpoint == ""  # nothing recorded
    wh = warehouse_of(op)
    assert wh.state == "ready"
    assert wh.status_message == "metadata-store reshard rolled back"
    assert [(s, o) for s, o, _ in step_rows(op.id)] == [("blocking", "failed")]


@pytest.mark.safeguard("reshard-3")
def test_missing_tenant_database_on_the_store_is_drift(cnpg_world: CnpgWorld, runner_state_dir):
    op = cnpg_world.op
    # Submitted for a database the store does not have (the binding and the op agree: a binding
    # changed after the submit is drift of its own, caught before the store is read).
    Warehouse.objects.filter(org_id=op.org_id).update(metadata_store_database="no_such_catalog")
    ReshardOperation.objects.filter(id=op.id).update(source_database="no_such_catalog")
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert "metadata-store identity drift: tenant database no_such_catalog not found" in op.error
    assert warehouse_of(op).state == "ready"


@pytest.mark.safeguard("reshard-51")
def test_a_secret_in_an_error_reaches_the_op_log_and_error_scrubbed(
    cnpg_world: CnpgWorld, runner_state_dir, store_clusters
):
    """The binding's database is named after the provisioner password: the drift error that
    names the database would carry the password; every sink must show *** instead."""
    op = cnpg_world.op
    password = store_clusters.source.provisioner_password
    Warehouse.objects.filter(org_id=op.org_id).update(metadata_store_database=password)
    ReshardOperation.objects.filter(id=op.id).update(source_database=password)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.state == "failed"
    assert password not in op.error
    assert "tenant database *** not found" in op.error
    lines = op_log(op.id)
    assert not [line for line in lines if password in line]
    assert any("tenant database *** not found" in line for line in lines)
    assert password not in runner.output()
    assert "***" in runner.output()


@pytest.mark.safeguard("reshard-20")
@pytest.mark.safeguard("reshard-73")
def test_takeover_at_blocking_redoes_the_steps_and_succeeds(
    cnpg_world: CnpgWorld, runner_state_dir
):
    """A runner died right after the block committed: a takeover claims the stale op (epoch
    +1), supersedes the old step row, accepts its own block and redoes the steps from
    ``blocking`` (reshard-73) to success."""
    op = cnpg_world.op
    Warehouse.objects.filter(org_id=op.org_id).update(
        state="resharding", status_message="metadata-store reshard in progress"
    )
    ReshardOperation.objects.filter(id=op.id).update(
        state="running", step="blocking", runner_id="dead-runner", runner_epoch=3
    )
    _sql(
        "UPDATE duckgres_reshard_operations SET heartbeat_at = now() - interval '10 minutes', "
        "blocked_at = now() - interval '11 minutes', started_at = now() - interval '12 minutes' "
        "WHERE id = %s",
        [op.id],
    )
    ReshardStepTiming.objects.create(operation_id=op.id, step="blocking", runner_epoch=3)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert op.runner_epoch == 4
    assert (op.state, op.error) == ("succeeded", ""), op_log(op.id)
    assert "already in resharding state (takeover or restart) — continuing" in op_log(op.id)
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", cnpg_world.target_store.name)
    rows = step_rows(op.id)
    assert rows[:2] == [("blocking", "superseded", 3), ("blocking", "ok", 4)]
    assert (rows[-1][0], rows[-1][2]) == ("finalizing", 4)


def _stale_takeover_state(op: ReshardOperation, step: str, **fields: object) -> None:
    """Make ``op`` look like a dead runner left it at ``step`` with the warehouse blocked."""
    ReshardOperation.objects.filter(id=op.id).update(
        state="running", step=step, runner_id="dead-runner", runner_epoch=2, **fields
    )
    _sql(
        "UPDATE duckgres_reshard_operations SET heartbeat_at = now() - interval '10 minutes', "
        "blocked_at = now() - interval '11 minutes', started_at = now() - interval '12 minutes' "
        "WHERE id = %s",
        [op.id],
    )
    ReshardStepTiming.objects.create(operation_id=op.id, step=step, runner_epoch=2)


@pytest.mark.safeguard("reshard-2")
@pytest.mark.safeguard("reshard-30")
@pytest.mark.parametrize(
    ("prior", "restored"),
    [
        ({"present": False}, None),
        ({"present": True, "value": True}, True),
        ({"present": True, "value": False}, False),
    ],
)
def test_takeover_with_cancel_reconstructs_progress_then_unblocks_and_restores_compaction(
    transactional_db, store_clusters, tenant_catalog, runner_state_dir, prior, restored
):
    from tests.fixtures.rows import new_op, new_store, new_warehouse

    catalog = tenant_catalog(store_clusters.source)
    warehouse = new_warehouse(
        catalog=catalog,
        metadata_store_kind="external",
        state="resharding",
        status_message="metadata-store reshard in progress",
        compaction_enabled=False,  # paused by the dead runner
    )
    op = new_op(warehouse, to_store=new_store(store_clusters.target))
    _stale_takeover_state(op, "backup_catalog", compaction_prior=prior, cancel_requested=True)
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator")
    assert op.runner_epoch == 3
    assert op.recovery_required is False
    wh = warehouse_of(op)
    assert (wh.state, wh.status_message) == ("ready", "metadata-store reshard rolled back")
    assert wh.compaction_enabled is restored
    assert step_rows(op.id) == [("backup_catalog", "superseded", 2)]
    assert "==== reshard report (cancelled) ====" in op_log(op.id)


@pytest.mark.safeguard("reshard-2")
@pytest.mark.safeguard("reshard-19")
def test_takeover_of_a_fenced_cnpg_source_with_cancel_un_fences_and_unblocks(
    cnpg_world: CnpgWorld, runner_state_dir
):
    """A runner died after ALTER ROLE … NOLOGIN (``source_fence_requested_at`` set, no
    ``source_fenced_at``) and was cancelled: the takeover re-enables LOGIN, verifies it on the
    source store, restores compaction exactly and ends ``cancelled`` with the warehouse ready."""
    world = cnpg_world
    op = world.op
    Warehouse.objects.filter(org_id=op.org_id).update(
        state="resharding",
        status_message="metadata-store reshard in progress",
        compaction_enabled=False,
    )
    with world.catalog.cluster.superuser_conn() as conn:
        conn.execute(f'ALTER ROLE "{world.catalog.role}" NOLOGIN')
    _stale_takeover_state(
        op,
        "backup_catalog",
        compaction_prior={"present": True, "value": True},
        cancel_requested=True,
        source_endpoint=world.source_store.host,
        source_port=world.source_store.port,
        source_sslmode=world.source_store.sslmode,
    )
    _sql(
        "UPDATE duckgres_reshard_operations SET source_fence_requested_at = now() WHERE id = %s",
        [op.id],
    )
    runner = run_runner(op.id, runner_state_dir)
    assert runner.proc.returncode == 0, runner.output()
    op = reload(op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator"), op_log(op.id)
    assert op.recovery_required is False
    assert op.unblocked_at is not None
    wh = warehouse_of(op)
    assert (wh.state, wh.compaction_enabled) == ("ready", True)
    assert wh.metadata_store_id == world.source_store.name
    with world.catalog.cluster.superuser_conn() as conn:
        row = conn.execute(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [world.catalog.role]
        ).fetchone()
    assert row == (True,)
    lines = op_log(op.id)
    assert any(line.startswith("rollback: source tenant access verified") for line in lines)
