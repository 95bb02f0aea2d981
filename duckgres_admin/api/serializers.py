"""JSON shapes of the API (spec reshard §5): op JSON is the §2.5 columns, RFC 3339 times."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from duckgres_admin.base.times import rfc3339 as _rfc3339
from duckgres_admin.models import MetadataStore, ReshardLogEntry, ReshardOperation, Warehouse


def rfc3339(value: datetime | None) -> str | None:
    return _rfc3339(value) if value is not None else None


def _columns(instance: models.Model) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in instance._meta.concrete_fields:
        value = getattr(instance, f.attname)
        out[f.column] = rfc3339(value) if isinstance(value, datetime) else value
    return out


def op_json(op: ReshardOperation) -> dict[str, Any]:
    """Every §2.5 column; there is no password column, so none can appear. The local pull
    credential's digest is left out too (it is a verifier, of no use to a reader). Besides
    ``kind`` (a column: ``reshard`` or ``restore``), ``in_place`` says whether a restore goes
    onto the store the warehouse is on (``ReshardOperation.in_place``; false for a reshard)."""
    data = _columns(op)
    data.pop("password_pull_digest", None)
    data["in_place"] = op.in_place
    return data


def log_entry_json(entry: ReshardLogEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "operation_id": entry.operation_id,
        "ts": rfc3339(entry.ts),
        "level": entry.level,
        "source": entry.source,
        "message": entry.message,
    }


def warehouse_json(warehouse: Warehouse) -> dict[str, Any]:
    data = _columns(warehouse)
    data.pop("id", None)
    data["writable"] = warehouse.writable
    return data


def store_json(store: MetadataStore) -> dict[str, Any]:
    return _columns(store)
