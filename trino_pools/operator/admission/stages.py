"""The admission pass: one external tenant step per tick (spec trino-pools §4.11, §4.16).

Runs once per pool tick (``run(ctx)``) and only when the pool's ``tenant_admission`` is true.
The Gateway admits a tenant through a **publication barrier**: open it at the pool's catalog
revision, record one receipt per required member (each member probed first), commit. Every
mutation is a durable Gateway step of the operation ``tenant:<org>``
(``trino_pools.operator.gateway_step``); the rows are ``publications``.

Invariants:

1. **Fail closed on revision evidence.** Every pass starts by recovering the catalog revision
   watermark (``catalog_writer.recover_watermark``); if that fails nothing else happens this tick
   (no barrier is opened, advanced or committed on an unproven revision).
2. **At most one external step per tick**, chosen in the §4.11 priority order: (1) a candidate
   is VALIDATING → release the live barrier; (2) service the single live barrier; (3) settle a
   pending intent; (4) revoke a departed tenant; (5)/(6) alternately publish one changed binding
   and open the next barrier. Reads (GET publication, GET members, the coordinator probe) are not
   steps. Round-robin cursors per category (term memory, ``AdmissionMemory.cursors``) keep one
   failing tenant from monopolising a category (safeguard 28); per-tenant backoff keeps it from
   monopolising the tick across categories.
3. **One live barrier per pool.** A barrier is opened only when no row of the pool points at one
   (``publication_id``), no candidate is validating, serving ≥ ``min_serving``, the binding is
   published, the tenant's catalog is in the store, no intent is pending and the tenant is not in
   backoff. The barrier basis (the catalog revision it was opened at) lives in this term's memory
   (``AdmissionMemory.basis``): a barrier whose basis is unknown to this process or no longer the
   pool's revision is released, never committed (safeguard 29).
4. **Intent before effect.** Every Gateway mutation is a durable step (journalled and fenced
   before the call, outcome recorded after, unknown outcomes resolved by the Gateway's operation
   journal). A principals/revoke intent is also pinned on the row (``pending_intent`` +
   ``pending_request_body``) before its step runs, and is settled by re-sending exactly that body
   under the same occurrence before anything newer for the tenant.
5. **Failures.** A refusal closes the occurrence (the next try is a new attempt); an unknown
   outcome keeps it pinned; ``POOL_STALE_EPOCH`` raises ``PoolConflict`` (ends the term). Every
   failure sets per-tenant backoff (``publications.backoff_delay``) in ``next_attempt_at``. A
   tenant waiting in backoff raises nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from duckgres_admin.lib.gateway import (
    GatewayClient,
    GatewayProtocolError,
    GatewayRefused,
    Member,
    Publication,
    parse_members,
    parse_publication,
)
from duckgres_admin.models.trino import (
    InstancePhase,
    PendingIntent,
    PublicationState,
    TrinoPoolInstance,
)
from trino_pools import catalog_writer, effects, probes
from trino_pools.operator import gateway_step
from trino_pools.operator.admission.publications import (
    Row,
    Tenant,
    abandon_step,
    backoff_delay,
    binding_of,
    commit_step,
    ensure_rows,
    intent_step,
    load_rows,
    occurrence,
    open_payload_hash,
    open_step,
    operation_id,
    publication_id,
    receipt_step,
    target_revision,
    wanted_tenants,
    write,
)
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import AdmissionError

_log = logging.getLogger("duckgres.trino.admission")

OPERATION_KIND = "publish"
REVOKE_REASON = "the warehouse is no longer served by this pool"
CANDIDATE_REASON = "a candidate is waiting to join"
BINDING_CHANGED_REASON = "the tenant's binding changed"
IN_FLIGHT_REASON = "a request for the tenant is in flight"
BACKOFF_REASON = "the tenant is in backoff"
MEMBERSHIP_REASON = "the pool's membership changed"
BASIS_UNKNOWN_REASON = "the barrier's catalog revision is unknown to this process"
BASIS_CHANGED_REASON = "the barrier's catalog revision changed"

RECEIPT_PHASES = (InstancePhase.SERVING, InstancePhase.ADMITTED)
#: The message of a step the Gateway's operation journal shows refused.
READ_BACK_REFUSED = "refused, per the Gateway's operation journal"


# --- the pass ------------------------------------------------------------------------------------


@dataclass
class _Pass:
    ctx: PoolContext
    now: datetime
    revision: int
    tenants: dict[str, Tenant]
    rows: dict[str, Row]
    instances: list[TrinoPoolInstance]

    @property
    def rg(self) -> str:
        return self.ctx.cell.routing_group

    def path(self, *segments: str) -> str:
        return GatewayClient.pool_path(self.rg, *segments)


def _refused(org_id: str, result: Any) -> GatewayRefused:
    return gateway_step.refusal(result, subject=f"tenant {org_id}")


def _basis_memory(ctx: PoolContext) -> dict[str, int]:
    return ctx.term.admission.basis


def _round_robin(ctx: PoolContext, category: str, candidates: Sequence[str]) -> str | None:
    """The first candidate after the category's cursor (wrapping); moves the cursor to it."""
    if not candidates:
        return None
    cursors = ctx.term.admission.cursors
    last = cursors.get(category)
    ordered = sorted(candidates)
    chosen = next((c for c in ordered if last is None or c > last), ordered[0])
    cursors[category] = chosen
    return chosen


