"""The →cnpg cutover's op-log line names what it did to the target tenant role in a correct past
tense: ``created`` for a new role, ``altered`` for an existing one (never ``alterd``)."""

from __future__ import annotations

from typing import Any

from reshard.runner import connections
from reshard.runner.steps import cutover
from tests.fixtures.runner import CnpgWorld, op_log


def test_render_target_logs_created_then_altered(cnpg_world: CnpgWorld, claimed_env: Any) -> None:
    env = claimed_env(cnpg_world.op)
    prov = connections.provisioner(env.ctx, cnpg_world.target_store.name)
    role, database, store = (
        cnpg_world.catalog.role,
        cnpg_world.catalog.database,
        cnpg_world.target_store.name,
    )
    tail = f"tenant role {role} (LOGIN, SCRAM verifier) and ensured database {database} owned by "
    cutover.render_target(env, prov, cnpg_world.catalog.password)  # the role is new on the target
    cutover.render_target(env, prov, cnpg_world.catalog.password)  # now it exists
    rendered = [line for line in op_log(env.op.id) if f"tenant role {role} (LOGIN" in line]
    assert rendered == [
        f"created {tail}it on store {store}",
        f"altered {tail}it on store {store}",
    ]
