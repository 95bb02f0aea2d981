"""Steps driven in-process with a claimed run context (fast): drain, compaction, fence,
source drop, progress, stale writes and the rollback's partial-target rule."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db.models.functions import Now
from django.utils import timezone

from duckgres_admin.lib import pgadmin
from duckgres_admin.models import ConnectionLease, MetadataStore, ReshardOperation, Warehouse
from reshard.runner import binding, connections
from reshard.runner.env import StepEnv
from reshard.runner.errors import Fenced, StepError
from reshard.runner.execute import reconstruct
from reshard.runner.hooks import RunnerHooks
from reshard.runner.rollback import rollback
from reshard.runner.steps import (
    access,
    blocking,
    cleanup,
    compaction,
    draining,
    fence_source,
    record_source,
)
from tests.fixtures.runner import (
    CnpgWorld,
    op_log,
    reload,
    role_can_login,
    takeover_bump,
    warehouse_of,
)


def _blocked(env: StepEnv) -> StepEnv:
    blocking.block_warehouse(env)
    record_source.run(env)
    return env


# --- 31: the drain never revokes ------------------------------------------------------------
@pytest.mark.safeguard("reshard-31")
def test_drain_waits_for_a_renewed_lease_and_expires_dead_ones(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = _blocked(claimed_env(cnpg_world.op))
    org = env.op.org_id
    now = timezone.now()
    live = ConnectionLease.objects.create(
        org_id=org,
        holder="worker-1",
        purpose="query",
        state="granted",
        granted_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    dead = ConnectionLease.objects.create(
        org_id=org,
        holder="worker-2",
        purpose="query",
        state="granted",
        granted_at=now - timedelta(minutes=5),
        expires_at=now - timedelta(minutes=1),
    )
    stale_queue = ConnectionLease.objects.create(
        org_id=org,
        holder="worker-3",
        purpose="query",
        state="queued",
        queue_deadline=now - timedelta(seconds=1),
    )
    ReshardOperation.objects.filter(id=env.op.id).update(drain_timeout_seconds=2)
    env.op.drain_timeout_seconds = 2
    with pytest.raises(StepError, match=r"drain timed out after 2 s \(1 active leases, 0 queued"):
        draining.run(env)
    assert ConnectionLease.objects.get(id=live.id).state == "granted"  # never revoked
    assert ConnectionLease.objects.get(id=dead.id).state == "expired"
    assert ConnectionLease.objects.get(id=stale_queue.id).state == "expired"
    # the holder releases: the drain completes
    ConnectionLease.objects.filter(id=live.id).update(state="released", released_at=Now())
    env.op.drain_timeout_seconds = 10
    draining.run(env)
    assert "drained: 0 active leases, 0 queued requests" in op_log(env.op.id)


# --- 30: the prior is tri-state and never overwritten ---------------------------------------
@pytest.mark.safeguard("reshard-30")
@pytest.mark.parametrize(
    ("flag", "prior"),
    [
        (None, {"present": False}),
        (True, {"present": True, "value": True}),
        (False, {"present": True, "value": False}),
    ],
)
def test_compaction_prior_is_recorded_once(
    cnpg_world: CnpgWorld, claimed_env: Any, flag: bool | None, prior: dict[str, Any]
) -> None:
    Warehouse.objects.filter(id=cnpg_world.warehouse.id).update(compaction_enabled=flag)
    env = _blocked(claimed_env(cnpg_world.op))
    compaction.run(env)
    assert reload(env.op).compaction_prior == prior
    assert warehouse_of(env.op).compaction_enabled is False
    compaction.run(env)  # a replay: the paused false is not recorded as the prior
    assert reload(env.op).compaction_prior == prior


# --- 47: stale writes land nothing ----------------------------------------------------------
@pytest.mark.safeguard("reshard-47")
def test_a_stale_compaction_pause_and_binding_switch_write_nothing(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = _blocked(claimed_env(cnpg_world.op))
    takeover_bump(env.op.id)
    with pytest.raises(Fenced):
        compaction.run(env)
    with pytest.raises(Fenced):
        binding.switch(env, binding.target_binding(env.op), what="switch")
    wh = warehouse_of(env.op)
    assert wh.compaction_enabled is True
    assert wh.metadata_store_id == cnpg_world.source_store.name
    assert reload(env.op).compaction_prior is None


# --- 55: progress writes are fenced -------------------------------------------------------------
@pytest.mark.safeguard("reshard-55")
def test_progress_writes_merge_with_database_time_and_are_fenced(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    hooks = RunnerHooks(env, progress_keys=("tables_done",))
    hooks.progress({"tables_total": 5, "tables_done": 1})
    progress = reload(env.op).progress
    assert progress["tables_total"] == 5
    assert progress["tables_done"] == 1
    assert progress["updated_at"]
    assert reload(env.op).rows_copied == 0  # the column stays success-only
    takeover_bump(env.op.id)
    with pytest.raises(Fenced):
        hooks.progress({"tables_done": 2})


# --- 9 (unit), 15, 21: access and fence -----------------------------------------------------
@pytest.mark.safeguard("reshard-15")
def test_unreadable_provisioner_credential_fails_before_alter_role(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = _blocked(claimed_env(cnpg_world.op))
    access.run(env)
    MetadataStore.objects.filter(name=cnpg_world.source_store.name).update(
        provisioner_password_ref="env:DUCKGRES_TEST_NO_SUCH_VARIABLE"
    )
    with pytest.raises(StepError, match="cannot resolve the provisioner password"):
        fence_source.run(env)
    assert reload(env.op).source_fence_requested_at is None
    assert role_can_login(cnpg_world.catalog.cluster, cnpg_world.catalog.role) is True


@pytest.mark.safeguard("reshard-15")
def test_fence_uses_the_direct_endpoint_even_with_a_pooler(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any
) -> None:
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 10
    MetadataStore.objects.filter(name=cnpg_world.source_store.name).update(
        pooler_host="127.0.0.1",
        pooler_port=1,  # nothing listens there
    )
    env = _blocked(claimed_env(cnpg_world.op))
    access.run(env)
    tenant = cnpg_world.catalog.tenant_conn()  # a live tenant session to terminate
    try:
        fence_source.run(env)
    finally:
        tenant.close()
    op = reload(env.op)
    assert op.source_fence_requested_at is not None
    assert op.source_fenced_at is not None
    assert role_can_login(cnpg_world.catalog.cluster, cnpg_world.catalog.role) is False


@pytest.mark.safeguard("reshard-21")
def test_an_ineffective_alter_role_never_marks_the_source_fenced(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ALTER ROLE has no effect (as for a provisioner without ADMIN on the role): the
    step fails with the observation and ``source_fenced_at`` stays null."""
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 2
    env = _blocked(claimed_env(cnpg_world.op))
    access.run(env)
    role = cnpg_world.catalog.role
    monkeypatch.setattr(
        fence_source, "alter_nologin", lambda conn, tenant: conn.execute("SELECT 1")
    )
    with pytest.raises(StepError) as raised:
        fence_source.run(env)
    assert f"tenant role {role} is LOGIN in pg_roles" in str(raised.value)
    op = reload(env.op)
    assert op.source_fence_requested_at is not None
    assert op.source_fenced_at is None