def run(ctx: PoolContext) -> None:
    """One admission pass of the pool's tick: at most one external tenant step (§4.11)."""
    if not ctx.cell.pool.tenant_admission:
        return
    pool_id = ctx.auth.pool_id
    # Revision evidence first (§4.9): fails closed, nothing else happens this tick.
    catalog_writer.recover_watermark(ctx.auth, catalog_writer.client_for(pool_id))
    revision = catalog_writer.publication_revision(pool_id)
    tenants = wanted_tenants(pool_id)
    rows = load_rows(pool_id)
    ensure_rows(ctx, tenants, rows)
    instances = list(TrinoPoolInstance.objects.filter(pool_id=pool_id).order_by("instance_id"))
    p = _Pass(ctx, timezone.now(), revision, tenants, rows, instances)
    for stage in (
        _candidate_waiting,
        _service_live_barrier,
        _settle_pending,
        _revoke_departed,
        _publish_or_open,
    ):
        if stage(p):
            return


# (1) a candidate is validating: compute wins -----------------------------------------------------


def _candidate_waiting(p: _Pass) -> bool:
    if not any(i.phase == InstancePhase.VALIDATING for i in p.instances):
        return False
    live = [r for r in p.rows.values() if r.live_barrier]
    if not live:
        return False
    for row in live:
        _release(p.ctx, row, CANDIDATE_REASON)
    return True


def release_barrier(ctx: PoolContext, reason: str) -> bool:
    """Release the pool's live barrier (abandon it at the Gateway); True when one was released.

    Called by the instance steps when an admit is refused with ``POOL_PUBLICATION_BARRIER``.
    Raises ``EffectUnknown`` when the abandon's outcome is unknown (the pointer is kept).
    """
    released = False
    for row in load_rows(ctx.auth.pool_id).values():
        if row.live_barrier:
            _release(ctx, row, reason)
            released = True
    return released


def _release(ctx: PoolContext, row: Row, reason: str) -> None:
    pub = row.publication_id
    state = gateway_step.run(
        ctx,
        operation_id=operation_id(row.org_id),
        kind=OPERATION_KIND,
        step_id=abandon_step(pub),
        body={"reason": reason},
        path=GatewayClient.pool_path(ctx.cell.routing_group, "publications", pub, "abandon"),
        refused_message=READ_BACK_REFUSED,
    )
    if state.outcome == "failed":
        code = state.refusal_code
        if code == "POOL_NOT_FOUND":
            _clear_barrier(ctx, row, "released (the Gateway does not know the barrier)")
            return
        current = _get_publication(ctx, pub)
        if current is None or current.state == "ABANDONED":
            _clear_barrier(ctx, row, "released")
            return
        if current.state == "ADMITTED":
            _record_admitted(ctx, row, current)
            return
        raise _refused(row.org_id, state.result)
    _clear_barrier(ctx, row, f"released: {reason}")


