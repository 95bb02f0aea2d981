"""The pool's own steps of the tick (spec trino-pools §4.4 steps 2, 4-7 and 9, §7).

Invariants:

1. **Every pool-row write is fenced** (``authority.fenced``: the pool row locked, the term's
   ``(authority_epoch, authority_owner)`` required, else ``PoolConflict``) — except the seed,
   ``INSERT … ON CONFLICT DO NOTHING``, which writes only a row that does not exist yet.
2. **Missing configuration is never desired zero.** Unreadable, vanished or stale desired
   configuration freezes the pool; a ``generation`` lower than the stored one is refused
   (``StaleGeneration``) and never written.
3. **The Gateway pool configuration** is one durable step per change (``configure.e<epoch>.s<n>``
   of operation ``pool-config:<pool>``); an unsettled request of this term is re-sent
   identically before any newer payload, and an ``ok`` answer must echo every setting.
4. **Metrics come from durable rows.** The instance listing is bounded (a blocked read fails
   the tick instead of hanging it) and the snapshot is recorded from a successful listing only,
   with the live term's token.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import connection, transaction

from duckgres_admin.lib.gateway import GatewayClient
from duckgres_admin.models.trino import TrinoPoolInstance
from trino_pools import authority, effects, term_metrics
from trino_pools.authority import Authority
from trino_pools.desired import Desired
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import ConfigureMismatch, StaleGeneration
from trino_pools.operator.gateway_step import refusal
from trino_pools.registry import Cell

_log = logging.getLogger("duckgres.trino.operator")


# --- fenced pool-row writes ---------------------------------------------------------------------


def seed_pool(cell: Cell) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO duckgres_trino_pools (pool_id, public_id, api_mode, "
            "desired_instances, min_serving, max_surge, max_repair) "
            "VALUES (%s, %s, 'shared-pool', %s, %s, %s, %s) ON CONFLICT (pool_id) DO NOTHING",
            [
                cell.stored_id,
                cell.id,
                cell.pool.desired_instances,
                cell.pool.min_serving,
                cell.pool.max_surge,
                cell.pool.max_repair,
            ],
        )


def freeze(auth: Authority, reason: str) -> None:
    with authority.fenced(auth), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_trino_pools SET frozen = true, frozen_reason = %s, "
            "updated_at = now() WHERE pool_id = %s AND (NOT frozen OR frozen_reason <> %s)",
            [reason[:1024], auth.pool_id, reason[:1024]],
        )
        changed = cursor.rowcount
    if changed:
        _log.warning("Trino pool frozen: %s", reason, extra={"pool_id": auth.pool_id})


def thaw(auth: Authority) -> None:
    with authority.fenced(auth), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_trino_pools SET frozen = false, frozen_reason = '', "
            "updated_at = now() WHERE pool_id = %s AND frozen",
            [auth.pool_id],
        )
        changed = cursor.rowcount
    if changed:
        _log.info("Trino pool thawed", extra={"pool_id": auth.pool_id})


def upsert_spec(auth: Authority, desired: Desired) -> None:
    blueprint = desired.blueprint
    assert blueprint is not None  # a Desired without a blueprint is frozen
    spec = desired.cell.pool
    if spec.desired_instances < 1 or not 1 <= spec.min_serving <= spec.desired_instances:
        raise StaleGeneration(  # never written: the registry parser refuses these already
            f"desired configuration is invalid: desired {spec.desired_instances}, "
            f"min_serving {spec.min_serving}"
        )
    with authority.fenced(auth), connection.cursor() as cursor:
        cursor.execute(
            "SELECT desired_generation FROM duckgres_trino_pools WHERE pool_id = %s",
            [auth.pool_id],
        )
        row = cursor.fetchone()
        stored = int(row[0]) if row else 0
        if blueprint.generation < stored:
            raise StaleGeneration(
                "desired configuration is older than the published one: generation "
                f"{blueprint.generation} < {stored}"
            )
        values: dict[str, str | int] = {
            "pool": auth.pool_id,
            "release": blueprint.release_id,
            "digest": blueprint.digest,
            "generation": blueprint.generation,
            "desired": spec.desired_instances,
            "min_serving": spec.min_serving,
            "surge": spec.max_surge,
            "repair": spec.max_repair,
        }
        cursor.execute(
            "UPDATE duckgres_trino_pools SET desired_release_id = %(release)s, "
            "desired_blueprint_digest = %(digest)s, desired_generation = %(generation)s, "
            "desired_instances = %(desired)s, min_serving = %(min_serving)s, "
            "max_surge = %(surge)s, max_repair = %(repair)s, api_mode = 'shared-pool', "
            "updated_at = now() WHERE pool_id = %(pool)s AND (desired_release_id, "
            "desired_blueprint_digest, desired_generation, desired_instances, min_serving, "
            "max_surge, max_repair) IS DISTINCT FROM (%(release)s, %(digest)s, %(generation)s, "
            "%(desired)s, %(min_serving)s, %(surge)s, %(repair)s)",
            values,
        )


# --- the Gateway pool configuration (§4.4 step 7) -----------------------------------------------

SETTLED_CONFIGURE_REFUSALS = ("POOL_VALIDATION", "TENANT_IDENTITY_UNVERIFIED", "POOL_APIMODE")


def configure_gateway_pool(ctx: PoolContext) -> None:
    blueprint = ctx.desired.blueprint
    assert blueprint is not None
    spec = ctx.cell.pool
    body = {
        "apiMode": "POOLED",
        "minServing": spec.min_serving,
        "desiredMembers": spec.desired_instances,
        "maxSurge": spec.max_surge,
        "maxRepair": spec.max_repair,
        "desiredRevision": blueprint.release_id,
        "tenantAdmissionEnabled": spec.tenant_admission,
    }
    term = ctx.term
    wanted = effects.business_hash(body)
    if term.configured_hash == wanted:
        return
    operation_id = f"pool-config:{ctx.cell.id}"
    pending = term.configure_pending
    if pending is None:
        term.configure_seq += 1
        step_id = f"configure.e{ctx.auth.epoch}.s{term.configure_seq}"
        send_body: dict[str, Any] = body
    else:
        # An unsettled request of this term is re-sent identically before any newer payload.
        step_id, send_body = pending
    path = GatewayClient.pool_path(ctx.cell.routing_group)
    term.configure_pending = (step_id, send_body)
    state = effects.run_step(
        ctx.auth,
        operation_id=operation_id,
        kind="publish",
        step_id=step_id,
        body=send_body,
        call=lambda payload: ctx.gateway.send("PUT", path, payload),
    )
    term.configure_pending = None
    if state.outcome == "failed" and state.refusal_code not in SETTLED_CONFIGURE_REFUSALS:
        raise refusal(state.result)
    if state.outcome == "ok":
        echoed = state.result if isinstance(state.result, dict) else {}
        mismatched = sorted(k for k, v in send_body.items() if echoed.get(k) != v)
        if mismatched:
            raise ConfigureMismatch(
                "the Gateway pool configuration does not match the request: "
                + ", ".join(mismatched)
            )
    else:
        _log.warning(
            "Gateway refused the pool configuration: %s",
            state.refusal_code,
            extra=ctx.log_extra(),
        )
    if effects.business_hash(send_body) == wanted:
        term.configured_hash = wanted


# --- instance listing and metrics snapshot (§7) ------------------------------------------------


LISTING_TIMEOUT = "5s"


def list_instances(pool_id: str) -> list[TrinoPoolInstance]:
    """The pool's instance rows, bounded (a blocked read fails the tick instead of hanging it)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true), "
            "set_config('statement_timeout', %s, true)",
            [LISTING_TIMEOUT, LISTING_TIMEOUT],
        )
        return list(TrinoPoolInstance.objects.filter(pool_id=pool_id).order_by("instance_id"))


def record_snapshot(ctx: PoolContext, rows: list[TrinoPoolInstance]) -> None:
    snapshot_rows = [
        term_metrics.SnapshotRow(
            instance_id=row.instance_id,
            phase=row.phase,
            phase_changed_at=row.phase_changed_at.timestamp(),
            namespace=str((row.blueprint_snapshot or {}).get("namespace") or "")
            if isinstance(row.blueprint_snapshot, dict)
            else "",
            coordinator_deployment=row.coordinator_deployment_name,
            worker_deployment=row.worker_deployment_name,
        )
        for row in rows
    ]
    ctx.term.waitlog.retain({row.instance_id for row in rows})
    term_metrics.record_snapshot(
        ctx.term.metrics_token,
        ctx.cell.id,
        snapshot_rows,
        ctx.pool.min_serving,
        ctx.cell.namespace,
        time.time(),
    )
