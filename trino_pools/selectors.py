"""Read models for the Trino API (spec trino-pools §5), ready for the API layer to expose.

Every cell-scoped operational read requires an explicit ``?cell=<public id>``: missing → 400
"explicit Trino cell selection is required", unknown → 404 "unknown Trino cell". There is no
default cell for these reads. Refusals are ``PlacementError`` (status + body), like placement.
"""

from __future__ import annotations

from typing import Any

from duckgres_admin.models import (
    InstancePhase,
    TrinoApiMode,
    TrinoPool,
    TrinoPoolInstance,
    WarehouseTrino,
)
from trino_pools.config import TrinoSettings
from trino_pools.placement import PlacementError
from trino_pools.registry import Cell

TERMINAL_PHASES = (InstancePhase.RETIRED, InstancePhase.FAILURE_RETIRED)


def list_cells(settings: TrinoSettings) -> dict[str, Any]:
    """``GET /trino/cells``."""
    return {
        "cells": [
            {
                "id": cell.id,
                "stored_id": cell.stored_id,
                "client_url": cell.client_url,
                "namespace": cell.namespace,
                "routing_group": cell.routing_group,
            }
            for cell in sorted(settings.cells, key=lambda c: c.id)
        ]
    }


def require_cell(settings: TrinoSettings, public_id: str | None) -> Cell:
    if not public_id:
        raise PlacementError(400, "explicit Trino cell selection is required")
    cell = settings.cell(public_id)
    if cell is None:
        raise PlacementError(404, "unknown Trino cell")
    return cell


def _iso(value: Any) -> str | None:
    return None if value is None else str(value.isoformat())


def org_rows(settings: TrinoSettings, public_id: str | None) -> dict[str, Any]:
    """``GET /trino/orgs?cell=``: the per-org rows owned by the pool, from the database."""
    cell = require_cell(settings, public_id)
    rows = WarehouseTrino.objects.filter(trino_cell_id=cell.stored_id).order_by("warehouse_id")
    return {
        "cell": cell.id,
        "orgs": [
            {
                "org_id": row.warehouse_id,
                "enabled": row.enabled,
                "tier": row.tier,
                "state": row.state,
                "status_message": row.status_message,
                "ready_at": _iso(row.ready_at),
                "failed_at": _iso(row.failed_at),
                "backend": row.backend,
                "catalog_name": row.catalog_name,
            }
            for row in rows
        ],
    }


def instances(settings: TrinoSettings, public_id: str | None) -> dict[str, Any]:
    """``GET /trino/instances?cell=``: non-terminal instances of a shared pool, by id.

    (The route is for admins with a non-empty identity email; that check belongs to the API.)
    ``node_replacement`` is included only when the stored evidence is a JSON object.
    """
    cell = require_cell(settings, public_id)
    pool = TrinoPool.objects.filter(pool_id=cell.stored_id).first()
    if pool is None or pool.api_mode != TrinoApiMode.SHARED_POOL:
        raise PlacementError(404, "unknown shared Trino pool")
    listed = []
    for inst in (
        TrinoPoolInstance.objects.filter(pool=pool)
        .exclude(phase__in=[p.value for p in TERMINAL_PHASES])
        .order_by("instance_id")
    ):
        item: dict[str, Any] = {
            "instance_id": inst.instance_id,
            "phase": inst.phase,
            "gateway_state": inst.gateway_state,
            "phase_changed_at": _iso(inst.phase_changed_at),
        }
        if isinstance(inst.node_replacement_evidence, dict) and inst.node_replacement_evidence:
            item["node_replacement"] = inst.node_replacement_evidence
        listed.append(item)
    return {"cell": cell.id, "instances": listed}
