"""A restore onto the store the warehouse is on (``ReshardOperation.in_place``; docs/restore.md
"Onto the current store").

On one server the tenant role is shared by the live catalog and the restored one, so the
reshard's own way — render the role with LOGIN on the target, keep the source's NOLOGIN — does
not apply. An in-place restore instead:

1. ``cutover`` (:func:`run_cutover`): creates the **login role** of this operation
   (``reshard.engines.restore.stream.login_role_name``: ``duckgres_restore_<installation>_op<id>``,
   NOLOGIN, ``CONNECTION LIMIT 2``, a member of the tenant role and nothing else, granted to the
   provisioner so that it can administer it on every version) and the sibling database
   (``target_database``, owned by the tenant), then flips the binding to the sibling. The
   tenant role stays NOLOGIN: the fence holds on both databases.
2. ``copying``/``verifying`` (``restoring``): log in as the login role with a password made
   fresh by each runner (:func:`login_side`, never stored anywhere but this process) and
   ``SET ROLE`` to the tenant, so every restored object belongs to the tenant and an archive
   that resets the role gets the login role's rights — the tenant's — never the provisioner's.
   Before the first login and again when ``pg_restore`` ends, the provisioner voids what an
   archive may have changed on the role (settings, password) and ends its other sessions.
3. ``cleaning_up``: the reshard's commit point and the drop of the replaced catalog, then
   :func:`open_tenant`: the login role dropped by the provisioner, naming it
   (:func:`retire_login_role`: whatever it owns in any database handed to the tenant first),
   ``ALTER ROLE <tenant> LOGIN``, and a tenant ``SELECT 1`` on the restored catalog through
   the tenant endpoint (``target_login_ready_at``). A roll-forward runs it again.

Invariants:

- **The tenant never logs in while two catalogs are its.** LOGIN is given back only after the
  commit point and the drop of the replaced catalog (or its ERROR, logged): until then only the
  login role, whose password only the runner holds, reaches either database.
- **Cancel until the commit point.** Nothing irreversible happens before ``cleaning_up``: a
  cancel is honoured through the restore and the verification
  (``reshard.runner.execute.before_cancel_cutoff``), and kills a running ``pg_restore``.
- **Rollback leaves nothing of its own, or stays blocked** (:func:`drop_sibling`): once the
  binding names the source again, the sibling database is dropped — only when this operation
  claimed it (``target_claimed_at``, recorded once its plain ``CREATE DATABASE`` succeeded; an
  existing database is refused, never adopted) — and the login role
  with it; the source's
  un-fence is the reshard's, and only once the binding names the source. What cannot be
  dropped leaves the warehouse blocked for ``reshard_recover``.
- **The login role is always named**, never ``CURRENT_USER``: an archive can change the
  defaults of the sessions it runs in, and none of the runner's statements about the role run
  in those sessions. Both are decided by observation, never by milestones (a runner killed between
  creating the role and recording ``target_rendered_at`` leaves the role; the rollback finds
  it).
- **Every statement on a role or a database is preceded by the fenced heartbeat**, and the
  tenant-role identity rules hold with the sibling as the role's one other database.
"""

from __future__ import annotations

import contextlib
import secrets

import psycopg
from django.db.models.functions import Coalesce, Now
from psycopg import sql

from reshard.engines import identity, testhooks
from reshard.engines.restore.stream import login_role_name
from reshard.runner import binding, connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.steps import restoring

# The login role's sessions at most: a runner's lock connection and its pg_restore. An archive
# that sets the role's password finds no free slot while the restore runs, and whatever it set
# is voided (password, per-role and per-database settings) before each of the runner's logins.
LOGIN_CONNECTION_LIMIT = 2
END_SESSIONS_SECONDS = 30.0
_LOGIN_SESSIONS = (
    "SELECT pid FROM pg_catalog.pg_stat_activity WHERE usename = %s AND pid <> ALL(%s)"
)
_DEPENDENT_DATABASES = (
    "SELECT DISTINCT d.datname FROM pg_catalog.pg_shdepend s "
    "JOIN pg_catalog.pg_database d ON d.oid = s.dbid "
    "WHERE s.refclassid = 'pg_catalog.pg_authid'::regclass AND s.refobjid = "
    "(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = %s) ORDER BY 1"
)


