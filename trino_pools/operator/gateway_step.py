"""The durable Gateway step of the pool tick (spec trino-pools §4.7; ``trino_pools.effects``).

Every pooled-member and tenant mutation the instance lifecycle and tenant admission send to the
Gateway is one ``run``:

1. ``ensure_leading`` first: nothing is sent past the ``trino`` lease's renew deadline;
2. the intent (step id, the exact body with its envelope ``operationId``, ``stepId``,
   ``controllerEpoch``, ``ownerIdentity``) is journalled in a fenced transaction and the call is
   made only after that commit (``effects.run_step``);
3. an unsettled step (``pending`` or ``unknown``: a crash or a lost response) is resolved before
   anything newer is sent for it by reading the Gateway's own operation journal back
   (``GET …/operations/<opId>``): the step applied → ``ok`` with the Gateway's result; refused →
   ``failed`` with its code; absent (or the whole operation unknown) → the Gateway never
   received it, and the stored body is re-sent byte for byte.

A settled ``ok`` step is a replay and is never sent again; a ``failed`` one applied nothing.
``refusal`` is the one conversion of a failed step's recorded result back into the typed
``GatewayRefused`` the callers raise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from duckgres_admin.lib.gateway import GatewayClient, GatewayRefused, parse_operation
from trino_pools import effects
from trino_pools.operator.context import PoolContext

ReadBack = Callable[[effects.StepState], effects.Settled | None]


def refusal(result: Any, *, subject: str = "") -> GatewayRefused:
    """The ``GatewayRefused`` of a failed step's result (``{"code", "status", "message"}``).

    Without ``subject`` the message is the recorded one; with it (tenant steps name their
    tenant) it is ``"<subject>: <message or 'refused'>"``. A missing status is 409.
    """
    data = result if isinstance(result, dict) else {}
    message = str(data.get("message") or "")
    if subject:
        message = f"{subject}: {data.get('message') or 'refused'}"
    return GatewayRefused(str(data.get("code") or ""), int(data.get("status") or 409), message)


def refusal_text(result: Any) -> str:
    """A failed step's refusal as one line for a row's ``last_error``."""
    data = result if isinstance(result, dict) else {}
    return f"the Gateway refused ({data.get('code') or 'no code'}): {data.get('message') or ''}"


def journal_read_back(ctx: PoolContext, refused_message: str) -> ReadBack:
    """Resolve an unsettled step from the Gateway's journal of its operation (absent → None).

    ``refused_message`` is the message recorded for a step the journal shows refused.
    """

    def read_back(state: effects.StepState) -> effects.Settled | None:
        path = GatewayClient.pool_path(ctx.cell.routing_group, "operations", state.operation_id)
        try:
            record = parse_operation(ctx.gateway.get(path))
        except GatewayRefused as exc:
            if exc.code == "POOL_NOT_FOUND":
                return None  # the Gateway never received any step of this operation
            raise
        step = record.step(state.step_id)
        if step is None:
            return None  # never received: the stored payload is re-sent byte for byte
        if step.outcome == "APPLIED":
            return effects.Settled("ok", step.result)
        return effects.Settled(
            "failed", {"code": step.code, "status": 409, "message": refused_message}
        )

    return read_back


def run(
    ctx: PoolContext,
    *,
    operation_id: str,
    kind: str,
    step_id: str,
    body: Mapping[str, Any],
    path: str,
    method: str = "POST",
    refused_message: str,
) -> effects.StepState:
    """One durable Gateway mutation (see the module docstring); ``EffectUnknown`` propagates."""
    ctx.ensure_leading()  # renew before the effect: never send past the renew deadline
    return effects.run_step(
        ctx.auth,
        operation_id=operation_id,
        kind=kind,
        step_id=step_id,
        body=body,
        call=lambda payload: ctx.gateway.send(method, path, payload),
        read_back=journal_read_back(ctx, refused_message),
    )
