"""H1 ``preflightCnpgTarget`` (→cnpg; no stamp; spec §4.4 H1, §4.18; safeguards 14, 44, 45).

Within 8 s the target store's provisioner runs ``SELECT 1`` on ``postgres`` at its direct
endpoint; then the target identity checks, the tenant role identity of the target role
included (``reshard.engines.identity.tenant_role_message``). Every failure is pre-flip.
"""

from __future__ import annotations

import psycopg

from reshard.engines import identity
from reshard.runner import connections
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError

PREFLIGHT_TIMEOUT = 8


def run(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    try:
        prov = connections.provisioner(ctx, op.to_shard)
        with connections.provisioner_conn(ctx, prov, connect_timeout=PREFLIGHT_TIMEOUT) as conn:
            conn.execute("SELECT 1")
    except (psycopg.Error, StepError) as exc:
        raise StepError(
            f"destination shard {op.to_shard} stopped accepting PostgreSQL connections before "
            f"cutover: {exc}"
        ) from None
    env.log.info(f"destination shard {op.to_shard} accepts connections (provisioner SELECT 1)")
    check_target_identity(env)


def _target_role_refusal(
    env: StepEnv, conn: connections.PgConn, prov: connections.Provisioner
) -> str | None:
    """→cnpg: the target role may be created or adopted (tenant role identity)."""
    return identity.op_role_refusal(conn, env.op, "target", prov.store)


def check_target_identity(env: StepEnv) -> None:
    """§4.18 checks 1-3 in the runner (before the →cnpg flip and before any copy write)."""
    op, ctx = env.op, env.ctx
    source = connections.source_side(ctx, op)
    target = connections.target_side(ctx, op)
    src_ident = tgt_ident = None
    try:
        with source.connect(ctx) as conn, connections.registered(ctx, conn):
            src_ident = identity.read_server_identity(conn, source.endpoint)
    except psycopg.Error as exc:
        raise StepError(f"cannot reach the source for the identity check: {exc}") from None
    try:
        if target.store:
            prov = connections.provisioner(ctx, target.store)
            with connections.provisioner_conn(ctx, prov) as conn:
                tgt_ident = identity.read_server_identity(conn, target.endpoint)
                owner = identity.database_owner_message(
                    conn,
                    database=target.database,
                    tenant_role=op.target_user,
                    store_name=target.store,
                ) or _target_role_refusal(env, conn, prov)
                if owner:
                    raise StepError(owner)
        else:
            with target.connect(ctx) as conn, connections.registered(ctx, conn):
                tgt_ident = identity.read_server_identity(conn, target.endpoint)
    except psycopg.Error as exc:
        raise StepError(f"cannot reach the target for the identity check: {exc}") from None
    verdict = identity.compare_databases(
        src_ident,
        source.database,
        tgt_ident,
        target.database,
        source_configured=(source.endpoint.host, source.endpoint.port),
        target_configured=(target.endpoint.host, target.endpoint.port),
    )
    if verdict.warning:
        env.log.warn(verdict.warning)
    if verdict.same:
        raise StepError(identity.SAME_DATABASE_MESSAGE)
    if target.store:
        endpoints = identity.store_endpoints(connections.cnpg_store(target.store))
        label = f"store {target.store}"
    else:
        endpoints = {(target.endpoint.host, target.endpoint.port)}
        label = f"{target.endpoint.host}:{target.endpoint.port}"
    other = identity.other_warehouse_message(
        org_id=op.org_id,
        target_database=target.database,
        target_store=target.store or None,
        target_endpoints=endpoints,
        target_label=label,
    )
    if other:
        raise StepError(other)
    env.log.info("target identity checks passed (not the source, no other warehouse's catalog)")