def _resting_state(row: Row) -> str:
    if row.admitted_target_revision:
        return PublicationState.ADMITTED
    if row.principal_revision:
        return PublicationState.PUBLISHED
    return PublicationState.PENDING


def _clear_barrier(ctx: PoolContext, row: Row, why: str) -> None:
    pub = row.publication_id
    _basis_memory(ctx).pop(pub, None)
    state = _resting_state(row)
    write(ctx, row, publication_id="", state=state, barrier=None)
    _log.info("Trino tenant barrier %s %s", pub, why, extra=ctx.log_extra(org_id=row.org_id))


def _record_admitted(ctx: PoolContext, row: Row, pub: Publication) -> None:
    target = pub.admitted_target_revision or pub.target_revision or row.target_revision
    _basis_memory(ctx).pop(row.publication_id, None)
    write(
        ctx,
        row,
        admitted_target_revision=target,
        admitted_revision=pub.catalog_revision,
        state=PublicationState.ADMITTED,
        publication_id="",
        attempts=0,
        next_attempt_at=None,
        last_error="",
        barrier=None,
    )
    _log.info(
        "Trino tenant admitted at %s (catalog revision %d)",
        target,
        pub.catalog_revision,
        extra=ctx.log_extra(org_id=row.org_id),
    )


# (2) the single live barrier ---------------------------------------------------------------------


def _service_live_barrier(p: _Pass) -> bool:
    live = [r for r in p.rows.values() if r.live_barrier]
    if not live:
        return False
    row = live[0]
    ctx = p.ctx
    tenant = p.tenants.get(row.org_id)
    if tenant is None or tenant.binding != binding_of(row.target_revision):
        _release(ctx, row, BINDING_CHANGED_REASON)
        return True
    if row.pending_intent:
        _release(ctx, row, IN_FLIGHT_REASON)
        return True
    if row.admitted_target_revision and row.admitted_target_revision == row.target_revision:
        _clear_barrier(ctx, row, "cleared: already admitted")
        return False  # no external step: the tick goes on
    if row.in_backoff(p.now):
        _release(ctx, row, BACKOFF_REASON)
        return True
    pub = _get_publication(ctx, row.publication_id)
    basis = _basis_memory(ctx).get(row.publication_id)
    if pub is None:
        if basis is None or row.barrier_basis != basis:
            _clear_barrier(ctx, row, "forgotten (unknown to the Gateway and to this process)")
            return False
        _open(p, row, tenant, reopen=True)
        return True
    if pub.state == "ADMITTED":
        _record_admitted(ctx, row, pub)
        return False
    if pub.state == "ABANDONED":
        _clear_barrier(ctx, row, "was abandoned")
        return False
    generation, members = parse_members(ctx.gateway.get(p.path("members")))
    if generation != pub.membership_generation:
        _release(ctx, row, MEMBERSHIP_REASON)
        return True
    if basis is None:
        _release(ctx, row, BASIS_UNKNOWN_REASON)
        return True
    if basis != pub.catalog_revision or basis != row.barrier_basis or basis > p.revision:
        _release(ctx, row, BASIS_CHANGED_REASON)
        return True
    missing = sorted(set(pub.required_members) - set(pub.receipts))
    if missing:
        by_id = {m.member_id: m for m in members}
        _record_receipt(p, row, pub, missing[0], by_id.get(missing[0]))
    else:
        _commit(p, row, pub)
    return True


def _get_publication(ctx: PoolContext, pub: str) -> Publication | None:
    try:
        raw = ctx.gateway.get(GatewayClient.pool_path(ctx.cell.routing_group, "publications", pub))
    except GatewayRefused as exc:
        if exc.code == "POOL_NOT_FOUND":
            return None
        raise
    return parse_publication(raw)


def _read_sync(ctx: PoolContext, endpoint_url: str, namespace: str) -> tuple[str, int]:
    """``processId`` and ``appliedRevision`` of the coordinator's ``/v1/catalog/sync``."""
    source = ctx.term.observer_credentials or probes.observer_credential
    origin = probes.origin_of(endpoint_url)
    doc, _ = probes.probe(origin, source(namespace), origin.url("/v1/catalog/sync"))
    process_id = doc.get("processId")
    applied = doc.get("appliedRevision")
    if not isinstance(process_id, str) or not process_id:
        raise probes.ProbeError("GET /v1/catalog/sync reported no processId")
    if isinstance(applied, bool) or not isinstance(applied, int):
        raise probes.ProbeError("GET /v1/catalog/sync reported no appliedRevision")
    if doc.get("enabled") is not True or doc.get("ready") is not True:
        raise probes.ProbeError("GET /v1/catalog/sync: catalog sync is not ready")
    return process_id, applied