def render(env: StepEnv, prov: connections.Provisioner) -> None:
    """The login role (NOLOGIN for now) and the empty sibling database owned by the tenant."""
    op, ctx = env.op, env.ctx
    login, tenant, sibling = login_role_name(op), op.target_user, op.target_database
    with connections.provisioner_conn(ctx, prov) as conn:
        refusal = identity.op_role_refusal(conn, op, "target", prov.store)
        if refusal:
            raise StepError(f"{refusal}; refusing to restore in place")
        owner = identity.database_owner_message(
            conn, database=sibling, tenant_role=tenant, store_name=prov.store.name
        )
        if owner:
            raise StepError(owner)
        if connections.database_exists(conn, sibling):
            # The name is drawn per start, so an existing one is a stranger's (or a leftover
            # no claim of this operation covers): never adopted, and never dropped by the
            # rollback (no claim is recorded for it).
            raise StepError(
                f"database {sibling} already exists on store {prov.store.name} and is not this "
                "operation's: an in-place restore creates its sibling database and never adopts "
                "one; nothing was created — start the restore again (a new start draws a new "
                "name) or drop that database"
            )
        env.fence.pre_statement_heartbeat()
        # Never adopted: the cutover runs once per operation (a takeover at it rolls back, and
        # the rollback drops the role), so an existing one is not this operation's.
        conn.execute(
            sql.SQL("CREATE ROLE {} NOLOGIN CONNECTION LIMIT {}").format(
                sql.Identifier(login), sql.Literal(LOGIN_CONNECTION_LIMIT)
            )
        )
        for role, member in ((tenant, login), (login, prov.store.provisioner_user)):
            conn.execute(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(member))
            )
        # The provisioner administers the login role through its privileges (ending its
        # sessions, reassigning what it owns): ADMIN alone does not give them on 16+.
        usage = conn.execute(
            "SELECT pg_catalog.pg_has_role(current_user, %s, 'USAGE')", [login]
        ).fetchone()
        if not usage or not usage[0]:
            raise StepError(
                f"provisioner {prov.store.provisioner_user} does not inherit the privileges of "
                f"{login} after GRANT (is it NOINHERIT?); refusing to restore in place"
            )
        connections.ensure_can_set_role(conn, tenant, prov.store.provisioner_user)
        # A plain CREATE fails rather than adopt a database that appeared since the check; the
        # claim is recorded only once this CREATE succeeded, so a claimed sibling is always this
        # operation's. A runner killed between the two leaves an unclaimed one: kept (and named
        # in the log) rather than risk dropping a stranger's.
        env.fence.pre_statement_heartbeat()
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(sibling), sql.Identifier(tenant)
            )
        )
        env.fence.update(target_claimed_at=Now())
        op.refresh_from_db(fields=["target_claimed_at"])
        present = connections.database_exists(conn, sibling)
        tenant_state = connections.role_state(conn, tenant)
    if not present:
        raise StepError(f"database {sibling} missing on store {prov.store.name} after CREATE")
    env.log.info(
        f"in place on store {prov.store.name}: created database {sibling} owned by {tenant} and "
        f"the restore's login role {login}; tenant role {tenant} stays "
        f"{'LOGIN' if tenant_state else 'NOLOGIN'} until the replaced catalog is dropped"
    )


def run_cutover(env: StepEnv) -> None:
    """``cutover`` of an in-place restore: render, then flip the binding to the sibling."""
    op, ctx = env.op, env.ctx
    prov = connections.provisioner(ctx, op.to_shard)
    if ctx.progress.flipped:
        return
    try:
        render(env, prov)
    except psycopg.Error as exc:
        raise StepError(
            f"preparing the in-place restore on store {prov.store.name} failed: {exc}"
        ) from None
    env.fence.update(target_rendered_at=Now())
    op.refresh_from_db(fields=["target_rendered_at"])
    if waits.cancel_requested(op.id):
        raise Cancelled()
    ctx.progress.flipped = True  # before the switch: a lost COMMIT ack may hide a flip
    binding.switch(env, binding.target_binding(op), what="binding switch to the sibling database")
    env.log.info(
        f"binding switched to database {op.target_database} on store {op.to_shard} (the "
        "warehouse stays blocked; cancel is honoured until the commit point)"
    )
    testhooks.kill_point("after_flip")


def end_login_sessions(
    env: StepEnv, conn: connections.PgConn, *, keep: tuple[int, ...] = ()
) -> None:
    """On a provisioner connection: end every session of the login role but ``keep``, seen gone
    twice a moment apart (a login past its password check when the password changed may still
    be starting)."""
    env.fence.pre_statement_heartbeat()
    connections.end_sessions(
        conn,
        _LOGIN_SESSIONS,
        (login_role_name(env.op), list(keep)),
        what="session(s) of the restore's login role",
        warn=env.log.warn,
        seconds=END_SESSIONS_SECONDS,
        settle=2,
    )


