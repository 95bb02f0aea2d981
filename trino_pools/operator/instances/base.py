"""The instance row and its member: reads, the fenced phase CAS, the durable Gateway step
(spec trino-pools §3.1, §4.6, §4.7).

Invariants:

1. **One fenced CAS per phase change** (``advance``): ``UPDATE … SET phase=:to,
   phase_changed_at=now(), owner_epoch=:epoch WHERE instance_id=:id AND phase=:from`` inside
   ``authority.fenced``, rowcount checked, the move checked against ``phases.check_transition``
   first. "Trino pool member phase advanced." is logged only after that transaction commits,
   "Trino pool instance retired." only after the ``RETIRED`` CAS commits: a failing CAS logs
   neither (safeguard 36). Every other row write (``update``, ``record_error``) is fenced too,
   and ``update`` requires the row to still be in its phase.
2. **Intent before effect.** Every Gateway mutation of an instance is ``gateway_step``: the
   durable step ``instance:<id>/<step>`` (``trino_pools.operator.gateway_step``: journalled
   before the call, an unknown outcome resolved by the Gateway's operation journal).
3. **Identity as the Gateway recorded it.** Member fields and the coordinator identity are
   copied from the Gateway's member record (safeguard 20), never from what this process sent.

The phase modules call ``advance`` through this module (``base.advance``), so a test that
replaces it here replaces it for every phase.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db.models.functions import Now
from django.utils import timezone

from duckgres_admin.lib.gateway import GatewayClient, GatewayRefused, Member, parse_member
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance, clip_status_message
from trino_pools import authority, effects, instantiate, phases
from trino_pools.operator import gateway_step as durable
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import InstanceError, PhaseChanged

P = InstancePhase
_log = logging.getLogger("duckgres.trino.instances")

ADVANCED = "Trino pool member phase advanced."
RETIRED_MESSAGE = "Trino pool instance retired."
#: The message of a step the Gateway's operation journal shows refused.
READ_BACK_REFUSED = "refused (read back)"

# Kubernetes inventory: instantiate's key (the row's column prefix) -> (name field, uid field).
INVENTORY_FIELDS: dict[str, tuple[str, str]] = {
    key: (f"{key}_name", f"{key}_uid") for key in instantiate.INVENTORY
}


def operation_id(instance_id: str) -> str:
    return f"instance:{instance_id}"


# --- the row's own snapshot ------------------------------------------------------------------


def snapshot(row: TrinoPoolInstance) -> dict[str, Any]:
    snap = row.blueprint_snapshot
    return snap if isinstance(snap, dict) else {}


def blueprint_raw(row: TrinoPoolInstance) -> dict[str, Any]:
    """The instance's own blueprint (``instantiate.snapshot_for`` form or a bare blueprint)."""
    snap = snapshot(row)
    raw = snap.get("blueprint", snap)
    return raw if isinstance(raw, dict) else {}


def namespace(row: TrinoPoolInstance) -> str:
    return str(blueprint_raw(row).get("namespace") or "")


def identity(row: TrinoPoolInstance) -> dict[str, Any]:
    ident = blueprint_raw(row).get("identity_binding")
    return ident if isinstance(ident, dict) else {}


def inventory(row: TrinoPoolInstance) -> dict[str, tuple[str, str]]:
    return {
        key: (str(getattr(row, name_f)), str(getattr(row, uid_f)))
        for key, (name_f, uid_f) in INVENTORY_FIELDS.items()
        if getattr(row, name_f)
    }


def phase_age(row: TrinoPoolInstance) -> float:
    changed = row.phase_changed_at
    if changed is None:
        return 0.0
    return max(0.0, (timezone.now() - changed).total_seconds())


def operation_kind(row: TrinoPoolInstance) -> str:
    return "repair" if row.repair else "scale_up"


# --- the Gateway member ----------------------------------------------------------------------


def member_path(ctx: PoolContext, instance_id: str, *rest: str) -> str:
    return GatewayClient.pool_path(ctx.cell.routing_group, "members", instance_id, *rest)


def gateway_step(
    ctx: PoolContext,
    row: TrinoPoolInstance,
    step_id: str,
    body: Mapping[str, Any],
    path: str,
    *,
    method: str = "POST",
) -> effects.StepState:
    """One durable Gateway mutation of this instance (§4.7); EffectUnknown propagates."""
    return durable.run(
        ctx,
        operation_id=operation_id(row.instance_id),
        kind=operation_kind(row),
        step_id=step_id,
        body=body,
        path=path,
        method=method,
        refused_message=READ_BACK_REFUSED,
    )


