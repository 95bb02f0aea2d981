"""``python manage.py reshard_recover`` (spec §4.16; safeguards 34 and 59) on the real store
clusters: preconditions, the dry-run printout, --execute rolling back and forward, the claim."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from psycopg import sql

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import ReshardLogEntry, ReshardOperation, Warehouse
from reshard.control import recovery
from reshard.launchers.base import RunnerStatus
from reshard.runner import rollback as rb
from reshard.runner.context import RunContext
from reshard.runner.env import StepEnv
from reshard.runner.errors import Fenced
from reshard.runner.logwriter import OpLogWriter
from tests.fixtures.janitor import FakeLauncher, age_op, janitor_env, make_janitor
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique

pytestmark = pytest.mark.django_db(transaction=True)
assert janitor_env  # a fixture, used by name below


@dataclass
class Failed:
    op: ReshardOperation
    warehouse: Warehouse
    catalog: Any
    clusters: Any
    source_store: Any
    target_store: Any

    def refresh(self) -> tuple[ReshardOperation, Warehouse]:
        self.op.refresh_from_db()
        self.warehouse.refresh_from_db()
        return self.op, self.warehouse


@pytest.fixture(autouse=True)
def _local_state(settings, tmp_path):
    settings.DUCKGRES_RESHARD_LOCAL_STATE_DIR = str(tmp_path / "runners")
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 30
    settings.DUCKGRES_RESHARD_POLL_SECONDS = 1


def _set_login(cluster: Any, role: str, login: bool) -> None:
    with cluster.superuser_conn() as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} " + ("LOGIN" if login else "NOLOGIN")).format(
                sql.Identifier(role)
            )
        )


def _rolcanlogin(cluster: Any, role: str) -> bool:
    with cluster.superuser_conn() as conn:
        row = conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [role]).fetchone()
    return bool(row and row[0])


def _db_exists(cluster: Any, database: str) -> bool:
    with cluster.superuser_conn() as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
    return row is not None


@pytest.fixture
def fenced_failed(store_clusters, tenant_catalog) -> Failed:
    """cnpg→cnpg force-failed in ``fencing_source``: warehouse blocked with compaction paused
    (prior true), the source tenant role NOLOGIN on the source cluster — pre-commit."""
    catalog = tenant_catalog(store_clusters.source)
    source_store = new_store(store_clusters.source, name=unique("src"))
    target_store = new_store(store_clusters.target, name=unique("tgt"))
    warehouse = new_warehouse(
        store=source_store, catalog=catalog, state="resharding", compaction_enabled=False
    )
    op = new_op(warehouse, to_store=target_store, state="failed")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET step = 'fencing_source', "
            "blocked_at = now() - interval '10 minutes', "
            "source_access_verified_at = now() - interval '9 minutes', "
            "source_fence_requested_at = now() - interval '8 minutes', "
            'compaction_prior = \'{"present": true, "value": true}\', '
            "source_endpoint = %s, source_port = %s, source_sslmode = %s, "
            "recovery_required = true, runner_id = 'janitor', runner_epoch = 4, "
            "error = 'runner could not be kept alive', finished_at = now() WHERE id = %s",
            [source_store.host, source_store.port, source_store.sslmode, op.id],
        )
    _set_login(store_clusters.source, catalog.role, False)
    op.refresh_from_db()
    return Failed(op, warehouse, catalog, store_clusters, source_store, target_store)


def run(op_id: int, *args: str) -> str:
    out = io.StringIO()
    call_command("reshard_recover", str(op_id), *args, stdout=out)
    return out.getvalue()


def refused(op_id: int, *args: str) -> CommandError:
    with pytest.raises(CommandError) as info:
        run(op_id, *args)
    return info.value


# --- preconditions -------------------------------------------------------------------------------
def test_not_failed_is_refused(fenced_failed):
    ReshardOperation.objects.filter(id=fenced_failed.op.id).update(state="cancelled")
    err = refused(fenced_failed.op.id, "--execute")
    assert err.returncode == 1
    assert f"operation {fenced_failed.op.id} is cancelled" in str(err)
    assert "never revived" in str(err)


def test_not_recovery_required_is_refused(fenced_failed):
    ReshardOperation.objects.filter(id=fenced_failed.op.id).update(recovery_required=False)
    err = refused(fenced_failed.op.id)
    assert err.returncode == 1
    assert "does not require recovery" in str(err)


def test_active_op_for_the_org_is_refused(fenced_failed):
    other = new_op(fenced_failed.warehouse, to_store=fenced_failed.target_store, state="pending")
    err = refused(fenced_failed.op.id, "--execute")
    assert f"active reshard operation {other.id} (pending)" in str(err)
    assert f"/api/v1/reshards/{other.id}/cancel" in str(err)
    op, wh = fenced_failed.refresh()
    assert op.recovery_owner == ""
    assert wh.state == "resharding"


def test_runner_object_left_is_refused_with_instructions(fenced_failed, monkeypatch):
    class Fake:
        def get_phase(self, op_id: int) -> RunnerStatus:
            return RunnerStatus(phase="Failed")

    monkeypatch.setattr(recovery, "get_launcher", lambda kind=None: Fake())
    err = refused(fenced_failed.op.id, "--execute")
    assert err.returncode == 1
    assert f"a runner object duckgres-reshard-op-{fenced_failed.op.id} is still present" in str(err)
    assert "(phase Failed)" in str(err)
    assert f"op-{fenced_failed.op.id}.json" in str(err)
    assert fenced_failed.refresh()[0].recovery_owner == ""


def test_pod_runner_left_names_kubectl_delete(fenced_failed, monkeypatch, settings):
    class Fake:
        def get_phase(self, op_id: int) -> RunnerStatus:
            return RunnerStatus(phase="Running", terminating=True)

    ReshardOperation.objects.filter(id=fenced_failed.op.id).update(launcher="pod")
    monkeypatch.setattr(recovery, "get_launcher", lambda kind=None: Fake())
    settings.DUCKGRES_RESHARD_RUNNER_NAMESPACE = "duckgres-runners"  # where the pod lives
    err = refused(fenced_failed.op.id)
    op_id = fenced_failed.op.id
    assert f"kubectl delete pod duckgres-reshard-op-{op_id} -n duckgres-runners" in str(err)
    assert "(phase Running (terminating))" in str(err)


# --- dry run -------------------------------------------------------------------------------------
def test_dry_run_prints_progress_live_fence_and_plan(fenced_failed):
    f = fenced_failed
    ReshardOperation.objects.filter(id=f.op.id).update(
        backup_s3_uri="s3://bucket/_reshard_catalog_backups/op-1.dump", backup_bytes=1234
    )
    out = run(f.op.id)
    head = f"operation {f.op.id}: org {f.warehouse.org_id}: cnpg {f.source_store.name} → cnpg"
    assert head in out
    assert "step fencing_source" in out
    assert "  source_fence_requested_at: 20" in out
    assert "  source_dropped_at: —" in out
    assert 'compaction_prior: {"present": true, "value": true}' in out
    assert f"binding: cnpg store {f.source_store.name}" in out
    assert "names the source" in out
    assert (
        f"source fence: store {f.source_store.name} (live): tenant role {f.catalog.role} "
        "NOLOGIN (fenced); database " in out
    )
    assert "backup: s3://bucket/_reshard_catalog_backups/op-1.dump (1234 bytes)" in out
    assert "plan (rollback; commit point not passed):" in out
    assert f"un-fence: ALTER ROLE {f.catalog.role} LOGIN" in out
    assert "unblock: warehouse resharding → ready" in out
    assert "dry run: nothing changed" in out
    assert f.catalog.password not in out
    op, wh = f.refresh()
    assert op.recovery_owner == ""
    assert op.recovery_claimed_at is None
    assert wh.state == "resharding"
    assert not _rolcanlogin(f.clusters.source, f.catalog.role)
    assert not ReshardLogEntry.objects.filter(operation_id=f.op.id).exists()


# --- execute -------------------------------------------------------------------------------------
@pytest.mark.safeguard("reshard-34")
def test_execute_rolls_a_pre_commit_op_back_to_ready(fenced_failed):
    f = fenced_failed
    out = run(f.op.id, "--execute")
    assert "outcome rolled_back" in out
    op, wh = f.refresh()
    assert wh.state == "ready"
    assert wh.status_message == "metadata-store reshard rolled back"
    assert wh.compaction_enabled is True  # the recorded prior, restored exactly
    assert wh.metadata_store_id == f.source_store.name
    assert op.state == "failed"  # never revived
    assert op.recovery_outcome == "rolled_back"
    assert op.recovered_at is not None
    assert op.recovery_required is False
    assert op.recovery_owner == ""
    assert op.recovery_claimed_at is None
    assert op.unblocked_at is not None
    assert _rolcanlogin(f.clusters.source, f.catalog.role)
    lines = list(ReshardLogEntry.objects.filter(operation_id=f.op.id).order_by("id"))
    assert lines
    assert {entry.source for entry in lines} == {"recovery"}
    text = "\n".join(entry.message for entry in lines)
    assert "recovery claimed by" in text
    assert "warehouse unblocked: resharding → ready" in text
    assert f.catalog.password not in text
    # Recovered: a second run is refused.
    err = refused(f.op.id, "--execute")
    assert "does not require recovery" in str(err)
    assert "outcome rolled_back" in str(err)


@pytest.mark.safeguard("reshard-34")
def test_execute_rolls_a_post_commit_op_forward(store_clusters, tenant_catalog):
    """cnpg→cnpg force-failed after the commit point: the binding already names the target
    copy; recovery redoes the source drop and unblocks onto the target."""
    source = tenant_catalog(store_clusters.source)
    copy = tenant_catalog(store_clusters.target, name=source.role, password=source.password)
    source_store = new_store(store_clusters.source, name=unique("src"))
    target_store = new_store(store_clusters.target, name=unique("tgt"))
    warehouse = new_warehouse(
        store=target_store, catalog=copy, state="resharding", compaction_enabled=False
    )
    op = new_op(
        warehouse,
        to_store=target_store,
        state="failed",
        from_shard=source_store.name,
        source_kind="cnpg",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET step = 'cleaning_up', "
            "blocked_at = now() - interval '10 minutes', "
            "source_fence_requested_at = now() - interval '9 minutes', "
            "source_fenced_at = now() - interval '9 minutes', "
            "target_rendered_at = now() - interval '8 minutes', "
            "target_login_ready_at = now() - interval '8 minutes', "
            "source_drop_committed_at = now() - interval '1 minute', "
            "tables_copied = 5, compaction_prior = '{\"present\": false}', "
            "recovery_required = true, runner_id = 'janitor', finished_at = now() WHERE id = %s",
            [op.id],
        )
    _set_login(store_clusters.source, source.role, False)
    assert _db_exists(store_clusters.source, source.database)
    plan = run(op.id)
    assert "plan (roll-forward; commit point passed):" in plan
    assert f"redo DROP DATABASE IF EXISTS {source.database}" in plan

    out = run(op.id, "--execute")
    assert "outcome rolled_forward" in out
    op.refresh_from_db()
    warehouse.refresh_from_db()
    assert warehouse.state == "ready"
    assert warehouse.status_message == "metadata-store reshard complete"
    assert warehouse.metadata_store_id == target_store.name  # never re-pointed at the source
    assert warehouse.compaction_enabled is None  # prior: unset
    assert not _db_exists(store_clusters.source, source.database)
    assert op.source_dropped_at is not None
    assert op.recovery_outcome == "rolled_forward"
    assert op.recovery_required is False
    assert op.recovery_owner == ""
    assert op.state == "failed"


# --- the claim (safeguard 59) --------------------------------------------------------------------
@pytest.mark.safeguard("reshard-59")
def test_second_operator_is_refused_naming_the_owner(fenced_failed):
    f = fenced_failed
    alice = recovery.default_owner("alice")
    assert recovery.claim(f.op.id, alice) == ""
    err = refused(f.op.id, "--execute", "--as", "bob")
    assert err.returncode == 1
    assert f"recovery already claimed by {alice} at " in str(err)
    op, wh = f.refresh()
    assert op.recovery_owner == alice
    assert wh.state == "resharding"


@pytest.mark.safeguard("reshard-59")
def test_concurrent_claims_have_one_winner(fenced_failed):
    from concurrent.futures import ThreadPoolExecutor

    def attempt(name: str) -> str:
        try:
            recovery.claim(fenced_failed.op.id, name)
            return name
        except recovery.RecoveryRefused:
            return ""
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        winners = [w for w in pool.map(attempt, [f"op-{i}" for i in range(4)]) if w]
    assert len(winners) == 1
    assert fenced_failed.refresh()[0].recovery_owner == winners[0]


@pytest.mark.safeguard("reshard-59")
def test_force_on_a_fresh_claim_is_refused(fenced_failed):
    f = fenced_failed
    alice = recovery.default_owner("alice")
    recovery.claim(f.op.id, alice)
    err = refused(f.op.id, "--execute", "--force")
    assert f"recovery already claimed by {alice}" in str(err)
    assert "--force takes over only a claim older than 30 minutes" in str(err)
    assert f.refresh()[0].recovery_owner == alice


def _env(op: ReshardOperation, owner: str) -> StepEnv:
    scrubber = process_scrubber()
    ctx = RunContext(op_id=op.id, runner_id=owner, scrubber=scrubber)
    return StepEnv(
        ctx=ctx,
        op=op,
        fence=recovery.RecoveryFencer(ctx, owner),
        log=OpLogWriter(op.id, scrubber, source="recovery"),
    )


@pytest.mark.safeguard("reshard-59")
def test_force_takes_over_a_31_minute_old_claim_and_fences_the_old_owner(fenced_failed):
    f = fenced_failed
    alice = recovery.default_owner("alice")
    recovery.claim(f.op.id, alice)
    alice_env = _env(f.op, alice)
    alice_env.fence.update()  # alice's writes work while she holds the claim
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET recovery_claimed_at = now() - "
            "interval '31 minutes' WHERE id = %s",
            [f.op.id],
        )
    bob = recovery.default_owner("bob")
    assert recovery.claim(f.op.id, bob, force=True) == alice
    assert f.refresh()[0].recovery_owner == bob

    # Alice's next write matches zero rows: Fenced, and her warehouse write rolls back with it.
    with pytest.raises(Fenced):
        alice_env.fence.update()
    with pytest.raises(Fenced):
        rb.unblock(alice_env)
    op, wh = f.refresh()
    assert wh.state == "resharding"
    assert op.unblocked_at is None
    assert (
        ReshardOperation.objects.filter(id=f.op.id, state="failed", recovery_owner=alice).update(
            recovery_outcome="rolled_back"
        )
        == 0
    )
    alice_env.log.close()


@pytest.mark.safeguard("reshard-59")
def test_force_command_takes_over_a_stale_claim_and_recovers(fenced_failed):
    f = fenced_failed
    recovery.claim(f.op.id, "alice@laptop pid 1 dead")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET recovery_claimed_at = now() - "
            "interval '31 minutes' WHERE id = %s",
            [f.op.id],
        )
    out = run(f.op.id, "--execute", "--force", "--as", "bob")
    assert "taken over from alice@laptop pid 1 dead with --force" in out
    op, wh = f.refresh()
    assert wh.state == "ready"
    assert op.recovery_outcome == "rolled_back"
    assert op.recovery_owner == ""


def test_a_claim_lost_mid_recovery_stops_with_exit_2(fenced_failed, monkeypatch):
    """Another operator forces the claim over while the rollback runs: no outcome is recorded,
    the warehouse is not unblocked by the fenced run."""
    f = fenced_failed
    real = rb._restore_source_access

    def steal_then_restore(env: StepEnv) -> bool:
        ReshardOperation.objects.filter(id=f.op.id).update(recovery_owner="carol pid 9 x")
        return real(env)

    monkeypatch.setattr(rb, "_restore_source_access", steal_then_restore)
    err = refused(f.op.id, "--execute")
    assert err.returncode == 2
    op, wh = f.refresh()
    assert wh.state == "resharding"
    assert op.recovery_owner == "carol pid 9 x"
    assert op.recovery_outcome == ""
    assert op.recovery_required is True


@pytest.mark.safeguard("reshard-34")
def test_unverifiable_source_ends_left_blocked_with_exit_3(fenced_failed):
    """The source password reference no longer resolves: the un-fence cannot be verified, so
    the warehouse stays resharding (compaction restored), recovery_required stays true, the
    claim is released and the command exits 3."""
    f = fenced_failed
    ReshardOperation.objects.filter(id=f.op.id).update(
        source_password_secret_ref="env:DUCKGRES_TEST_NO_SUCH_VARIABLE"
    )
    err = refused(f.op.id, "--execute")
    assert err.returncode == 3
    assert "recovery left the warehouse blocked" in str(err)
    op, wh = f.refresh()
    assert wh.state == "resharding"
    assert wh.compaction_enabled is True
    assert op.recovery_outcome == "left_blocked"
    assert op.recovered_at is not None
    assert op.recovery_required is True
    assert op.recovery_owner == ""
    assert op.recovery_claimed_at is None
    text = "\n".join(
        ReshardLogEntry.objects.filter(operation_id=f.op.id).values_list("message", flat=True)
    )
    assert "warehouse intentionally left in the resharding state" in text


@pytest.mark.safeguard("reshard-34")
def test_janitor_force_fail_then_recover(janitor_env, store_clusters, tenant_catalog):
    """The chain an operator meets: a blocked op whose runner died a 4th time is force-failed
    by the janitor (recovery_required), then reshard_recover --execute returns it to ready."""
    catalog = tenant_catalog(store_clusters.source)
    source_store = new_store(store_clusters.source, name=unique("src"))
    target_store = new_store(store_clusters.target, name=unique("tgt"))
    warehouse = new_warehouse(store=source_store, catalog=catalog, state="resharding")
    op = new_op(
        warehouse,
        to_store=target_store,
        state="running",
        step="draining",
        runner_id="duckgres-reshard-op-x",
        runner_epoch=1,
        respawn_attempts=3,
    )
    age_op(op.id, created_at="20 minutes", heartbeat_at="10 minutes", blocked_at="15 minutes")
    make_janitor(FakeLauncher()).reconcile()
    op.refresh_from_db()
    assert op.state == "failed"
    assert op.recovery_required is True
    assert f"reshard_recover {op.id}" in op.error

    plan = run(op.id)
    assert "plan (rollback; commit point not passed):" in plan
    assert "un-fence" not in plan  # draining: the source was never fenced
    out = run(op.id, "--execute")
    assert "outcome rolled_back" in out
    op.refresh_from_db()
    warehouse.refresh_from_db()
    assert warehouse.state == "ready"
    assert warehouse.metadata_store_id == source_store.name
    assert op.recovery_outcome == "rolled_back"
    assert op.recovery_required is False
    assert op.state == "failed"


@pytest.mark.safeguard("reshard-34")
@pytest.mark.safeguard("reshard-76")
def test_execute_rolls_back_cnpg_to_external_dropping_the_partial_copy(
    store_clusters, tenant_catalog
):
    """cnpg→external force-failed in ``verifying`` (before the commit point): the copied
    tables on the external target are dropped with the password resolved from the op's
    reference, the source is un-fenced and the warehouse returns to ready on the source."""
    from tests.fixtures.stores import ducklake_tables

    source = tenant_catalog(store_clusters.source)
    ext = tenant_catalog(store_clusters.target)
    assert ducklake_tables(store_clusters.target, ext.database)
    source_store = new_store(store_clusters.source, name=unique("src"))
    warehouse = new_warehouse(store=source_store, catalog=source, state="resharding")
    op = new_op(
        warehouse,
        state="failed",
        target_kind="external",
        target_endpoint=ext.cluster.host,
        target_port=ext.cluster.port,
        target_sslmode="require",
        target_user=ext.role,
        target_database=ext.database,
        target_password_secret_ref=ext.password_ref,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET step = 'verifying', "
            "blocked_at = now() - interval '10 minutes', "
            "source_fence_requested_at = now() - interval '9 minutes', "
            "source_fenced_at = now() - interval '9 minutes', tables_copied = 5, "
            # the copy claimed the (then empty) external target before its first write
            "target_claimed_at = now() - interval '8 minutes', "
            "source_endpoint = %s, source_port = %s, source_sslmode = %s, "
            "recovery_required = true, runner_id = 'janitor', finished_at = now() WHERE id = %s",
            [source_store.host, source_store.port, source_store.sslmode, op.id],
        )
    _set_login(store_clusters.source, source.role, False)
    out = run(op.id, "--execute")
    assert "outcome rolled_back" in out
    op.refresh_from_db()
    warehouse.refresh_from_db()
    assert warehouse.state == "ready"
    assert warehouse.metadata_store_id == source_store.name
    assert op.recovery_outcome == "rolled_back"
    assert ducklake_tables(store_clusters.target, ext.database) == []
    assert _rolcanlogin(store_clusters.source, source.role)
    text = "\n".join(
        ReshardLogEntry.objects.filter(operation_id=op.id).values_list("message", flat=True)
    )
    assert "partial target table(s)" in text
    assert ext.password not in text