def login_side(
    env: StepEnv, *, fresh: bool = False, keep: tuple[int, ...] = ()
) -> connections.Side:
    """The sibling database, logged in as the login role (``SET ROLE`` tenant).

    The first call of a runner, and every ``fresh`` one, voids what an archive may have set
    before anyone logs in again: the role's and the sibling's settings are reset, the role gets
    LOGIN with a new password (a client-side SCRAM verifier, scrubbed), and every session of it
    but ``keep`` is ended — all by the provisioner, naming the role."""
    op, ctx = env.op, env.ctx
    prov = connections.provisioner(ctx, op.to_shard)
    name = login_role_name(op)
    login, sibling = sql.Identifier(name), sql.Identifier(op.target_database)
    if fresh or not ctx.restore_login_password:
        password = secrets.token_urlsafe(32)
        ctx.scrubber.add(password)
        try:
            with connections.provisioner_conn(ctx, prov) as conn:
                if connections.role_state(conn, name) is None:
                    raise StepError(
                        f"the restore's login role {name} is missing on store "
                        f"{prov.store.name}; the cutover creates it"
                    )
                verifier = conn.pgconn.encrypt_password(
                    password.encode(), name.encode(), b"scram-sha-256"
                ).decode()
                ctx.scrubber.add(verifier)
                env.fence.pre_statement_heartbeat()
                for statement in (
                    sql.SQL("ALTER ROLE {} RESET ALL").format(login),
                    sql.SQL("ALTER ROLE {} IN DATABASE {} RESET ALL").format(login, sibling),
                    sql.SQL("ALTER DATABASE {} RESET ALL").format(sibling),
                    sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(login, sql.Literal(verifier)),
                ):
                    conn.execute(statement)
                end_login_sessions(env, conn, keep=keep)
        except psycopg.Error as exc:
            raise StepError(
                f"cannot prepare the restore's login role {name} on store {prov.store.name}: {exc}"
            ) from None
        ctx.restore_login_password = password
    return connections.Side(
        "target",
        prov.direct,
        op.target_database,
        name,
        ctx.restore_login_password,
        role=op.target_user,
        store=prov.store.name,
    )


def retire_login_role(env: StepEnv, prov: connections.Provisioner) -> None:
    """NOLOGIN, its sessions ended, whatever it owns in any database (only an archive or an
    intruder that reset the role creates anything as it) handed to the tenant and its grants
    dropped, then the role dropped — all by the provisioner, naming the role. Idempotent."""
    op, ctx = env.op, env.ctx
    name = login_role_name(op)
    login, tenant = sql.Identifier(name), sql.Identifier(op.target_user)
    with connections.provisioner_conn(ctx, prov) as conn:
        if connections.role_state(conn, name) is None:
            return
        env.fence.pre_statement_heartbeat()
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(login))
        end_login_sessions(env, conn)
        databases = [str(row[0]) for row in conn.execute(_DEPENDENT_DATABASES, [name])]
    for database in databases:
        with connections.provisioner_conn(ctx, prov, dbname=database) as conn:
            env.fence.pre_statement_heartbeat()
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO {}").format(login, tenant))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(login))
    with connections.provisioner_conn(ctx, prov) as conn:
        env.fence.pre_statement_heartbeat()
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(login))
    env.log.info(
        f"the restore's login role {name} dropped on store {prov.store.name}"
        + (
            f" (what it owned in {', '.join(databases)} handed to {op.target_user})"
            if databases
            else ""
        )
    )


