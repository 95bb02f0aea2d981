"""Tenant admission of a shared Trino pool (spec trino-pools §4.11, §4.16 tenants/publications).

Runs once per pool tick (``run(ctx)``) and only when the pool's ``tenant_admission`` is true. A
tenant is a Trino-enabled org owned by this pool; its principals come from the single function
``catalogs.tenant_principals`` and its binding revision from ``catalogs.binding_revision``. The
Gateway admits a tenant through a **publication barrier**: open it at the pool's catalog revision,
record one receipt per required member (each member probed first), commit. The per-org row
``duckgres_trino_pool_publications`` is the durable record; the org reconciler's ready gate
(§4.10 step 5) reads ``admitted_target_revision`` and ``state`` from it.

Invariants:

1. **Fail closed on revision evidence.** Every pass starts by recovering the catalog revision
   watermark (``catalog_writer.recover_watermark``); if that fails nothing else happens this tick
   (no barrier is opened, advanced or committed on an unproven revision).
2. **At most one external step per tick**, chosen in the §4.11 priority order: (1) a candidate
   is VALIDATING → release the live barrier; (2) service the single live barrier; (3) settle a
   pending intent; (4) revoke a departed tenant; (5)/(6) alternately publish one changed binding
   and open the next barrier. Reads (GET publication, GET members, the coordinator probe) are not
   steps. Round-robin cursors per category (term memory) keep one failing tenant from
   monopolising a category (safeguard 28); per-tenant backoff keeps it from monopolising the
   tick across categories.
3. **One live barrier per pool.** A barrier is opened only when no row of the pool points at one
   (``publication_id``), no candidate is validating, serving ≥ ``min_serving``, the binding is
   published, the tenant's catalog is in the store, no intent is pending and the tenant is not in
   backoff. The barrier basis (the catalog revision it was opened at) lives in this term's memory:
   a barrier whose basis is unknown to this process or no longer the pool's revision is released,
   never committed (safeguard 29).
4. **Occurrences, not constant step ids.** Every new principals/revoke intent takes the next
   ``attempt`` (monotone) and its step id ``principals.a<n>`` / ``revoke.a<n>``; a barrier takes
   the target ``b<binding>.a<attempt>`` (a fresh attempt when that target was already used) and
   the publication id derived from it, and its receipt step ids include the publication id. So a
   later change is never a replay of an earlier identical body (safeguard 30).
5. **Intent before effect.** Every Gateway mutation goes through ``effects.run_step`` (journalled
   and fenced before the call, outcome recorded after, unknown outcomes resolved by the Gateway's
   operation journal). A principals/revoke intent is also pinned on the row (``pending_intent`` +
   ``pending_request_body``) before its step runs, and is settled by re-sending exactly that body
   under the same occurrence before anything newer for the tenant.
6. **Failures.** A refusal closes the occurrence (the next try is a new attempt); an unknown
   outcome keeps it pinned; ``POOL_STALE_EPOCH`` raises ``PoolConflict`` (ends the term). Every
   failure sets per-tenant backoff: full jitter, ``random[0, bound) + 500 ms``, bound doubling per
   consecutive failure from 500 ms, capped at 30 s, in ``next_attempt_at``. A tenant waiting in
   backoff raises nothing.
7. **Every publication row write is fenced** (``authority.fenced``) and a compare-and-set on the
   row's ``attempt`` and ``pending_intent`` with the row count checked. Revoked rows are kept.

The revisions are strings (migration 0007): ``principal_revision`` = the binding revision last
published (32 hex), ``target_revision`` = the target of the live or last barrier
(``b<binding>.a<attempt>``), ``admitted_target_revision`` = the last target the Gateway admitted
(empty = never admitted). ``gateway_receipt`` holds the live barrier's record
``{"barrier": {"publicationId", "targetRevision", "catalogRevision"}}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from duckgres_admin.lib.gateway import (
    GatewayClient,
    GatewayProtocolError,
    GatewayRefused,
    Member,
    Publication,
    parse_members,
    parse_operation,
    parse_publication,
)
from duckgres_admin.models.trino import (
    InstancePhase,
    PendingIntent,
    PublicationState,
    TrinoPoolInstance,
    TrinoPoolPublication,
    WarehouseTrino,
)
from trino_pools import authority, catalog_writer, effects, probes
from trino_pools.catalogs import binding_revision, tenant_principals

if TYPE_CHECKING:
    from trino_pools.operator import PoolContext

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

MAX_STEP_ID = 64
DIGEST_HEX = 24
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 30.0
BACKOFF_FLOOR_SECONDS = 0.5
ERROR_MAX = 1024

RECEIPT_PHASES = (InstancePhase.SERVING, InstancePhase.ADMITTED)

# term scratch keys
_CURSORS = "admission.cursors"
_TURN = "admission.turn"
_BASIS = "admission.basis"
#: Optional term-scratch override of the observer credential source for receipt probes
#: (``Callable[[namespace], (username, password)]``); production reads the Secret.
CREDENTIALS_KEY = "admission.credentials"

_random = random.SystemRandom()


# --- identities (§4.11) --------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def operation_id(org_id: str) -> str:
    return f"tenant:{org_id}"


def occurrence(attempt: int) -> str:
    return f"a{attempt}"


def step_id(text: str) -> str:
    """At most 64 chars: an overflowing id keeps its leading part + ``.`` + 24 hex of SHA-256."""
    if len(text) <= MAX_STEP_ID:
        return text
    return text[: MAX_STEP_ID - DIGEST_HEX - 1] + "." + _sha256(text)[:DIGEST_HEX]


def target_revision(binding: str, attempt: int) -> str:
    return f"b{binding}.{occurrence(attempt)}"


def binding_of(target: str) -> str:
    """The binding revision inside a target ``b<binding>.a<n>`` (``''`` when not a target)."""
    if not target.startswith("b") or ".a" not in target:
        return ""
    return target[1:].rsplit(".a", 1)[0]


def publication_id(tenant: str, target: str) -> str:
    return "pub." + _sha256(f"{tenant}\0{target}")[:DIGEST_HEX]


def open_payload_hash(tenant: str, target: str, catalog_revision: int) -> str:
    return _sha256(f"{tenant}\0{target}\0{catalog_revision}")


def intent_step(intent: str, attempt: int) -> str:
    return step_id(f"{intent}.{occurrence(attempt)}")


def open_step(pub: str) -> str:
    return step_id(f"open.{pub}")


def commit_step(pub: str) -> str:
    return step_id(f"commit.{pub}")


def abandon_step(pub: str) -> str:
    return step_id(f"abandon.{pub}")


def receipt_step(pub: str, instance_id: str) -> str:
    return step_id(f"receipt.{pub}.{instance_id}")


def backoff_delay(failures: int, rng: Callable[[], float] = _random.random) -> float:
    """Full jitter: ``random[0, bound) + 0.5 s``, bound 0.5 s doubling per failure, cap 30 s."""
    exponent = max(failures, 1) - 1
    bound = min(BACKOFF_BASE_SECONDS * (2 ** min(exponent, 16)), BACKOFF_CAP_SECONDS)
    return float(rng() * bound + BACKOFF_FLOOR_SECONDS)


# --- the publication row -------------------------------------------------------------------------

_REV_FIELDS = ("principal_revision", "target_revision", "admitted_target_revision")


@dataclass
class Row:
    """One publication row with its string revisions resolved."""

    org_id: str
    state: str
    attempt: int
    attempts: int
    next_attempt_at: datetime | None
    pending_intent: str
    pending_body: str
    publication_id: str
    principal_revision: str
    target_revision: str
    admitted_target_revision: str
    receipt: dict[str, Any]
    last_error: str

    @property
    def live_barrier(self) -> bool:
        return bool(self.publication_id) and self.state != PublicationState.REVOKED

    def in_backoff(self, now: datetime) -> bool:
        return self.next_attempt_at is not None and self.next_attempt_at > now

    @property
    def barrier_basis(self) -> int | None:
        barrier = self.receipt.get("barrier")
        if isinstance(barrier, dict) and barrier.get("publicationId") == self.publication_id:
            value = barrier.get("catalogRevision")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None


ROW_FIELDS = (
    "org_id",
    "state",
    "attempt",
    "attempts",
    "next_attempt_at",
    "pending_intent",
    "pending_request_body",
    "publication_id",
    "principal_revision",
    "target_revision",
    "admitted_target_revision",
    "gateway_receipt",
    "last_error",
)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _row(values: dict[str, Any]) -> Row:
    receipt = values["gateway_receipt"]
    return Row(
        org_id=values["org_id"],
        state=values["state"],
        attempt=int(values["attempt"]),
        attempts=int(values["attempts"]),
        next_attempt_at=values["next_attempt_at"],
        pending_intent=values["pending_intent"],
        pending_body=values["pending_request_body"],
        publication_id=values["publication_id"],
        principal_revision=_text(values["principal_revision"]),
        target_revision=_text(values["target_revision"]),
        admitted_target_revision=_text(values["admitted_target_revision"]),
        receipt=dict(receipt) if isinstance(receipt, dict) else {},
        last_error=values["last_error"],
    )


def load_rows(pool_id: str, org_ids: Iterable[str] | None = None) -> dict[str, Row]:
    """The pool's publication rows (plain values: one query, no model instances)."""
    query = TrinoPoolPublication.objects.filter(pool_id=pool_id)
    if org_ids is not None:
        query = query.filter(org_id__in=list(org_ids))
    return {v["org_id"]: _row(v) for v in query.order_by("org_id").values(*ROW_FIELDS)}


