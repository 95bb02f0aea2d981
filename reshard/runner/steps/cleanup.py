"""Steps K/O ``cleaning_up``, L ``orphaning_source`` and N ``verifying_external``
(spec §4.4 K, L, N, O; safeguards 4, 12, 15, 16).

The source ``DROP DATABASE … WITH (FORCE)`` (plain on PostgreSQL 12, which has no FORCE) runs
on the source's **direct** endpoint, database ``postgres``, as the provisioner after
``SET ROLE`` tenant, after the pre-statement heartbeat,
and only after the commit point is durable (``source_drop_committed_at`` for →cnpg,
``external_verified_at`` for →external), once the sessions still on the database have left
(bounded; the runner's own copy and ``pg_dump`` sessions exit asynchronously, and the tenant role
may not end them; safeguard reshard-135). An empty database name is never sent (ERROR, skip), nor
is the drop of a catalog another live warehouse is bound to (ERROR naming it, skip: the bindings
are re-read right before the statement). A failed drop is an ERROR, not fatal. The tenant role
on the source stays NOLOGIN, never dropped — unless the kind says otherwise after the drop
(``Kind.after_source_drop``: an in-place restore's one role logs in again to the restored
catalog, :func:`reshard.runner.steps.inplace.open_tenant`).
"""

from __future__ import annotations

import psycopg
from django.db.models.functions import Coalesce, Now

from duckgres_admin.lib import pgadmin
from reshard.engines import identity, testhooks
from reshard.runner import connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError
from reshard.runner.kind import kind_of
from reshard.runner.steps.copying import release_handle

DROP_SETTLE_SECONDS = 15.0  # how long the drop waits for the runner's own sessions to leave
DROP_SETTLE_POLL_SECONDS = 0.2
_SESSIONS_ON = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"


def run(env: StepEnv) -> None:
    op = env.op
    if op.target_kind == "external":
        release_handle(env)
        drop_source(env)
        return
    if op.source_kind == "external":
        env.log.info("external source left untouched (never deleted)")
        release_handle(env)
        return
    if keep_source(env):
        return
    env.fence.update(source_drop_committed_at=Coalesce("source_drop_committed_at", Now()))
    op.refresh_from_db(fields=["source_drop_committed_at"])
    env.log.info("commit point reached: all subsequent failures roll forward")
    release_handle(env)
    drop_source(env)
    kind_of(op).after_source_drop(env)


def keep_source(env: StepEnv) -> bool:
    """True (the fence released, the reason recorded and logged) when the kind keeps the
    source instead of dropping it (``Kind.keep_source``: the online mode after its unblock,
    without a passed comparison or a backup)."""
    reason = kind_of(env.op).keep_source(env)
    if not reason:
        return False
    release_handle(env)
    env.fence.update(source_kept_reason=reason)
    env.op.source_kept_reason = reason
    env.log.error(
        f"the source database {env.op.source_database} on store {env.op.from_shard} is kept, "
        f"its tenant role NOLOGIN, instead of dropped: {reason}"
    )
    return True


def drop_source(env: StepEnv) -> None:
    """Drop the cnpg source database (idempotent ``IF EXISTS``); never fatal."""
    op, ctx = env.op, env.ctx
    database = op.source_database
    if not database:
        env.log.error(
            "source database name is empty: skipping DROP DATABASE (nothing sent); check the "
            f"source on store {op.from_shard} manually"
        )
        return
    try:
        prov = connections.provisioner(ctx, op.from_shard)
        shared = identity.shared_catalog_message(
            org_id=op.org_id, database=database, store=prov.store
        )
        if shared:
            env.log.error(
                f"source database must be dropped manually once it is no longer shared: "
                f"{shared}, so DROP DATABASE was not sent (nothing was deleted); decide which "
                "warehouse owns it before dropping anything"
            )
            return
        with connections.provisioner_conn(ctx, prov, role=op.source_user) as conn:
            let_sessions_end(env, conn, database)
            env.fence.pre_statement_heartbeat()
            conn.execute(pgadmin.drop_database(database, conn.info.server_version))
            testhooks.kill_point("after_source_drop")
            gone = not connections.database_exists(conn, database)
    except (psycopg.Error, StepError) as exc:
        env.log.error(
            f"source database must be dropped manually: DROP DATABASE {database} on store "
            f"{op.from_shard} failed: {exc}"
        )
        return
    if not gone:
        env.log.error(
            f"source database must be dropped manually: {database} still exists on store "
            f"{op.from_shard} after DROP DATABASE"
        )
        return
    env.fence.update(source_dropped_at=Now())
    op.refresh_from_db(fields=["source_dropped_at"])
    role = kind_of(op).source_role_after_drop
    env.log.info(
        f"source database {database} dropped on store {op.from_shard} (tenant role "
        f"{op.source_user} {role})"
    )


def let_sessions_end(env: StepEnv, conn: connections.PgConn, database: str) -> None:
    """Wait, bounded by ``DROP_SETTLE_SECONDS``, for the sessions still on ``database`` to end.

    The tenant's sessions ended at the fence, but the runner's own copy, verification and
    ``pg_dump`` sessions leave asynchronously after their clients close. The drop runs as the
    tenant role, which may not terminate a provisioner's backend, so a ``WITH (FORCE)`` sent while
    one of them is still exiting fails. Past the commit point a cancel is not honoured, so this
    wait does not read it. On timeout the drop is sent anyway: FORCE ends what it may, and its
    error names what it may not.
    """

    def observe() -> tuple[bool, str]:
        row = conn.execute(_SESSIONS_ON, [database]).fetchone()
        count = int(str(row[0])) if row else 0
        return count == 0, f"{count} sessions on {database}"

    done, observation = observe()
    if done:
        return
    env.log.info(f"{observation} before DROP DATABASE; letting them end")
    try:
        waits.poll_until(
            env.ctx,
            env.log,
            DROP_SETTLE_SECONDS,
            observe,
            purpose=f"for the sessions on {database} to end",
            timeout_message=f"sessions on {database} did not end",
            cancel_aware=False,
            interval=DROP_SETTLE_POLL_SECONDS,
        )
    except StepError as exc:
        env.log.warn(f"{exc}; sending DROP DATABASE … WITH (FORCE) anyway")


def run_orphaning(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    try:
        prov = connections.provisioner(ctx, op.from_shard)
        with connections.provisioner_conn(ctx, prov) as conn:
            present = connections.database_exists(conn, op.source_database)
            login = connections.role_state(conn, op.source_user)
    except psycopg.Error as exc:
        raise StepError(f"cannot observe the source on store {op.from_shard}: {exc}") from None
    if not present or login is not False:
        raise StepError(
            f"source catalog not retained on store {op.from_shard}: database "
            f"{op.source_database} {'present' if present else 'missing'}, tenant role "
            f"{op.source_user} " + {None: "missing", True: "LOGIN", False: "NOLOGIN"}[login]
        )
    env.log.info(f"source catalog retained on {op.from_shard} until the external copy is verified")


def run_verifying_external(env: StepEnv) -> None:
    op = env.op
    env.log.info(
        f"source and target COPY row counts matched for {op.tables_copied} tables; the "
        "external target serves the binding"
    )
    env.fence.update(external_verified_at=Coalesce("external_verified_at", Now()))
    op.refresh_from_db(fields=["external_verified_at"])
    env.log.info("commit point reached (external verified): all subsequent failures roll forward")