def open_tenant(env: StepEnv) -> None:
    """After the commit point: the login role gone, the tenant role LOGIN again, and a tenant
    ``SELECT 1`` on the restored catalog through the tenant endpoint (idempotent)."""
    op, ctx = env.op, env.ctx
    prov = connections.provisioner(ctx, op.to_shard)
    tenant = op.target_user
    password = connections.resolve_secret(
        ctx, op.target_password_secret_ref, f"the tenant password {op.target_password_secret_ref}"
    )
    try:
        retire_login_role(env, prov)
        with connections.provisioner_conn(ctx, prov) as conn:
            refusal = identity.op_role_refusal(conn, op, "target", prov.store)
            if refusal:
                raise StepError(f"{refusal}; not sending ALTER ROLE … LOGIN")
            env.fence.pre_statement_heartbeat()
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(tenant)))
    except psycopg.Error as exc:
        raise StepError(
            f"opening the restored catalog to tenant role {tenant} on store {prov.store.name} "
            f"failed: {exc}"
        ) from None
    env.log.info(f"ALTER ROLE {tenant} LOGIN sent on store {prov.store.name}")
    timeout = waits.cutover_timeout(op)

    def ready() -> tuple[bool, str]:
        return connections.tenant_login_observation(
            ctx,
            prov,
            database=op.target_database,
            user=tenant,
            password=password,
            ref=op.target_password_secret_ref,
        )

    waits.poll_until(
        ctx,
        env.log,
        timeout,
        ready,
        purpose=f"for tenant role {tenant} to log in to the restored catalog",
        timeout_message=(
            f"tenant role {tenant} could not log in to {op.target_database} on store "
            f"{prov.store.name} within {timeout:g} s"
        ),
        cancel_aware=False,
    )
    env.fence.update(target_login_ready_at=Coalesce("target_login_ready_at", Now()))
    op.refresh_from_db(fields=["target_login_ready_at"])
    env.log.info(f"restored catalog open: tenant role {tenant} logs in to {op.target_database}")


def drop_sibling(env: StepEnv) -> bool:
    """Rollback: the sibling database and the login role, decided from what the store holds,
    once the binding names the source again. True when both are gone; False (logged, the
    login role left NOLOGIN when it can be) otherwise: the rollback then leaves the warehouse
    blocked for ``reshard_recover``."""
    op, ctx, log = env.op, env.ctx, env.log
    sibling = op.target_database
    if not binding.names_source(op):
        log.error(
            f"rollback: the binding may still name the sibling database {sibling}; it is kept"
        )
        return False
    prov: connections.Provisioner | None = None
    try:
        prov = connections.provisioner(ctx, op.to_shard)
        shared = identity.shared_catalog_message(
            org_id=op.org_id, database=sibling, store=prov.store
        )
        if shared:
            raise StepError(f"{shared}; DROP DATABASE was not sent")
        with connections.provisioner_conn(ctx, prov) as conn:
            name = login_role_name(op)
            if connections.role_state(conn, name) is not None:
                env.fence.pre_statement_heartbeat()
                conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(name)))
                end_login_sessions(env, conn)
            if not connections.database_exists(conn, sibling):
                log.info(
                    f"rollback: no sibling database {sibling} on store {op.to_shard}; nothing "
                    "to drop"
                )
            elif op.target_claimed_at is None:
                # The claim follows this operation's own CREATE: without it, not ours to drop.
                log.warn(
                    f"rollback: database {sibling} on store {op.to_shard} was not created by this "
                    "operation (no claim recorded); it is left as it was found — if this "
                    "operation's runner died right after creating it, it is an empty leftover: "
                    "check it and drop it by hand"
                )
            else:
                env.fence.pre_statement_heartbeat()
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(sibling)
                    )
                )
                testhooks.kill_point("after_sibling_drop")
                log.info(f"rollback: the sibling database {sibling} dropped on store {op.to_shard}")
        retire_login_role(env, prov)
    except (psycopg.Error, StepError, Interrupted) as exc:
        log.error(
            f"rollback: dropping the in-place restore's sibling database {sibling} or its "
            f"login role {login_role_name(op)} on store {op.to_shard} failed: {exc}; the "
            f"warehouse stays blocked — drop them, then run reshard_recover {op.id}"
        )
        _nologin_best_effort(env, prov)
        return False
    return True


def _nologin_best_effort(env: StepEnv, prov: connections.Provisioner | None) -> None:
    if prov is None:
        return
    name = login_role_name(env.op)
    with (
        contextlib.suppress(psycopg.Error, StepError),
        connections.provisioner_conn(env.ctx, prov) as conn,
    ):
        if connections.role_state(conn, name) is not None:
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(name)))


def _void_after_write(env: StepEnv, conn: connections.PgConn) -> None:
    """The archive ran as the login role and may have changed it: void that, and end its other
    sessions, before the writer's lock is let go and anything reads the result."""
    login_side(env, fresh=True, keep=(conn.info.backend_pid,))


# The restore writes into the sibling as the login role, made fresh before the write (settings
# reset, new password, every session of it ended: nothing else to end first).
RESTORE_TARGET = restoring.RestoreTarget(
    side=lambda env, fresh: login_side(env, fresh=fresh),
    before_write=lambda env, conn: None,
    after_write=_void_after_write,
)