class RowChanged(Exception):
    """A publication row changed under this term (compare-and-set lost)."""


def _write(ctx: PoolContext, row: Row, **changes: Any) -> None:
    """Fenced compare-and-set on ``(attempt, pending_intent)``; updates ``row`` in place."""
    receipt = dict(row.receipt)
    fields: dict[str, Any] = {}
    for name in _REV_FIELDS:
        if name in changes:
            value = str(changes.pop(name))
            fields[name] = value
            setattr(row, name, value)
    if "barrier" in changes:
        barrier = changes.pop("barrier")
        if barrier is None:
            receipt.pop("barrier", None)
        else:
            receipt["barrier"] = barrier
    if "last_error" in changes:
        changes["last_error"] = _clip(str(changes["last_error"]))
    fields.update(changes)
    fields["gateway_receipt"] = receipt
    fields["updated_at"] = Now()
    with authority.fenced(ctx.auth):
        updated = TrinoPoolPublication.objects.filter(
            pool_id=ctx.auth.pool_id,
            org_id=row.org_id,
            attempt=row.attempt,
            pending_intent=row.pending_intent,
        ).update(**fields)
    if updated != 1:
        raise RowChanged(f"the publication row of {row.org_id} changed under this term")
    row.receipt = receipt
    for name in (
        "state",
        "attempt",
        "attempts",
        "next_attempt_at",
        "publication_id",
        "last_error",
    ):
        if name in changes:
            setattr(row, name, changes[name])
    if "pending_intent" in changes:
        row.pending_intent = changes["pending_intent"]
    if "pending_request_body" in changes:
        row.pending_body = changes["pending_request_body"]


