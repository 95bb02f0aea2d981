"""Step C ``preparing_access`` (cnpg sources; spec §4.4 C; safeguard 9).

On the source store's direct endpoint, tenant database, as the provisioner: membership in the
tenant role (``pg_has_role … MEMBER``), on PostgreSQL 16+ with ADMIN OPTION (the fence's
``ALTER ROLE … NOLOGIN`` needs it there; safeguard reshard-143), ``SET ROLE`` to it, tenant
``rolcanlogin`` observed true. A missing privilege fails at once naming the grant, before the
drain wait and the fence; then ``source_access_verified_at``.

A takeover redoing the steps (safeguard reshard-73) finds the tenant NOLOGIN when the earlier
attempt already fenced: that is accepted only when the op row (read fresh) has
``source_fence_requested_at`` set — this op's own fence, which the redo's ``fencing_source``
re-applies and a rollback lifts. A NOLOGIN role without it is still refused.
"""

from __future__ import annotations

import psycopg
from django.db.models.functions import Coalesce, Now
from psycopg import sql

from duckgres_admin.models import ReshardOperation
from reshard.runner import connections
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError

# Membership, and (PostgreSQL 16+) whether the fence's ALTER ROLE would be refused for want of
# ADMIN OPTION: asked here, before the drain wait, never discovered at the fence.
_ACCESS_SQL = (
    "SELECT pg_has_role(current_user, %s, 'MEMBER'), "
    "current_setting('server_version_num')::int >= 160000 "
    "AND NOT pg_has_role(current_user, %s, 'MEMBER WITH ADMIN OPTION')"
)


def run(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    prov = connections.provisioner(ctx, op.from_shard)
    user, tenant = prov.store.provisioner_user, op.source_user
    where = prov.direct.redacted(op.source_database, user)
    try:
        with connections.provisioner_conn(ctx, prov, dbname=op.source_database) as conn:
            row = conn.execute(_ACCESS_SQL, [tenant, tenant]).fetchone()
            if not row or not row[0]:
                raise StepError(
                    f"provisioner {user} cannot act as tenant role {tenant} on store "
                    f"{prov.store.name}: GRANT {tenant} TO {user}"
                )
            if row[1]:
                raise StepError(
                    f"provisioner {user} could not fence tenant role {tenant} on store "
                    f"{prov.store.name}: PostgreSQL 16 and newer let a CREATEROLE login alter "
                    f"only the roles it holds with ADMIN OPTION: GRANT {tenant} TO {user} "
                    "WITH ADMIN OPTION"
                )
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(tenant)))
            login = connections.role_state(conn, tenant)
    except psycopg.Error as exc:
        raise StepError(f"cannot prepare source access at {where}: {exc}") from None
    own_fence = login is False and _fence_requested(op.id)
    if login is not True and not own_fence:
        raise StepError(
            f"tenant role {tenant} on store {prov.store.name} is "
            + ("missing" if login is None else "NOLOGIN")
            + " before the fence (observed in pg_roles); refusing to proceed"
        )
    env.fence.update(source_access_verified_at=Coalesce("source_access_verified_at", Now()))
    ctx.progress.source_access_verified = True
    env.log.info(
        f"source access verified: provisioner {user} can SET ROLE {tenant} on store "
        f"{prov.store.name} ("
        + (
            "tenant role is NOLOGIN from this operation's earlier fence"
            if own_fence
            else "tenant role has LOGIN"
        )
        + ")"
    )


def _fence_requested(op_id: int) -> bool:
    """Fresh read: did this op record its source fence (``source_fence_requested_at``)?"""
    return ReshardOperation.objects.filter(
        id=op_id, source_fence_requested_at__isnull=False
    ).exists()