# --- 4: an empty source database name is never dropped ------------------------------------------
@pytest.mark.safeguard("reshard-4")
def test_an_empty_source_database_name_sends_no_drop(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = _blocked(claimed_env(cnpg_world.op))
    env.op.source_database = ""
    cleanup.drop_source(env)
    assert any(
        line.startswith("source database name is empty: skipping DROP DATABASE")
        for line in op_log(env.op.id)
    )
    assert reload(env.op).source_dropped_at is None
    with cnpg_world.catalog.cluster.superuser_conn() as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [cnpg_world.catalog.database]
        ).fetchone()
    assert row is not None


# --- 49: the partial target is dropped only when the binding is back on the source ----------
def _copied_target(world: CnpgWorld, env: StepEnv) -> None:
    """Render the tenant on the target with one ducklake table, flip, record a copy."""
    from reshard.runner.steps import cutover

    prov = connections.provisioner(env.ctx, world.target_store.name)
    cutover.render_target(env, prov, world.catalog.password)
    with psycopg.connect(
        host=world.target_store.host,
        port=world.target_store.port,
        user="postgres",
        dbname=world.catalog.database,
        sslmode="require",
        autocommit=True,
    ) as conn:
        conn.execute(f'SET ROLE "{world.catalog.role}"')
        conn.execute("CREATE TABLE ducklake_snapshot (snapshot_id bigint)")
    env.fence.update(
        target_rendered_at=Now(), target_claimed_at=Now(), tables_copied=1, step="copying"
    )  # as the cutover records it
    binding.switch(env, binding.target_binding(env.op), what="switch")
    env.op.refresh_from_db()
    env.ctx.progress = reconstruct(env.op)


