"""The runner's copy works on the target logged in as the tenant (safeguard reshard-60).

On a →cnpg target the copy used to log in as the shard's provisioner and ``SET ROLE`` the tenant,
which any ``RESET ROLE`` undoes. Now the ``copying`` step logs in as the tenant with the password
``cutover`` rendered the role with (``target_password_secret_ref``), so even a statement that
escaped every other check would run with the tenant's own rights. The source stays the
provisioner with ``SET ROLE`` (it is fenced NOLOGIN), its sessions pinned.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from reshard.engines.copy import pump
from reshard.runner import connections
from reshard.runner.env import StepEnv
from reshard.runner.steps import copying, cutover
from tests.fixtures.runner import CnpgWorld, claimed_env, cnpg_world

__all__ = ["claimed_env", "cnpg_world"]  # fixtures used here

pytestmark = pytest.mark.safeguard("reshard-60")


def _sessions(conn: psycopg.Connection[Any]) -> tuple[str, str, str, str]:
    row = conn.execute(
        "SELECT session_user::text, current_user::text, current_setting('search_path'), "
        "current_setting('row_security')"
    ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1]), str(row[2]), str(row[3])


def _ready_for_copying(world: CnpgWorld, env: StepEnv) -> None:
    """What the steps before ``copying`` leave: the durable source fields and the tenant
    rendered on the target (role with LOGIN and the secret's password, database)."""
    source = world.source_store
    env.fence.update(
        source_endpoint=source.host, source_port=source.port, source_sslmode=source.sslmode
    )
    env.op.refresh_from_db()
    prov = connections.provisioner(env.ctx, world.target_store.name)
    cutover.render_target(env, prov, world.catalog.password)


def test_the_copying_step_uses_a_tenant_login_on_the_target(
    cnpg_world: CnpgWorld, claimed_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = claimed_env(cnpg_world.op)
    _ready_for_copying(cnpg_world, env)
    tenant = cnpg_world.catalog.role
    provisioner = cnpg_world.source_store.provisioner_user

    side = connections.target_side(env.ctx, env.op)
    assert (side.user, side.role) == (tenant, "")
    with side.connect(env.ctx) as conn:
        assert _sessions(conn) == (tenant, tenant, "", "off")
        # RESET ROLE changes nothing for a tenant login: there is no other identity behind it.
        conn.execute("RESET ROLE")
        assert _sessions(conn)[:2] == (tenant, tenant)

    seen: dict[str, set[tuple[str, str, str, str]]] = {"source": set(), "target": set()}
    real = pump.stream_table

    def spy(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], *a: Any, **k: Any) -> Any:
        seen["source"].add(_sessions(src))
        seen["target"].add(_sessions(tgt))
        return real(src, tgt, *a, **k)

    monkeypatch.setattr(pump, "stream_table", spy)
    try:
        copying.run(env)
        copying.run_verify(env)
    finally:
        copying.release_handle(env)
    assert seen["target"] == {(tenant, tenant, "", "off")}
    assert seen["source"] == {(provisioner, tenant, "", "off")}
    with psycopg.connect(
        host=cnpg_world.target_store.host, port=cnpg_world.target_store.port, user="postgres",
        dbname=cnpg_world.catalog.database, sslmode="require", autocommit=True,
    ) as conn:  # fmt: skip
        owners = {
            str(r[0])
            for r in conn.execute(
                sql.SQL("SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")
            )
        }
    assert owners == {tenant}
