"""The leaving phases of an instance: ``DRAINING`` and ``SEALED`` (spec trino-pools §3.1,
§4.6, §4.7).

Invariants:

1. **Health first.** A dead coordinator's obligations never complete and there is no drain
   deadline, so ``DRAINING`` and ``SEALED`` look for termination evidence first
   (``evidence.observe`` → ``SUSPECT``) — skipped only while their own ``seal`` / ``retire`` is
   journalled and not refused: that is resolved first (the retire claim is irreversible).
2. **Drain by obligations only.** ``DRAINING`` seals only when (``readyToSeal`` or ``drained``)
   and ``pendingRequests + openTransactions + activeQueries == 0`` as read from
   ``/obligations``, with the generation **recorded** from the Gateway's member answer — never
   the one ``/obligations`` reports (safeguard 24). A ``POOL_NOT_DRAINED`` seal was still sent:
   it is this tick's one instance step. ``POOL_STALE_GENERATION`` refreshes the recorded
   generation from ``GET /members/<id>`` and the step is retried on a later tick.
3. ``SEALED`` sends ``RetireMember`` (the Gateway's irreversible claim) and stores the
   retirement receipt; the deletes follow in ``RETIRING`` (``teardown``).
"""

from __future__ import annotations

from duckgres_admin.lib.gateway import Obligations, parse_member, parse_obligations
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance
from trino_pools.operator.context import PoolContext
from trino_pools.operator.instances import base, evidence

P = InstancePhase


def _wait_obligations(ctx: PoolContext, row: TrinoPoolInstance, obligations: Obligations) -> bool:
    """The waiting line for open obligations, with the counters the Gateway reported."""
    return base.wait(
        ctx,
        row,
        "gateway_obligations",
        pending_requests=obligations.pending_requests,
        open_transactions=obligations.open_transactions,
        active_queries=obligations.active_queries,
        ready_to_seal=obligations.ready_to_seal,
        drained=obligations.drained,
    )


def step_draining(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    # Health first (§3.1 DRAINING → SUSPECT): a dead coordinator's obligations never complete,
    # and there is no drain deadline. An unsettled seal is resolved before anything newer.
    if not evidence.in_flight(row, "seal") and evidence.observe(ctx, row):
        return True
    obligations = parse_obligations(
        ctx.gateway.get(base.member_path(ctx, row.instance_id, "obligations"))
    )
    if not obligations.sealable:
        return _wait_obligations(ctx, row, obligations)
    if row.gateway_generation is None:
        base.refresh_generation(ctx, row)
    # The generation recorded from the Gateway's member answer, never the obligations' one.
    body = {"expectedGeneration": int(row.gateway_generation or 0)}
    state = base.gateway_step(
        ctx,
        row,
        evidence.attempt_step_id(row, "seal"),
        body,
        base.member_path(ctx, row.instance_id, "seal"),
    )
    if state.outcome == "failed":
        if state.refusal_code == "POOL_NOT_DRAINED":
            _wait_obligations(ctx, row, obligations)
            return True  # the seal was sent: this tick's one instance step (invariant 2)
        if state.refusal_code == "POOL_STALE_GENERATION":
            base.refresh_generation(ctx, row)
            return True
        raise base.refusal(state)
    base.advance(ctx, row, P.SEALED, **base.member_fields(parse_member(state.result)))
    return True


def step_sealed(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    # Health first (§3.1 SEALED → SUSPECT), unless the irreversible retire claim may already
    # have been applied (journalled, not refused): that is resolved first.
    if not evidence.in_flight(row, "retire") and evidence.observe(ctx, row):
        return True
    body = {"expectedGeneration": int(row.gateway_generation or 0)}
    state = base.gateway_step(
        ctx, row, "retire", body, base.member_path(ctx, row.instance_id, "retire")
    )
    if state.outcome == "failed":
        if state.refusal_code == "POOL_STALE_GENERATION":
            base.refresh_generation(ctx, row)
            return True
        raise base.refusal(state)
    member = parse_member(state.result)
    base.advance(
        ctx,
        row,
        P.RETIRING,
        retirement_receipt=member.retirement_receipt or {},
        **base.member_fields(member),
    )
    return True