def _clip(text: str) -> str:
    return text if len(text) <= ERROR_MAX else text[: ERROR_MAX - 3] + "..."


def _ensure_rows(ctx: PoolContext, org_ids: Iterable[str], existing: dict[str, Row]) -> None:
    missing = sorted(set(org_ids) - set(existing))
    if not missing:
        return
    with authority.fenced(ctx.auth), connection.cursor() as cursor:
        # One statement however many tenants appeared (constant queries per pool per tick).
        cursor.execute(
            "INSERT INTO duckgres_trino_pool_publications (pool_id, org_id) "
            "SELECT %s, unnest(%s::text[]) ON CONFLICT (pool_id, org_id) DO NOTHING",
            [ctx.auth.pool_id, missing],
        )
    existing.update(load_rows(ctx.auth.pool_id, missing))


# --- tenants -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tenant:
    org_id: str
    principals: tuple[str, ...]
    catalog: str

    @property
    def binding(self) -> str:
        return binding_revision(self.principals)


@dataclass(frozen=True)
class _WarehouseView:
    """The columns of a warehouse that ``tenant_principals`` reads."""

    database_name: str


def wanted_tenants(pool_id: str) -> dict[str, Tenant]:
    """Orgs owned by this pool, enabled, with at least one principal (one query, plain values)."""
    result: dict[str, Tenant] = {}
    rows = (
        WarehouseTrino.objects.filter(trino_cell_id=pool_id, enabled=True)
        .order_by("warehouse_id")
        .values_list("warehouse_id", "catalog_name", "warehouse__database_name")
    )
    for org_id, catalog, database_name in rows:
        principals = tuple(tenant_principals(_WarehouseView(database_name or "")))
        if principals:
            result[str(org_id)] = Tenant(str(org_id), principals, catalog)
    return result


# --- errors --------------------------------------------------------------------------------------


class AdmissionError(Exception):
    """A tenant step failed for a reason that is not a Gateway answer (probe, protocol)."""


def _refused(org_id: str, result: Any) -> GatewayRefused:
    data = result if isinstance(result, dict) else {}
    return GatewayRefused(
        str(data.get("code") or ""),
        int(data.get("status") or 409),
        f"tenant {org_id}: {data.get('message') or 'refused'}",
    )


def _refusal_text(result: Any) -> str:
    data = result if isinstance(result, dict) else {}
    return f"the Gateway refused ({data.get('code') or 'no code'}): {data.get('message') or ''}"


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


def _scratch(ctx: PoolContext) -> dict[str, Any]:
    return ctx.term.scratch


def _basis_memory(ctx: PoolContext) -> dict[str, int]:
    memory = _scratch(ctx).setdefault(_BASIS, {})
    assert isinstance(memory, dict)
    return memory


