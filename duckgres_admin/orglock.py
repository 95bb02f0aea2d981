"""The per-org advisory lock: lease grants, the reshard block, warehouse PATCH, Trino enablement.

Key: the 64-bit FNV-1a hash of ``duckgres:org-connections:<org>`` with the sign bit masked
(spec reshard §4.4 A). Taken with ``pg_advisory_xact_lock`` inside the caller's transaction,
so it is released exactly when that transaction commits or rolls back. It lives below both
domains (reshard, trino_pools) because both must take the very same lock.
"""

from __future__ import annotations

from django.db import connection

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def fnv1a_64(data: bytes) -> int:
    value = _FNV_OFFSET
    for byte in data:
        value ^= byte
        value = (value * _FNV_PRIME) & _MASK64
    return value


def org_lock_key(org_id: str) -> int:
    return fnv1a_64(f"duckgres:org-connections:{org_id}".encode()) & 0x7FFFFFFFFFFFFFFF


def lock_org(org_id: str) -> None:
    """Take the per-org transaction-scoped advisory lock; call inside ``transaction.atomic``."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_org must be called inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [org_lock_key(org_id)])
