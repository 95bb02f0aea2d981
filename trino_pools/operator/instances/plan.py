"""The lifecycle actions of the pool tick (spec trino-pools §4.4 step 11, §4.5): at most one
create or drain, chosen by the planner (``trino_pools.planner``) from the durable rows.

Invariants:

1. **Intent before effect.** ``create`` persists the ``PENDING`` row (own blueprint snapshot,
   release id, spec digest, endpoint, repair flags, epoch) in a fenced transaction before any
   Kubernetes object exists; instance ids (``cell-<8 hex>``) are never reused, retired rows
   included.
2. **Drain by the Gateway's word.** ``drain`` is the durable Gateway step ``drain``, then the
   CAS ``SERVING → DRAINING``. A ``POOL_SERVING_FLOOR`` refusal is authoritative and final for
   this tick: no CAS, the planner tries again later.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

from django.db import IntegrityError

from duckgres_admin.lib.gateway import parse_member
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance
from trino_pools import authority, instantiate, planner
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import InstanceError
from trino_pools.operator.instances import base

P = InstancePhase
_log = logging.getLogger("duckgres.trino.instances")

CREATED_MESSAGE = "Trino pool instance created."
ID_ATTEMPTS = 8


# --- planner inputs ---------------------------------------------------------------------------


def pool_desired(ctx: PoolContext) -> planner.PoolDesired:
    blueprint = ctx.desired.blueprint
    pool = ctx.pool
    return planner.PoolDesired(
        desired=int(pool.desired_instances),
        min_serving=int(pool.min_serving),
        max_surge=int(pool.max_surge),
        max_repair=int(pool.max_repair),
        release_id=blueprint.release_id if blueprint is not None else "",
        digest=blueprint.digest if blueprint is not None else "",
        frozen=bool(pool.frozen) or blueprint is None,
        frozen_reason=str(pool.frozen_reason or ctx.desired.frozen_reason or ""),
    )


def spec_outdated(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    blueprint = ctx.desired.blueprint
    if blueprint is None:
        return False
    return row.release_id != blueprint.release_id or row.spec_digest != instantiate.spec_digest(
        blueprint.digest, row.instance_id
    )


def instance_views(
    ctx: PoolContext, rows: Sequence[TrinoPoolInstance]
) -> list[planner.InstanceView]:
    return [
        planner.InstanceView(
            instance_id=row.instance_id,
            phase=row.phase,
            release_id=row.release_id,
            spec_outdated=spec_outdated(ctx, row),
            repair=bool(row.repair),
            repair_for=row.repair_for,
            created_at=row.created_at,
        )
        for row in rows
    ]


# --- the actions ------------------------------------------------------------------------------


def apply_plan(ctx: PoolContext, rows: Sequence[TrinoPoolInstance]) -> str:
    """Step 11: ask the planner and persist at most one create or drain; returns the outcome."""
    action, reason = planner.plan(pool_desired(ctx), instance_views(ctx, rows))
    if action is None:
        return f"idle: {reason}"
    if action.kind == "create":
        instance_id = create(ctx, repair=action.repair, repair_for=action.repair_for)
        return f"created {instance_id}: {reason}"
    row = next(r for r in rows if r.instance_id == action.instance_id)
    return drain(ctx, row, reason)


def create(ctx: PoolContext, *, repair: bool = False, repair_for: str = "") -> str:
    """Persist a new ``PENDING`` instance (fenced) before anything exists in Kubernetes."""
    blueprint = ctx.desired.blueprint
    if blueprint is None:
        raise InstanceError("no desired blueprint: nothing to instantiate")
    snapshot = instantiate.snapshot_for(blueprint, ctx.cell)
    for _ in range(ID_ATTEMPTS):
        instance_id = f"cell-{secrets.token_hex(4)}"
        endpoint = instantiate.endpoint_url(
            instance_id, blueprint.namespace, ctx.cell.pool.coordinator_service_port
        )
        try:
            with authority.fenced(ctx.auth):
                if TrinoPoolInstance.objects.filter(instance_id=instance_id).exists():
                    continue  # never reused, retired rows included
                TrinoPoolInstance.objects.create(
                    instance_id=instance_id,
                    pool_id=ctx.auth.pool_id,
                    release_id=blueprint.release_id,
                    spec_digest=instantiate.spec_digest(blueprint.digest, instance_id),
                    blueprint_snapshot=snapshot,
                    phase=P.PENDING,
                    owner_epoch=ctx.auth.epoch,
                    repair=repair,
                    repair_for=repair_for,
                    endpoint_url=endpoint,
                )
        except IntegrityError:
            continue  # a concurrent insert of the same id: draw another
        _log.info(
            CREATED_MESSAGE,
            extra={
                "pool": ctx.cell.id,
                "instance": instance_id,
                "epoch": ctx.auth.epoch,
                "release_id": blueprint.release_id,
                "repair_for": repair_for,
            },
        )
        return instance_id
    raise InstanceError(f"no free instance id after {ID_ATTEMPTS} draws")


def drain(ctx: PoolContext, row: TrinoPoolInstance, reason: str = "") -> str:
    """Durable Gateway drain, then CAS ``SERVING → DRAINING``; a serving-floor refusal waits."""
    state = base.gateway_step(
        ctx, row, "drain", {}, base.member_path(ctx, row.instance_id, "drain")
    )
    if state.outcome == "failed":
        if state.refusal_code == "POOL_SERVING_FLOOR":
            _log.info(
                "Gateway refused the drain at its serving floor; retried on a later tick.",
                extra={"pool": ctx.cell.id, "instance": row.instance_id, "epoch": ctx.auth.epoch},
            )
            return f"waiting: drain of {row.instance_id} refused by the Gateway serving floor"
        raise base.refusal(state)
    member = parse_member(state.result)
    base.advance(ctx, row, P.DRAINING, **base.member_fields(member))
    return f"draining {row.instance_id}: {reason}"
