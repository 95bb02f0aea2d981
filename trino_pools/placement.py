"""Placement and enablement of warehouses on Trino pools (spec trino-pools §4.2, §2.1 write rules).

Ownership is explicit and durable: the owner (``trino_cell_id``) changes only by initial
selection, default placement at first enablement, or an explicit move. Changing the default
never moves a tenant, disabling keeps the owner, and nothing falls back to another pool. An owner
that is not configured fails closed (409).

Locks, always taken in this order so no two paths deadlock:

1. the per-org connection advisory lock (``pg_advisory_xact_lock``) -- the same key the reshard
   block step and the lease grant path take (reshard spec §4.4 A): enable, disable and move;
2. the warehouse row ``FOR UPDATE``: selection, enable;
3. the warehouse Trino row ``FOR UPDATE``.

Every function runs in one transaction: ``enable_trino`` inside the caller's
``transaction.atomic()`` (the provisioning request's), so a later failure of that request
rolls back both the enable and the placement; the others open their own when called outside one.
Errors are ``PlacementError`` (a ``ServiceError``) carrying the HTTP status and body of spec
§4.2 / §5, so the API layer answers them as every other refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import TrinoTier, WarehouseTrino
from duckgres_admin.platform.orglock import lock_org, org_lock_key
from trino_pools.config import TrinoSettings
from trino_pools.enqueue import queue_reconcile
from trino_pools.registry import STORED_PREFIX

SELECTION_CLOSED = (
    "trino cell selection is only available before initial enablement; existing assignments "
    "cannot change"
)
NOT_CONFIGURED = "the assigned Trino cell is not configured"
SELECT_FIRST = "select an initial Trino cell before enabling Trino"
CELL_REQUIRED = "a configured Trino cell is required"
WAREHOUSE_NOT_FOUND = "managed warehouse not found"
CANNOT_VERIFY = "cannot verify Trino cell assignment"

# The per-org advisory lock (reshard spec §4.4 A) is a cross-domain contract: the reshard block
# step and the lease grant path take the very same lock (``duckgres_admin.platform.orglock``).


class PlacementError(ServiceError):
    """A placement refusal (spec §4.2, §5): the one refusal type, with its machine code and its
    listed extra body fields (``"assigned": true``)."""

    def __init__(
        self, status: int, message: str, code: str = "", extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(status, message, code=code, extra=extra)


@dataclass(frozen=True)
class TrinoPlacement:
    org_id: str
    enabled: bool
    owner: str
    state: str
    tier: str


def _stored(settings: TrinoSettings, public_id: str) -> str:
    cell = settings.cell(public_id) if public_id else None
    if cell is None:
        raise PlacementError(400, CELL_REQUIRED)
    return cell.stored_id


def _row_state(org_id: str) -> TrinoPlacement:
    row = WarehouseTrino.objects.get(warehouse__org_id=org_id)
    return TrinoPlacement(
        org_id=org_id,
        enabled=row.enabled,
        owner=row.trino_cell_id,
        state=row.state,
        tier=row.tier,
    )


def _lock_warehouse(org_id: str) -> str:
    """Lock the warehouse row; returns its state. 404 when missing."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state FROM duckgres_managed_warehouses WHERE org_id = %s FOR UPDATE",
            [org_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise PlacementError(404, WAREHOUSE_NOT_FOUND)
    return str(row[0])


def select_cell(org_id: str, cell: str, settings: TrinoSettings) -> TrinoPlacement:
    """``PUT /warehouses/<org>/trino/cell``: choose the owner before first enablement.

    Idempotent for the same cell; 409 once the row has another owner, is enabled, has left
    ``pending`` or has ``ready_at``/``failed_at`` set. Selection never enables.
    """
    stored = _stored(settings, cell)
    with transaction.atomic():
        _lock_warehouse(org_id)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO duckgres_managed_warehouse_trino (org_id, enabled, state) "
                "VALUES (%s, false, 'pending') ON CONFLICT (org_id) DO NOTHING",
                [org_id],
            )
            cursor.execute(
                "SELECT trino_cell_id, enabled, state, ready_at IS NOT NULL OR failed_at IS NOT "
                "NULL FROM duckgres_managed_warehouse_trino WHERE org_id = %s FOR UPDATE",
                [org_id],
            )
            row = cursor.fetchone()
            assert row is not None
            owner, enabled, state, stamped = str(row[0]), bool(row[1]), str(row[2]), bool(row[3])
            if owner == stored:
                return _row_state(org_id)
            if owner or enabled or state != "pending" or stamped:
                raise PlacementError(409, SELECTION_CLOSED)
            cursor.execute(
                "UPDATE duckgres_managed_warehouse_trino "
                "SET trino_cell_id = %s, updated_at = now() "
                "WHERE org_id = %s AND trino_cell_id = '' AND NOT enabled",
                [stored, org_id],
            )
        return _row_state(org_id)


_ENABLE_SQL = """
INSERT INTO duckgres_managed_warehouse_trino AS t
       (org_id, enabled, tier, trino_cell_id, backend_selected, state, created_at, updated_at)
VALUES (%(org)s, true, %(tier)s, %(default)s, true, 'pending', now(), now())
ON CONFLICT (org_id) DO UPDATE
   SET enabled = true,
       tier = EXCLUDED.tier,
       backend_selected = true,
       updated_at = now(),
       trino_cell_id = COALESCE(NULLIF(t.trino_cell_id, ''), EXCLUDED.trino_cell_id)
RETURNING t.trino_cell_id
"""


def _queue_reconcile(org_id: str) -> None:
    """The pool reconciles the org after this transaction commits (dropped on rollback)."""
    queue_reconcile(org_id)


