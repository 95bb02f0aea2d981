"""No runner statement can block forever (safeguard reshard-67).

Every metadata-store connection the runner opens carries ``statement_timeout`` and
``lock_timeout`` sized from the step's deadline (``RunContext.statement_seconds``), ``pg_dump``
gets ``--lock-wait-timeout``, and a stop request (SIGTERM) or an operator cancel before the
cutoff cancels the running statement through its cancel key instead of waiting for it. The
sessions holding locks here are real ones on the real store clusters, outside the product (the
superuser: the fence never terminates them).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.runner import connections
from reshard.runner.context import MIN_STATEMENT_SECONDS
from reshard.runner.errors import Interrupted
from tests.fixtures.runner import (
    CnpgWorld,
    RunnerS3,
    claimed_env,
    cnpg_world,
    op_log,
    reload,
    role_can_login,
    run_runner,
    runner_moto_server,
    runner_s3,
    start_runner,
    wait_until,
    warehouse_of,
)
from tests.fixtures.stores import StoreCluster, TenantCatalogFactory

__all__ = ["claimed_env", "cnpg_world", "runner_moto_server", "runner_s3"]  # fixtures used here

pytestmark = pytest.mark.safeguard("reshard-66")


def _timeouts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'), "
        "(SELECT setting::int FROM pg_settings WHERE name = 'lock_timeout')"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.fixture
def lock_holder() -> Iterator[Any]:
    """Factory: hold ACCESS EXCLUSIVE on ``table`` of ``database`` in an open transaction of a
    superuser session (outside the product) until the test ends."""
    held: list[psycopg.Connection[Any]] = []

    def hold(cluster: StoreCluster, database: str, table: str) -> psycopg.Connection[Any]:
        conn = cluster.superuser_conn(database)
        conn.execute("BEGIN")
        conn.execute(
            sql.SQL("LOCK TABLE public.{} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table))
        )
        held.append(conn)
        return conn

    yield hold
    for conn in held:
        conn.close()


def _waiting(cluster: StoreCluster, application: str) -> list[str]:
    """Queries of ``application`` waiting for a lock on ``cluster``."""
    with cluster.superuser_conn() as conn:
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT query FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock'",
                (application,),
            )
        ]


def test_store_connections_carry_timeouts_sized_from_the_step_deadline(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any
) -> None:
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 40
    settings.DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS = 20
    env = claimed_env(cnpg_world.op)
    ctx = env.ctx
    prov = connections.provisioner(ctx, cnpg_world.source_store.name)
    ctx.current_step = "copying"
    with connections.provisioner_conn(ctx, prov) as conn:
        statement, lock = _timeouts(conn)
    assert 35_000 < statement <= 40_000
    assert lock == int(statement * 0.9) or abs(lock - statement * 0.9) < 5
    # A wait with a later deadline inside the step gives its statements that time.
    ctx.extend_deadline(time.monotonic() + 100)
    with connections.provisioner_conn(ctx, prov, dbname=cnpg_world.catalog.database) as conn:
        assert 95_000 < _timeouts(conn)[0] <= 100_000
    # After SIGTERM everything is capped by the SIGTERM budget (the rollback must end in time).
    ctx.request_stop("SIGTERM")
    with connections.provisioner_conn(ctx, prov) as conn:
        assert 15_000 < _timeouts(conn)[0] <= 20_000
    # Past the deadline a statement still gets a bounded, non-zero timeout (0 means none).
    ctx.sigterm_at = time.monotonic() - 3600
    with connections.provisioner_conn(ctx, prov) as conn:
        assert _timeouts(conn) == (int(MIN_STATEMENT_SECONDS * 1000),
                                   int(MIN_STATEMENT_SECONDS * 900))  # fmt: skip


def test_request_stop_from_another_thread_cancels_a_running_statement(
    cnpg_world: CnpgWorld, claimed_env: Any, settings: Any
) -> None:
    settings.DUCKGRES_RESHARD_FLIP_TIMEOUT = 120
    env = claimed_env(cnpg_world.op)
    ctx = env.ctx
    prov = connections.provisioner(ctx, cnpg_world.source_store.name)
    ctx.current_step = "fencing_source"
    threading.Timer(0.5, ctx.request_stop, ("SIGTERM",)).start()
    started = time.monotonic()
    with pytest.raises(Interrupted), connections.provisioner_conn(ctx, prov) as conn:
        conn.execute("SELECT pg_sleep(60)")
    assert time.monotonic() - started < 5
    # The rollback's own statements (connections opened after the stop) are not cancelled.
    with connections.provisioner_conn(ctx, prov) as conn:
        conn.execute("SELECT pg_sleep(0.5)")


def test_a_lock_held_outside_the_product_fails_the_op_within_the_bound_and_rolls_back(
    cnpg_world: CnpgWorld, runner_state_dir: Any, lock_holder: Any, runner_s3: RunnerS3
) -> None:
    """A session holds ACCESS EXCLUSIVE on a source catalog table: ``pg_dump`` gives up after
    its lock wait (the backup is optional cnpg→cnpg), the copy's write fence gets
    ``lock_timeout`` (55P03) and the operation rolls back cleanly; nothing waits forever."""
    op = cnpg_world.op
    catalog = cnpg_world.catalog
    Warehouse.objects.filter(org_id=op.org_id).update(data_bucket=runner_s3.bucket)
    lock_holder(catalog.cluster, catalog.database, "ducklake_snapshot")
    started = time.monotonic()
    runner = run_runner(
        op.id, runner_state_dir, timeout=150, env_extra=runner_s3.env(),
        DUCKGRES_RESHARD_FLIP_TIMEOUT="6",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    op = reload(op)
    lines = op_log(op.id)
    assert runner.proc.returncode == 0, runner.output()
    assert op.state == "failed", (op.error, "\n".join(lines))
    assert "acquiring the source write fence" in op.error
    assert "lock timeout" in op.error
    assert "55P03" in op.error
    # The backup, beside the copy, waited on the same lock: either its own lock wait gave up
    # first, or the rollback stopped it; either way nothing is left waiting (checked below).
    ended = ("catalog backup failed: pg_dump", "stopping the catalog backup running beside")
    assert any(line.startswith(ended) for line in lines), "\n".join(lines)
    assert elapsed < 120
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", cnpg_world.source_store.name)
    assert role_can_login(catalog.cluster, catalog.role) is True
    assert _waiting(catalog.cluster, f"duckgres-reshard-op-{op.id}") == []


def test_sigterm_cancels_a_statement_waiting_on_a_lock(
    cnpg_world: CnpgWorld,
    runner_state_dir: Any,
    lock_holder: Any,
    store_clusters: Any,
    tenant_catalog: TenantCatalogFactory,
) -> None:
    """The copy waits for a lock a session holds on the target; SIGTERM cancels the waiting
    statement at once (its lock_timeout is minutes away) and the runner rolls back."""
    op = cnpg_world.op
    catalog = cnpg_world.catalog
    target = tenant_catalog(
        store_clusters.target, name=catalog.role, password=catalog.password, with_tables=False
    )
    # The target is adopted only empty (safeguard reshard-108): the table the copy will wait
    # on is created and locked while the runner pauses after the flip.
    runner = start_runner(
        op.id, runner_state_dir, DUCKGRES_RESHARD_FLIP_TIMEOUT="300",
        DUCKGRES_RESHARD_TEST_HOOKS="1", DUCKGRES_RESHARD_TEST_PAUSE_AT="after_flip",
        DUCKGRES_RESHARD_TEST_PAUSE_SECONDS="6",
    )  # fmt: skip
    wait_until(
        lambda: reload(op).target_claimed_at is not None or runner.proc.poll() is not None,
        timeout=90,
        what="the flip onto the claimed target",
    )
    assert runner.proc.poll() is None, runner.output()
    with target.cluster.superuser_conn(target.database) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(target.role)))
        conn.execute("CREATE TABLE ducklake_snapshot (snapshot_id bigint)")
    lock_holder(target.cluster, target.database, "ducklake_snapshot")
    app = f"duckgres-reshard-op-{op.id}"
    wait_until(
        lambda: bool(_waiting(target.cluster, app)) or runner.proc.poll() is not None,
        timeout=90,
        what="the copy to wait for the target lock",
    )
    assert runner.proc.poll() is None, runner.output()
    assert reload(op).step == "copying"
    signalled = time.monotonic()
    runner.proc.send_signal(signal.SIGTERM)
    assert runner.wait(60) == 0, runner.output()
    assert time.monotonic() - signalled < 30
    op = reload(op)
    assert (op.state, op.error) == ("failed", "runner received SIGTERM during step copying")
    assert _waiting(target.cluster, app) == []
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_id) == ("ready", cnpg_world.source_store.name)


def test_an_operator_cancel_interrupts_pg_dump_waiting_on_a_lock(
    cnpg_world: CnpgWorld, runner_state_dir: Any, lock_holder: Any, runner_s3: RunnerS3
) -> None:
    """``backup_catalog`` precedes every cancel cutoff: a cancel kills ``pg_dump`` while it
    waits for a lock (its lock wait is minutes away) and the op ends ``cancelled``. The backup
    runs alone in its step here (``DUCKGRES_RESHARD_BACKUP_OVERLAP=false``): the step's own
    cancel watch is what is checked; the backup beside the copy is stopped by the rollback
    (tests/reshard/test_backup_overlap.py)."""
    op = cnpg_world.op
    catalog = cnpg_world.catalog
    Warehouse.objects.filter(org_id=op.org_id).update(data_bucket=runner_s3.bucket)
    lock_holder(catalog.cluster, catalog.database, "ducklake_snapshot")
    runner = start_runner(
        op.id,
        runner_state_dir,
        env_extra=runner_s3.env(),
        DUCKGRES_RESHARD_FLIP_TIMEOUT="300",
        DUCKGRES_RESHARD_BACKUP_OVERLAP="false",
    )
    dump = f"duckgres-reshard-op-{op.id}-pg_dump"
    wait_until(
        lambda: bool(_waiting(catalog.cluster, dump)) or runner.proc.poll() is not None,
        timeout=90,
        what="pg_dump to wait for the source lock",
    )
    assert runner.proc.poll() is None, runner.output()
    ReshardOperation.objects.filter(id=op.id).update(cancel_requested=True)
    cancelled = time.monotonic()
    assert runner.wait(60) == 0, runner.output()
    assert time.monotonic() - cancelled < 30
    op = reload(op)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator"), op_log(op.id)
    # pg_dump was killed and its server session ended: no backend is left waiting for the lock.
    assert _waiting(catalog.cluster, dump) == []
    assert "cancel requested: interrupting the running statements of the step" in op_log(op.id)
    assert warehouse_of(op).state == "ready"
    assert role_can_login(catalog.cluster, catalog.role) is True
