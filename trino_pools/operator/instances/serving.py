"""The serving phases of an instance: ``ADMITTED``, ``SERVING``, ``SUSPECT`` (spec
trino-pools §3.1, §4.6).

Invariants:

1. ``ADMITTED → SERVING`` only when the Gateway's member is ``ACTIVE`` and ``eligible``.
2. A serving instance leaves only by evidence (``evidence.observe``): termination evidence makes
   it ``SUSPECT``, never a vanished pod or a missed probe.
3. **A suspect never serves again.** Evidence still present → ``LOST``; gone (the registered pod
   vanished or no longer reports a termination) → drained and retired normally. A second drain
   (the instance was ``DRAINING`` or ``SEALED`` before it became suspect) has its own step id
   (``evidence.attempt_step_id``): the first one's settled answer would otherwise be replayed.
"""

from __future__ import annotations

from duckgres_admin.lib.gateway import parse_member
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance
from trino_pools.operator.context import PoolContext
from trino_pools.operator.instances import base, evidence

P = InstancePhase


def step_admitted(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    member = base.read_member(ctx, row.instance_id)
    if member is not None and member.state == "ACTIVE" and member.eligible:
        base.advance(ctx, row, P.SERVING, **base.member_fields(member))
        return True
    if evidence.observe(ctx, row):
        return True
    return base.wait(
        ctx,
        row,
        "gateway_member_state",
        member_state=member.state if member is not None else "absent",
        eligible=bool(member and member.eligible),
    )


def step_serving(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    return evidence.observe(ctx, row)


def step_suspect(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """Evidence still there → lost. Gone (the registered pod vanished or no longer reports a
    termination) → drain it and retire it normally: a suspect never serves again."""
    if evidence.observe(ctx, row):
        return True
    # A second drain (this instance was DRAINING or SEALED before it became suspect) has its
    # own step id: the first one's settled answer would otherwise be replayed.
    state = base.gateway_step(
        ctx,
        row,
        evidence.attempt_step_id(row, "drain"),
        {},
        base.member_path(ctx, row.instance_id, "drain"),
    )
    if state.outcome == "failed":
        raise base.refusal(state)
    base.advance(ctx, row, P.DRAINING, **base.member_fields(parse_member(state.result)))
    return True