def _probe_member(p: _Pass, member_id: str, member: Member | None, basis: int) -> tuple[str, int]:
    """Probe a required member before its receipt: row SERVING/ADMITTED, boot id, revision."""
    instance = next((i for i in p.instances if i.instance_id == member_id), None)
    if instance is None:
        raise AdmissionError(f"member {member_id} is not an instance of this pool")
    if instance.phase not in RECEIPT_PHASES:
        raise AdmissionError(f"member {member_id} is {instance.phase}, not SERVING or ADMITTED")
    registered = instance.coordinator_boot_id
    if member is not None and member.boot_id != registered:
        raise AdmissionError(
            f"member {member_id}: the Gateway's boot id differs from the registered one"
        )
    if not instance.endpoint_url or not registered:
        raise AdmissionError(f"member {member_id} has no endpoint or registered boot id")
    snapshot = instance.blueprint_snapshot if isinstance(instance.blueprint_snapshot, dict) else {}
    namespace = str(snapshot.get("namespace") or p.ctx.cell.namespace)
    process_id, applied = _read_sync(p.ctx, instance.endpoint_url, namespace)
    if process_id != registered:
        raise AdmissionError(f"member {member_id}: the coordinator process restarted")
    if applied < basis:
        raise AdmissionError(
            f"member {member_id} applied catalog revision {applied}, the barrier needs {basis}"
        )
    return registered, applied


def _record_receipt(
    p: _Pass, row: Row, pub: Publication, member_id: str, member: Member | None
) -> None:
    ctx = p.ctx
    try:
        boot_id, applied = _probe_member(p, member_id, member, pub.catalog_revision)
    except (AdmissionError, probes.ProbeError) as exc:
        _fail(ctx, row, f"receipt for {member_id}: {exc}")
        raise AdmissionError(f"tenant {row.org_id}: receipt for {member_id}: {exc}") from None
    path = p.path("publications", pub.publication_id, "receipts")
    state = _run(
        ctx,
        row,
        receipt_step(pub.publication_id, member_id),
        {"memberId": member_id, "bootId": boot_id, "appliedRevision": applied},
        "POST",
        path,
    )
    if state.outcome == "failed":
        _fail(ctx, row, gateway_step.refusal_text(state.result))
        raise _refused(row.org_id, state.result)


def _commit(p: _Pass, row: Row, pub: Publication) -> None:
    ctx = p.ctx
    path = p.path("publications", pub.publication_id, "commit")
    state = _run(ctx, row, commit_step(pub.publication_id), {}, "POST", path)
    if state.outcome == "failed":
        _fail(ctx, row, gateway_step.refusal_text(state.result))
        raise _refused(row.org_id, state.result)
    try:
        committed = parse_publication(state.result)
    except GatewayProtocolError as exc:
        raise AdmissionError(f"tenant {row.org_id}: commit answer: {exc}") from None
    if committed.state != "ADMITTED":
        raise AdmissionError(
            f"tenant {row.org_id}: the commit answered state {committed.state[:40]}"
        )
    _record_admitted(ctx, row, committed)


def _run(
    ctx: PoolContext, row: Row, step: str, body: dict[str, Any], method: str, path: str
) -> effects.StepState:
    """One durable Gateway mutation of the tenant's operation; unknown → backoff, re-raised."""
    try:
        return gateway_step.run(
            ctx,
            operation_id=operation_id(row.org_id),
            kind=OPERATION_KIND,
            step_id=step,
            body=body,
            path=path,
            method=method,
            refused_message=READ_BACK_REFUSED,
        )
    except effects.EffectUnknown as exc:
        _fail(ctx, row, str(exc))
        raise