def enable_trino(org_id: str, settings: TrinoSettings, *, tier: str = "") -> TrinoPlacement:
    """Enable Trino for ``org_id`` inside the caller's ``transaction.atomic()`` block.

    Under the per-org advisory lock: the warehouse must be ``ready`` (409
    ``warehouse_not_ready``), then the owner table of §4.2 decides. With no owner and a valid
    default cell, the default is written in the same statement as ``enabled=true``; an existing
    owner is never overwritten. State, status and timestamps of an existing row are untouched.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("enable_trino must be called inside the caller's transaction.atomic()")
    if tier not in TrinoTier.values:
        raise PlacementError(
            400, f"tier must be one of: {', '.join(repr(t) for t in TrinoTier.values)}"
        )
    with transaction.atomic():  # a savepoint: a refusal undoes only this call's writes
        lock_org(org_id)
        state = _lock_warehouse(org_id)
        if state != "ready":
            raise PlacementError(
                409,
                f"Trino can only be enabled on a ready warehouse (currently {state})",
                code="warehouse_not_ready",
            )
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT trino_cell_id FROM duckgres_managed_warehouse_trino "
                    "WHERE org_id = %s FOR UPDATE",
                    [org_id],
                )
                row = cursor.fetchone()
        except DatabaseError:
            raise PlacementError(500, CANNOT_VERIFY) from None
        owner = str(row[0]) if row else ""
        if not owner:
            if not settings.default_stored_id:
                raise PlacementError(409, SELECT_FIRST)
        elif owner not in settings.stored_ids:
            raise PlacementError(409, NOT_CONFIGURED)
        with connection.cursor() as cursor:
            cursor.execute(
                _ENABLE_SQL, {"org": org_id, "tier": tier, "default": settings.default_stored_id}
            )
            written = cursor.fetchone()
        assert written is not None
        if str(written[0]) not in settings.stored_ids:  # defence in depth: never enable unowned
            raise PlacementError(409, NOT_CONFIGURED)
        _queue_reconcile(org_id)
        return _row_state(org_id)


def disable_trino(org_id: str) -> TrinoPlacement | None:
    """Disable, keeping the owner (it must still tear down the tenant's catalog and admission)."""
    with transaction.atomic():
        lock_org(org_id)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE duckgres_managed_warehouse_trino SET enabled = false, state = 'pending', "
                "status_message = '', failed_at = NULL, updated_at = now() WHERE org_id = %s",
                [org_id],
            )
            if cursor.rowcount == 0:
                return None
        _queue_reconcile(org_id)
        return _row_state(org_id)


def move_cell(org_id: str, from_cell: str, to_cell: str, settings: TrinoSettings) -> TrinoPlacement:
    """Maintenance move ``from → to`` by compare-and-swap; both pools must be configured.

    Resets the row per §2.1 (state ``pending``, status, ``ready_at``, ``failed_at`` and
    ``catalog_name`` cleared; backend and storage fields kept). Repeating a completed move is a
    no-op; a row not on ``from`` is 409.
    """
    source = _stored(settings, from_cell)
    target = _stored(settings, to_cell)
    with transaction.atomic():
        lock_org(org_id)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT trino_cell_id FROM duckgres_managed_warehouse_trino "
                "WHERE org_id = %s FOR UPDATE",
                [org_id],
            )
            row = cursor.fetchone()
            if row is None:
                _lock_warehouse(org_id)  # 404 when the warehouse itself is missing
                raise PlacementError(
                    409, f"the warehouse has no Trino cell assignment on {from_cell}"
                )
            owner = str(row[0])
            if owner == target:
                return _row_state(org_id)
            if owner != source:
                raise PlacementError(409, f"the warehouse's Trino cell is not {from_cell}")
            cursor.execute(
                "UPDATE duckgres_managed_warehouse_trino "
                "SET trino_cell_id = %s, state = 'pending', "
                "status_message = '', ready_at = NULL, failed_at = NULL, catalog_name = '', "
                "updated_at = now() WHERE org_id = %s AND trino_cell_id = %s",
                [target, org_id, source],
            )
        _queue_reconcile(org_id)
        return _row_state(org_id)


def describe(org_id: str, settings: TrinoSettings) -> dict[str, Any]:
    """``GET /warehouses/<org>/trino``: follows the persisted owner, never another pool."""
    row = WarehouseTrino.objects.filter(warehouse__org_id=org_id).first()
    enabled = bool(row and row.enabled)
    owner = row.trino_cell_id if row else ""
    if not owner:
        body: dict[str, Any] = {
            "cell": {},
            "enabled": enabled,
            "assigned": False,
            "available": False,
        }
        if enabled:
            body["status"] = "No Trino cell is assigned to this warehouse."
        return body
    cell = settings.cell_by_stored_id(owner)
    if cell is None:
        raise PlacementError(409, NOT_CONFIGURED, extra={"assigned": True})
    assert row is not None
    return {
        "cell": {
            "id": cell.id,
            "stored_id": cell.stored_id,
            "client_url": cell.resolved_client_url(org_id),
            "namespace": cell.namespace,
            "routing_group": cell.routing_group,
        },
        "enabled": enabled,
        "assigned": True,
        "available": enabled and row.state == "ready",
        "state": row.state,
        "status_message": row.status_message,
        "tier": row.tier,
    }


__all__ = [
    "CANNOT_VERIFY",
    "CELL_REQUIRED",
    "NOT_CONFIGURED",
    "SELECTION_CLOSED",
    "SELECT_FIRST",
    "STORED_PREFIX",
    "WAREHOUSE_NOT_FOUND",
    "PlacementError",
    "TrinoPlacement",
    "describe",
    "disable_trino",
    "enable_trino",
    "lock_org",
    "move_cell",
    "org_lock_key",
    "select_cell",
]
