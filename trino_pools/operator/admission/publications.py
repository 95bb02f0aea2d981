"""The publication rows of tenant admission and their identities (spec trino-pools §4.11, §4.16).

The per-org row ``duckgres_trino_pool_publications`` is the durable record of a tenant's
admission; the org reconciler's ready gate (§4.10 step 5) reads ``admitted_target_revision`` and
``state`` from it. The revisions are strings (migration 0007): ``principal_revision`` = the
binding revision last published (32 hex), ``target_revision`` = the target of the live or last
barrier (``b<binding>.a<attempt>``), ``admitted_target_revision`` = the last target the Gateway
admitted (empty = never admitted). ``gateway_receipt`` holds the live barrier's record
``{"barrier": {"publicationId", "targetRevision", "catalogRevision"}}``.

Invariants:

1. **Occurrences, not constant step ids.** Every new principals/revoke intent takes the next
   ``attempt`` (monotone) and its step id ``principals.a<n>`` / ``revoke.a<n>``; a barrier takes
   the target ``b<binding>.a<attempt>`` (a fresh attempt when that target was already used) and
   the publication id derived from it, and its receipt step ids include the publication id. So
   a later change is never a replay of an earlier identical body (safeguard 30). A step id is at
   most 64 characters (an overflowing one keeps its leading part + ``.`` + 24 hex of SHA-256).
2. **Every publication row write is fenced** (``authority.fenced``) and a compare-and-set on
   the row's ``attempt`` and ``pending_intent`` with the row count checked (``RowChanged``
   otherwise). Revoked rows are kept.
3. **Backoff** is full jitter: ``random[0, bound) + 500 ms``, bound doubling per consecutive
   failure from 500 ms, capped at 30 s (stored in ``next_attempt_at``).
4. **Tenants** are the Trino-enabled orgs owned by this pool with at least one principal; their
   principals come from the single function ``catalogs.tenant_principals`` and their binding
   revision from ``catalogs.binding_revision``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models.functions import Now

from duckgres_admin.models.trino import PublicationState, TrinoPoolPublication, WarehouseTrino
from trino_pools import authority
from trino_pools.catalogs import binding_revision, tenant_principals
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import RowChanged

MAX_STEP_ID = 64
DIGEST_HEX = 24
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 30.0
BACKOFF_FLOOR_SECONDS = 0.5
ERROR_MAX = 1024
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


def write(ctx: PoolContext, row: Row, **changes: Any) -> None:
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
        changes["last_error"] = clip(str(changes["last_error"]))
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


def clip(text: str) -> str:
    return text if len(text) <= ERROR_MAX else text[: ERROR_MAX - 3] + "..."


def ensure_rows(ctx: PoolContext, org_ids: Iterable[str], existing: dict[str, Row]) -> None:
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
