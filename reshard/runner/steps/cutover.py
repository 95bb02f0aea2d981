"""``cutover``: H2 for →cnpg targets, M for cnpg→external (spec §4.4 H2, M; safeguards 8, 13).

H2 renders the tenant on the target store (role with LOGIN and the password as a
client-computed SCRAM-SHA-256 verifier — the cleartext never appears in SQL, so server
statement logs cannot capture it; database owned by the tenant, never adopted; the role only
after :func:`reshard.engines.identity.tenant_role_message` allows it: never the provisioner,
``postgres``, a ``pg_*`` or privileged role, or a role another warehouse uses), observes both
(``target_rendered_at``), reads the cancel flag one last time, flips the binding and waits,
cancel-aware, for ``rolcanlogin`` and a tenant ``SELECT 1`` through the tenant endpoint
(``target_login_ready_at``, the →cnpg cancel cutoff).

An in-place restore (the target is the warehouse's own store) has a cutover of its own
(``reshard.kinds.in_place`` binds :func:`reshard.runner.steps.inplace.run_cutover`): the tenant
role stays NOLOGIN, and there is no login wait.

M re-resolves the target secret and compares it in constant time with the password slot before
the flip, flips, then waits with no cancel check for the binding to work as the data plane
would use it.
"""

from __future__ import annotations

import hmac

import psycopg
from django.db.models.functions import Coalesce, Now
from psycopg import sql

from duckgres_admin.lib import pgadmin
from duckgres_admin.models import Warehouse
from reshard.engines import identity, testhooks
from reshard.runner import binding, connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, StepError
from reshard.runner.kind import kind_of


def run(env: StepEnv) -> None:
    if env.op.target_kind == "cnpg":
        run_cnpg(env)
    else:
        run_external(env)


# --- H2 -------------------------------------------------------------------------------------
def render_target(
    env: StepEnv, prov: connections.Provisioner, password: str, *, own: bool = False
) -> None:
    op, ctx = env.op, env.ctx
    role, database = op.target_user, op.target_database
    with connections.provisioner_conn(ctx, prov) as conn:
        refusal = identity.op_role_refusal(conn, op, "target", prov.store)
        if refusal:
            raise StepError(f"{refusal}; refusing to create or adopt it")
        verifier = conn.pgconn.encrypt_password(
            password.encode(), role.encode(), b"scram-sha-256"
        ).decode()
        ctx.scrubber.add(verifier)
        exists = connections.role_state(conn, role) is not None
        verb = "ALTER" if exists else "CREATE"
        conn.execute(
            sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(verifier)
            )
        )
        connections.ensure_can_set_role(conn, role, prov.store.provisioner_user)
        owner = identity.database_owner_message(
            conn, database=database, tenant_role=role, store_name=prov.store.name
        )
        if owner:
            raise StepError(owner)
        # ``own``: this operation claimed it already (the online mode's render, redone by a
        # takeover): what it holds is this operation's pre-copy.
        if connections.database_exists(conn, database) and not own:
            _adoptable(env, prov, database)
        present = connections.ensure_database(conn, database, role)
        state = connections.role_state(conn, role)
    if state is not True or not present:
        raise StepError(
            f"target tenant not rendered on store {prov.store.name}: role {role} "
            f"{'LOGIN' if state else 'missing or NOLOGIN'}, database {database} "
            f"{'present' if present else 'missing'}"
        )
    env.log.info(
        f"{'altered' if exists else 'created'} tenant role {role} (LOGIN, SCRAM verifier) and "
        f"ensured database {database} owned by it on store {prov.store.name}"
    )


def _adoptable(env: StepEnv, prov: connections.Provisioner, database: str) -> None:
    """An existing target database is adopted only when it holds nothing (identity check 4):
    everything the rollback may later drop in it is then this operation's own."""
    with connections.provisioner_conn(env.ctx, prov, dbname=database) as inside:
        contents = identity.database_contents(inside)
    refusal = identity.contents_message(
        contents, database=database, where=f"store {prov.store.name}"
    )
    if refusal:
        raise StepError(refusal)
    env.log.info(f"target database {database} exists and holds nothing: adopting it")


def _target_password(env: StepEnv) -> str:
    ref = env.op.target_password_secret_ref
    return connections.resolve_secret(env.ctx, ref, f"the target password secret {ref}")


def render(env: StepEnv) -> None:
    """Render the tenant on the cnpg target and record it as this operation's (the offline
    cutover's first half; the online mode's ``rendering_target``, before the block)."""
    op, ctx = env.op, env.ctx
    prov = connections.provisioner(ctx, op.to_shard)
    try:
        render_target(env, prov, _target_password(env), own=op.target_claimed_at is not None)
    except psycopg.Error as exc:
        raise StepError(
            f"rendering the tenant on target store {prov.store.name} failed: {exc}"
        ) from None
    # Rendered: the database was created, or found empty and adopted — it is this op's.
    env.fence.update(
        target_rendered_at=Coalesce("target_rendered_at", Now()),
        target_claimed_at=Coalesce("target_claimed_at", Now()),
    )
    op.refresh_from_db(fields=["target_rendered_at", "target_claimed_at"])