def refusal(state: effects.StepState) -> GatewayRefused:
    return durable.refusal(state.result)


def read_member(ctx: PoolContext, instance_id: str) -> Member | None:
    try:
        return parse_member(ctx.gateway.get(member_path(ctx, instance_id)))
    except GatewayRefused as exc:
        if exc.code == "POOL_NOT_FOUND":  # decisive: the Gateway has no such member
            return None
        raise


def member_fields(member: Member) -> dict[str, Any]:
    return {
        "gateway_state": member.state,
        "gateway_generation": member.generation,
        "gateway_incarnation": str(member.incarnation),
        "gateway_backend_name": member.backend_name,
    }


def member_identity(member: Member) -> dict[str, Any]:
    """The coordinator identity as the Gateway recorded it (safeguard 20)."""
    return {
        "coordinator_pod_uid": member.pod_uid,
        "coordinator_boot_id": member.boot_id,
        "coordinator_node_id": member.node_id,
        "coordinator_id": member.coordinator_id,
    }


def refresh_generation(ctx: PoolContext, row: TrinoPoolInstance) -> None:
    """The recorded generation from ``GET /members/<id>`` (after ``POOL_STALE_GENERATION``)."""
    member = read_member(ctx, row.instance_id)
    if member is None:
        raise InstanceError(f"the Gateway has no member {row.instance_id}")
    update(ctx, row, **member_fields(member))


# --- fenced row writes -----------------------------------------------------------------------


def update(ctx: PoolContext, row: TrinoPoolInstance, **fields: Any) -> None:
    """A fenced non-phase update of the row (same phase required)."""
    with authority.fenced(ctx.auth):
        changed = TrinoPoolInstance.objects.filter(
            instance_id=row.instance_id, phase=row.phase
        ).update(updated_at=Now(), **fields)
    if changed != 1:
        raise PhaseChanged(
            f"instance {row.instance_id} is no longer {row.phase}; its update was not written"
        )
    for key, value in fields.items():
        setattr(row, key, value)


def advance(ctx: PoolContext, row: TrinoPoolInstance, to: str, **fields: Any) -> None:
    """The fenced phase CAS ``row.phase → to`` (plus ``fields``); logs only after commit."""
    frm = row.phase
    phases.check_transition(frm, to)
    with authority.fenced(ctx.auth):
        changed = TrinoPoolInstance.objects.filter(
            instance_id=row.instance_id, pool_id=ctx.auth.pool_id, phase=frm
        ).update(
            phase=to,
            phase_changed_at=Now(),
            owner_epoch=ctx.auth.epoch,
            last_error="",
            updated_at=Now(),
            **fields,
        )
    if changed != 1:
        raise PhaseChanged(
            f"instance {row.instance_id} is no longer {frm}; the move to {to} was not written"
        )
    # Committed: only now may the logs claim it.
    for key, value in fields.items():
        setattr(row, key, value)
    row.phase = to
    row.phase_changed_at = timezone.now()
    row.owner_epoch = ctx.auth.epoch
    validator = ctx.term.validator
    if validator is not None:
        validator.forget(row.instance_id)
    _log.info(
        ADVANCED,
        extra={
            "pool": ctx.cell.id,
            "instance": row.instance_id,
            "epoch": ctx.auth.epoch,
            "from_phase": frm,
            "to_phase": to,
        },
    )
    if to == P.RETIRED:
        _log.info(
            RETIRED_MESSAGE,
            extra={"pool": ctx.cell.id, "instance": row.instance_id, "epoch": ctx.auth.epoch},
        )


def record_error(ctx: PoolContext, row: TrinoPoolInstance, exc: BaseException) -> None:
    """Fenced ``last_error`` of the instance (any phase)."""
    message = clip_status_message(f"{type(exc).__name__}: {exc}")
    with authority.fenced(ctx.auth):
        TrinoPoolInstance.objects.filter(instance_id=row.instance_id).update(
            last_error=message, updated_at=Now()
        )
    row.last_error = message


def wait(ctx: PoolContext, row: TrinoPoolInstance, reason: str, **fields: Any) -> bool:
    """The instance only waits this tick (no step): the wait log line; always False."""
    ctx.term.waitlog.waiting(
        ctx.cell.id,
        row.instance_id,
        ctx.auth.epoch,
        row.phase,
        phase_age(row),
        reason,
        **fields,
    )
    return False