def _round_robin(ctx: PoolContext, category: str, candidates: Sequence[str]) -> str | None:
    """The first candidate after the category's cursor (wrapping); moves the cursor to it."""
    if not candidates:
        return None
    cursors = _scratch(ctx).setdefault(_CURSORS, {})
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
    _ensure_rows(ctx, tenants, rows)
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
    rg = ctx.cell.routing_group
    ctx.ensure_leading()
    state = effects.run_step(
        ctx.auth,
        operation_id=operation_id(row.org_id),
        kind=OPERATION_KIND,
        step_id=abandon_step(pub),
        body={"reason": reason},
        call=lambda payload: ctx.gateway.send(
            "POST", GatewayClient.pool_path(rg, "publications", pub, "abandon"), payload
        ),
        read_back=_read_back(ctx, row.org_id),
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
    _write(ctx, row, publication_id="", state=state, barrier=None)
    _log.info("Trino tenant barrier %s %s", pub, why, extra=ctx.log_extra(org_id=row.org_id))


def _record_admitted(ctx: PoolContext, row: Row, pub: Publication) -> None:
    target = pub.admitted_target_revision or pub.target_revision or row.target_revision
    _basis_memory(ctx).pop(row.publication_id, None)
    _write(
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
    source = _scratch(ctx).get(CREDENTIALS_KEY) or probes.observer_credential
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
        _fail(ctx, row, _refusal_text(state.result))
        raise _refused(row.org_id, state.result)


def _commit(p: _Pass, row: Row, pub: Publication) -> None:
    ctx = p.ctx
    path = p.path("publications", pub.publication_id, "commit")
    state = _run(ctx, row, commit_step(pub.publication_id), {}, "POST", path)
    if state.outcome == "failed":
        _fail(ctx, row, _refusal_text(state.result))
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
    ctx.ensure_leading()  # renew before the effect: never send past the renew deadline
    try:
        return effects.run_step(
            ctx.auth,
            operation_id=operation_id(row.org_id),
            kind=OPERATION_KIND,
            step_id=step,
            body=body,
            call=lambda payload: ctx.gateway.send(method, path, payload),
            read_back=_read_back(ctx, row.org_id),
        )
    except effects.EffectUnknown as exc:
        _fail(ctx, row, str(exc))
        raise


def _read_back(
    ctx: PoolContext, org_id: str
) -> Callable[[effects.StepState], effects.Settled | None]:
    """Resolve an unknown step from the Gateway's journal of ``tenant:<org>`` (§4.7 step 4)."""
    op = operation_id(org_id)

    def read(state: effects.StepState) -> effects.Settled | None:
        try:
            raw = ctx.gateway.get(GatewayClient.pool_path(ctx.cell.routing_group, "operations", op))
        except GatewayRefused as exc:
            if exc.code == "POOL_NOT_FOUND":
                return None
            raise
        found = parse_operation(raw).step(state.step_id)
        if found is None:
            return None  # never received: the stored payload is re-sent byte for byte
        if found.outcome == "APPLIED":
            return effects.Settled("ok", found.result)
        return effects.Settled(
            "failed",
            {
                "code": found.code,
                "status": 409,
                "message": "refused, per the Gateway's operation journal",
            },
        )

    return read


def _fail(ctx: PoolContext, row: Row, error: str, **changes: Any) -> None:
    """Record a failure on the row and put the tenant in backoff."""
    failures = row.attempts + 1
    delay = backoff_delay(failures)
    _write(
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
            f"{intent}.{occurrence(row.attempt)}: {_refusal_text(state.result)}",
            pending_intent="",
            pending_request_body="",
            state=PublicationState.FAILED,
        )
        raise _refused(row.org_id, state.result)
    if intent == PendingIntent.PRINCIPALS:
        binding = str(body.get("bindingRevision") or "")
        admitted_binding = binding_of(row.admitted_target_revision)
        _write(
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
        _write(
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
    _write(
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
        _write(p.ctx, row, state=PublicationState.REVOKED, attempts=0, next_attempt_at=None)
        return False
    _begin_intent(p, row, PendingIntent.REVOKE, {"reason": REVOKE_REASON})
    return True


# (5)/(6) publish one changed binding, open the next barrier --------------------------------------


def _publish_or_open(p: _Pass) -> bool:
    scratch = _scratch(p.ctx)
    first = scratch.get(_TURN, "publish")
    order = (_publish_binding, _open_next) if first == "publish" else (_open_next, _publish_binding)
    for stage in order:
        if stage(p):
            scratch[_TURN] = "open" if stage is _publish_binding else "publish"
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
        _write(
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
            f"open {pub}: {_refusal_text(state.result)}",
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


__all__ = [
    "CANDIDATE_REASON",
    "REVOKE_REASON",
    "AdmissionError",
    "Row",
    "backoff_delay",
    "binding_of",
    "load_rows",
    "occurrence",
    "open_payload_hash",
    "operation_id",
    "publication_id",
    "receipt_step",
    "release_barrier",
    "run",
    "step_id",
    "target_revision",
]