def _fail(ctx: PoolContext, row: Row, error: str, **changes: Any) -> None:
    """Record a failure on the row and put the tenant in backoff."""
    failures = row.attempts + 1
    delay = backoff_delay(failures)
    write(
        ctx,
        row,
        attempts=failures,
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
        last_error=error,
        **changes,
    )
    _log.warning(
        "Trino tenant step failed (backoff %.1f s): %s",
        delay,
        error,
        extra=ctx.log_extra(org_id=row.org_id, attempt=row.attempt),
    )


# (3) settle a pending intent ---------------------------------------------------------------------


def _settle_pending(p: _Pass) -> bool:
    candidates = [r.org_id for r in p.rows.values() if r.pending_intent and not r.in_backoff(p.now)]
    chosen = _round_robin(p.ctx, "pending", candidates)
    if chosen is None:
        return False
    _run_intent(p, p.rows[chosen])
    return True


def _run_intent(p: _Pass, row: Row) -> None:
    ctx = p.ctx
    intent = row.pending_intent
    body = json.loads(row.pending_body)
    if intent == PendingIntent.PRINCIPALS:
        method, path = "PUT", p.path("tenants", row.org_id, "principals")
    else:
        method, path = "DELETE", p.path("tenants", row.org_id)
    state = _run(ctx, row, intent_step(intent, row.attempt), body, method, path)
    if state.outcome == "failed" and not (
        intent == PendingIntent.REVOKE and state.refusal_code == "POOL_NOT_FOUND"
    ):
        # A refusal closes the occurrence: the next try is a new attempt.
        _fail(
            ctx,
            row,
            f"{intent}.{occurrence(row.attempt)}: {gateway_step.refusal_text(state.result)}",
            pending_intent="",
            pending_request_body="",
            state=PublicationState.FAILED,
        )
        raise _refused(row.org_id, state.result)
    if intent == PendingIntent.PRINCIPALS:
        binding = str(body.get("bindingRevision") or "")
        admitted_binding = binding_of(row.admitted_target_revision)
        write(
            ctx,
            row,
            pending_intent="",
            pending_request_body="",
            principal_revision=binding,
            state=PublicationState.ADMITTED
            if admitted_binding and admitted_binding == binding
            else PublicationState.PUBLISHED,
            attempts=0,
            next_attempt_at=None,
            last_error="",
        )
    else:
        _basis_memory(ctx).pop(row.publication_id, None)
        write(
            ctx,
            row,
            pending_intent="",
            pending_request_body="",
            principal_revision="",
            target_revision="",
            admitted_target_revision="",
            admitted_revision=0,
            publication_id="",
            state=PublicationState.REVOKED,
            attempts=0,
            next_attempt_at=None,
            last_error="",
            barrier=None,
        )
    _log.info(
        "Trino tenant %s.%s settled",
        intent,
        occurrence(row.attempt),
        extra=ctx.log_extra(org_id=row.org_id),
    )


def _begin_intent(p: _Pass, row: Row, intent: str, body: dict[str, Any]) -> None:
    """Pin a new occurrence (attempt + 1) with its exact body, then run it."""
    write(
        p.ctx,
        row,
        attempt=row.attempt + 1,
        pending_intent=intent,
        pending_request_body=effects.canonical(body),
    )
    _run_intent(p, row)


# (4) revoke departed tenants ---------------------------------------------------------------------


def _revoke_departed(p: _Pass) -> bool:
    candidates = [
        r.org_id
        for r in p.rows.values()
        if r.org_id not in p.tenants
        and r.state != PublicationState.REVOKED
        and not r.pending_intent
        and not r.publication_id
        and not r.in_backoff(p.now)
    ]
    chosen = _round_robin(p.ctx, "revoke", candidates)
    if chosen is None:
        return False
    row = p.rows[chosen]
    if not row.principal_revision and not row.admitted_target_revision:
        # Nothing of this tenant ever reached the Gateway: revoked here, no call.
        write(p.ctx, row, state=PublicationState.REVOKED, attempts=0, next_attempt_at=None)
        return False
    _begin_intent(p, row, PendingIntent.REVOKE, {"reason": REVOKE_REASON})
    return True


# (5)/(6) publish one changed binding, open the next barrier --------------------------------------