def run_cnpg(env: StepEnv) -> None:
    """Render, then flip and wait for the target login (:func:`flip_cnpg`)."""
    if not env.ctx.progress.flipped:
        render(env)
    flip_cnpg(env)


def flip_cnpg(env: StepEnv) -> None:
    """Switch the binding to the rendered cnpg target and wait until its tenant login works."""
    op, ctx = env.op, env.ctx
    prov = connections.provisioner(ctx, op.to_shard)
    password = _target_password(env)
    if not ctx.progress.flipped:
        if waits.cancel_requested(op.id):
            raise Cancelled()
        # Marked before the switch: if its COMMIT acknowledgement is lost the flip may have
        # landed, and over-marking is safe (the flip-back is idempotent, §4.8).
        ctx.progress.flipped = True
        binding.switch(env, binding.target_binding(op), what="binding switch to the target")
        env.log.info(
            f"binding switched to cnpg store {op.to_shard} (database {op.target_database}, "
            f"user {op.target_user})"
        )
        testhooks.kill_point("after_flip")
    timeout = waits.cutover_timeout(op)
    role = op.target_user

    def ready() -> tuple[bool, str]:
        try:
            with connections.provisioner_conn(ctx, prov, connect_timeout=8) as conn:
                state = connections.role_state(conn, role)
        except psycopg.Error as exc:
            return False, connections.classify(
                exc,
                role=prov.store.provisioner_user,
                ref=prov.store.provisioner_password_ref,
                where=f"store {prov.store.name} (direct)",
            )
        if state is not True:
            return False, f"target role {role} is {'NOLOGIN' if state is False else 'missing'}"
        ok, seen = connections.tenant_login_observation(
            ctx,
            prov,
            database=op.target_database,
            user=role,
            password=password,
            ref=op.target_password_secret_ref,
        )
        return ok, f"role {role} LOGIN and {seen}" if ok else seen

    waits.poll_until(
        ctx,
        env.log,
        timeout,
        ready,
        purpose=f"for target shard {op.to_shard} to accept the tenant login",
        timeout_message=f"target shard {op.to_shard} did not become ready within {timeout:g} s",
    )
    env.fence.update(target_login_ready_at=Now())
    op.refresh_from_db(fields=["target_login_ready_at"])
    # A kind whose cutoff is not the login (e.g. a restore: cleaning_up) says nothing of it.
    if not kind_of(op).cancel_cutoff(op.target_kind).login_ready_ends_it:
        env.log.info(f"target login ready on store {op.to_shard}")
    else:
        env.log.info(
            f"target login ready on store {op.to_shard}: the point of no return for cancel"
        )


# --- M --------------------------------------------------------------------------------------
def run_external(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    if not ctx.progress.flipped:
        resolved = connections.resolve_secret(
            ctx,
            op.target_password_secret_ref,
            f"the target password secret {op.target_password_secret_ref}",
        )
        if not ctx.target_password or not hmac.compare_digest(
            resolved.encode(), ctx.target_password.encode()
        ):
            raise StepError(
                f"password from secret {op.target_password_secret_ref} does not match the "
                "password supplied when the operation was started — fix the secret and re-run"
            )
        ctx.progress.flipped = True  # before the switch: a lost COMMIT ack may hide a flip
        binding.switch(
            env, binding.target_binding(op), what="binding switch to the external target"
        )
        env.log.info(
            f"binding switched to external {op.target_endpoint}:{op.target_port}/"
            f"{op.target_database} (user {op.target_user})"
        )
        testhooks.kill_point("after_flip")
    timeout = waits.cutover_timeout(op)

    def works() -> tuple[bool, str]:
        wh = Warehouse.objects.get(org_id=op.org_id)
        endpoint = pgadmin.Endpoint(
            wh.metadata_store_host,
            int(wh.metadata_store_port or 5432),
            wh.metadata_store_sslmode or pgadmin.DEFAULT_SSLMODE,
        )
        try:
            password = connections.resolve_secret(
                ctx, wh.metadata_store_password_ref, "the binding's password"
            )
        except StepError as exc:
            return False, str(exc)
        try:
            connections.tenant_probe(
                ctx,
                endpoint,
                database=wh.metadata_store_database,
                user=wh.metadata_store_user,
                password=password,
            )
        except psycopg.Error as exc:
            return False, connections.classify(
                exc,
                role=wh.metadata_store_user,
                ref=wh.metadata_store_password_ref,
                where=f"{endpoint.host}:{endpoint.port}",
            )
        return True, "tenant SELECT 1 through the new binding succeeded"

    waits.poll_until(
        ctx,
        env.log,
        timeout,
        works,
        purpose="for the external target to accept the new binding",
        timeout_message=f"external target did not accept the new binding within {timeout:g} s",
        cancel_aware=False,
    )
    env.log.info("external target accepts the new binding")