def _target_tables(world: CnpgWorld) -> list[str]:
    with psycopg.connect(
        host=world.target_store.host,
        port=world.target_store.port,
        user="postgres",
        dbname=world.catalog.database,
        sslmode="require",
        autocommit=True,
    ) as conn:
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'ducklake%'"
            )
        ]


@pytest.mark.safeguard("reshard-49")
def test_failed_flip_back_keeps_the_target_tables_and_stays_blocked(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 2
    env = _blocked(claimed_env(cnpg_world.op))
    _copied_target(cnpg_world, env)

    def broken(*_: Any, **__: Any) -> None:
        raise StepError("flip-back: injected failure")

    monkeypatch.setattr(binding, "switch", broken)
    outcome = rollback(env)
    assert outcome.left_blocked is True
    assert outcome.recovered is False
    assert _target_tables(cnpg_world) == ["ducklake_snapshot"]
    lines = op_log(env.op.id)
    assert "rollback: binding may still point at the target — its tables are kept" in lines
    assert any(line.startswith("warehouse intentionally left in the resharding") for line in lines)
    wh = warehouse_of(env.op)
    assert wh.state == "resharding"
    assert wh.metadata_store_id == cnpg_world.target_store.name


@pytest.mark.safeguard("reshard-49")
def test_working_flip_back_drops_the_target_tables_and_unblocks(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any
) -> None:
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 10
    env = _blocked(claimed_env(cnpg_world.op))
    _copied_target(cnpg_world, env)
    outcome = rollback(env)
    assert outcome.recovered is True
    assert _target_tables(cnpg_world) == []
    wh = warehouse_of(env.op)
    assert (wh.state, wh.metadata_store_id) == ("ready", cnpg_world.source_store.name)
    # the rendered target tenant is left NOLOGIN
    with psycopg.connect(
        host=cnpg_world.target_store.host,
        port=cnpg_world.target_store.port,
        user="postgres",
        dbname="postgres",
        sslmode="require",
        autocommit=True,
    ) as conn:
        row = conn.execute(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [cnpg_world.catalog.role]
        ).fetchone()
    assert row == (False,)


def test_classified_auth_failure_names_the_remedy_with_a_placeholder() -> None:
    exc = psycopg.OperationalError('FATAL:  password authentication failed for user "t"')
    text = connections.classify(exc, role="t", ref="env:X", where="store s")
    assert "ALTER ROLE t WITH PASSWORD '<the password in secret env:X>'" in text
    assert pgadmin.is_auth_failure(exc)
    refused = psycopg.OperationalError("connection refused")
    assert connections.classify(refused, role="t", ref="env:X", where="s").startswith("probe of s")


@pytest.mark.safeguard("reshard-48")
def test_a_store_error_on_the_pre_statement_heartbeat_sends_no_alter_role(
    cnpg_world: CnpgWorld, claimed_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    env = _blocked(claimed_env(cnpg_world.op))
    access.run(env)

    def broken() -> None:
        raise OperationalError("injected store error")

    monkeypatch.setattr(env.fence, "pre_statement_heartbeat", broken)
    with pytest.raises(OperationalError):
        fence_source.run(env)
    assert role_can_login(cnpg_world.catalog.cluster, cnpg_world.catalog.role) is True


def test_a_rollback_wait_past_the_sigterm_budget_leaves_no_verdict(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any
) -> None:
    from reshard.runner import waits
    from reshard.runner.errors import Interrupted

    settings.DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS = 1
    env = claimed_env(cnpg_world.op)
    env.ctx.request_stop("SIGTERM")
    started = time.monotonic()
    with pytest.raises(Interrupted, match="rollback ran out of the SIGTERM budget"):
        waits.poll_until(
            env.ctx,
            env.log,
            900,
            lambda: (False, "not yet"),
            purpose="for a test",
            timeout_message="never",
            cancel_aware=False,
            rollback=True,
        )
    assert time.monotonic() - started < 10