def _publish_or_open(p: _Pass) -> bool:
    memory = p.ctx.term.admission
    first = memory.turn
    order = (_publish_binding, _open_next) if first == "publish" else (_open_next, _publish_binding)
    for stage in order:
        if stage(p):
            memory.turn = "open" if stage is _publish_binding else "publish"
            return True
    return False


def _publish_binding(p: _Pass) -> bool:
    candidates = [
        org_id
        for org_id, tenant in p.tenants.items()
        if (row := p.rows.get(org_id)) is not None
        and not row.pending_intent
        and not row.publication_id
        and not row.in_backoff(p.now)
        and (row.state == PublicationState.REVOKED or row.principal_revision != tenant.binding)
    ]
    chosen = _round_robin(p.ctx, "publish", candidates)
    if chosen is None:
        return False
    tenant = p.tenants[chosen]
    body = {"bindingRevision": tenant.binding, "principals": list(tenant.principals)}
    _begin_intent(p, p.rows[chosen], PendingIntent.PRINCIPALS, body)
    return True


def _serving(p: _Pass) -> int:
    return sum(1 for i in p.instances if i.phase == InstancePhase.SERVING)


def _open_next(p: _Pass) -> bool:
    if any(r.live_barrier for r in p.rows.values()):
        return False
    if any(i.phase == InstancePhase.VALIDATING for i in p.instances):
        return False
    if _serving(p) < p.ctx.pool.min_serving:
        return False
    candidates = [
        org_id
        for org_id, tenant in p.tenants.items()
        if (row := p.rows.get(org_id)) is not None
        and row.state != PublicationState.REVOKED
        and row.principal_revision == tenant.binding
        and not row.pending_intent
        and binding_of(row.admitted_target_revision) != tenant.binding
        and not row.in_backoff(p.now)
        and tenant.catalog
    ]
    if not candidates:
        return False
    present = catalog_writer.client_for(p.ctx.auth.pool_id).list_catalogs()
    candidates = [c for c in candidates if p.tenants[c].catalog in present]
    chosen = _round_robin(p.ctx, "open", candidates)
    if chosen is None:
        return False
    _open(p, p.rows[chosen], p.tenants[chosen], reopen=False)
    return True


def _open(p: _Pass, row: Row, tenant: Tenant, *, reopen: bool) -> None:
    """Open (or re-open, same identity) the tenant's barrier at the pool's catalog revision."""
    ctx = p.ctx
    if reopen:
        target, basis = row.target_revision, row.barrier_basis
        assert basis is not None
    else:
        attempt = max(row.attempt, 1)
        target = target_revision(tenant.binding, attempt)
        if row.target_revision == target or row.attempt == 0:
            attempt = row.attempt + 1
            target = target_revision(tenant.binding, attempt)
        basis = p.revision
        pub = publication_id(row.org_id, target)
        _basis_memory(ctx)[pub] = basis
        write(
            ctx,
            row,
            attempt=attempt,
            publication_id=pub,
            publication_operation_id=operation_id(row.org_id),
            target_revision=target,
            state=PublicationState.ADMITTING,
            barrier={"publicationId": pub, "targetRevision": target, "catalogRevision": basis},
        )
    pub = publication_id(row.org_id, target)
    body = {
        "publicationId": pub,
        "tenant": row.org_id,
        "targetRevision": target,
        "catalogRevision": basis,
        "payloadHash": open_payload_hash(row.org_id, target, basis),
    }
    state = _run(ctx, row, open_step(pub), body, "POST", p.path("publications"))
    if reopen and state.replayed:
        # Our journal says it was opened, the Gateway no longer knows it: never re-sent.
        _clear_barrier(ctx, row, "forgotten (opened once, unknown to the Gateway now)")
        return
    if state.outcome == "failed":
        _basis_memory(ctx).pop(pub, None)
        _fail(
            ctx,
            row,
            f"open {pub}: {gateway_step.refusal_text(state.result)}",
            publication_id="",
            state=PublicationState.FAILED,
            barrier=None,
        )
        raise _refused(row.org_id, state.result)
    _log.info(
        "Trino tenant barrier %s opened for %s at catalog revision %d",
        pub,
        target,
        basis,
        extra=ctx.log_extra(org_id=row.org_id),
    )
