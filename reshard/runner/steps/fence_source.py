"""Step E ``fencing_source`` (cnpg sources; spec §4.4 E; safeguards 15, 19, 21, 48).

``source_fence_requested_at`` is committed **before** ``ALTER ROLE … NOLOGIN`` is sent (a crash
in between still un-fences on rollback). Everything runs on the store's **direct** endpoint as
the provisioner (never NOLOGIN itself), database ``postgres``. The pre-statement heartbeat
precedes ``ALTER ROLE`` and every ``pg_terminate_backend`` batch. ``source_fenced_at`` only
after ``pg_roles`` shows NOLOGIN and zero tenant backends remain (positive observation).

Before anything is recorded or sent, on the same connection: the source catalog is no other
live warehouse's (fencing would end that warehouse's sessions) and the tenant role passes
:func:`reshard.engines.identity.tenant_role_message` (never the provisioner, ``postgres``, a
``pg_*`` or privileged role, or a role another warehouse uses); a refusal fails the op pre-flip with
nothing sent.

Idempotent for a takeover redoing the steps (safeguard reshard-73): ``COALESCE`` keeps the first
``source_fence_requested_at``; a tenant role already NOLOGIN (this op's earlier fence: the
request was recorded before ``ALTER ROLE`` was sent) gets ``ALTER ROLE … NOLOGIN`` again (a
no-op in PostgreSQL), the NOLOGIN observation passes at once and the backends are terminated
and counted again.
"""

from __future__ import annotations

import psycopg
from django.db.models.functions import Coalesce, Now
from psycopg import sql

from reshard.engines import identity, testhooks
from reshard.runner import connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError

TERMINATE_POLL_SECONDS = 0.25

_BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE usename = %s AND datname = %s "
    "AND pid <> pg_backend_pid()"
)


def alter_nologin(conn: connections.PgConn, tenant: str) -> None:
    conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(tenant)))


def check_source_identity(
    env: StepEnv, conn: connections.PgConn, prov: connections.Provisioner
) -> None:
    """The fence's preconditions on the catalog and the role (StepError, nothing sent)."""
    op = env.op
    shared = identity.shared_catalog_message(
        org_id=op.org_id, database=op.source_database, store=prov.store
    )
    if shared:
        raise StepError(
            f"{shared}: refusing to fence role {op.source_user} (it would end that warehouse's "
            "sessions); give each warehouse its own catalog, then start a new operation"
        )
    refusal = identity.op_role_refusal(conn, op, "source", prov.store)
    if refusal:
        raise StepError(f"{refusal}; refusing to fence it")


def run(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    if op.source_access_verified_at is None and not ctx.progress.source_access_verified:
        raise StepError("source access was never verified; refusing to fence the source")
    prov = connections.provisioner(ctx, op.from_shard)  # fail closed before anything is sent
    tenant, database = op.source_user, op.source_database
    timeout = waits.full_source_timeout()
    try:
        with connections.provisioner_conn(ctx, prov) as conn:
            check_source_identity(env, conn, prov)
            earlier = op.source_fence_requested_at is not None
            env.fence.update(source_fence_requested_at=Coalesce("source_fence_requested_at", Now()))
            if earlier and connections.role_state(conn, tenant) is False:
                env.log.info(
                    f"tenant role {tenant} is already NOLOGIN on store {prov.store.name} (this "
                    "operation's earlier fence); fencing again"
                )
            ctx.progress.fence_requested = True
            env.fence.pre_statement_heartbeat()
            alter_nologin(conn, tenant)
            env.log.info(f"ALTER ROLE {tenant} NOLOGIN sent on store {prov.store.name} (direct)")
            testhooks.kill_point("after_nologin")

            def nologin() -> tuple[bool, str]:
                state = connections.role_state(conn, tenant)
                shown = {None: "missing", True: "LOGIN", False: "NOLOGIN"}[state]
                return state is False, f"tenant role {tenant} is {shown} in pg_roles"

            waits.poll_until(
                ctx,
                env.log,
                timeout,
                nologin,
                purpose=f"for tenant role {tenant} to show NOLOGIN on store {prov.store.name}",
                timeout_message=(
                    f"tenant role {tenant} on store {prov.store.name} did not become NOLOGIN "
                    f"within {timeout:g} s (does the provisioner have ADMIN on the role?)"
                ),
            )
            env.log.info(f"observed tenant role {tenant} NOLOGIN; terminating its sessions")

            def terminated() -> tuple[bool, str]:
                pids = [int(str(r[0])) for r in conn.execute(_BACKENDS, [tenant, database])]
                if not pids:
                    return True, "0 tenant backends"
                env.fence.pre_statement_heartbeat()
                for pid in pids:
                    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                return False, f"{len(pids)} tenant backends on {database}"

            waits.poll_until(
                ctx,
                env.log,
                timeout,
                terminated,
                purpose=f"for zero {tenant} backends on {database}",
                timeout_message=f"tenant sessions on {database} did not end within {timeout:g} s",
                interval=TERMINATE_POLL_SECONDS,
            )
    except psycopg.Error as exc:
        raise StepError(f"fencing the source on store {prov.store.name} failed: {exc}") from None
    env.fence.update(source_fenced_at=Now())
    env.log.info(
        f"source fenced: tenant role {tenant} NOLOGIN and 0 backends on {database} "
        f"(store {prov.store.name})"
    )
