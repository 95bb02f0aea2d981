"""The per-org advisory lock: lease grants, the reshard block, warehouse PATCH, Trino enablement.

Key: ``duckgres_admin.platform.lockkeys.org_lock_key`` (the registry of every advisory-lock key;
spec
reshard §4.4 A). Taken with ``pg_advisory_xact_lock`` inside the caller's transaction,
so it is released exactly when that transaction commits or rolls back. It lives below both
domains (reshard, trino_pools) because both must take the very same lock.
"""

from __future__ import annotations

from django.db import connection

from duckgres_admin.platform.lockkeys import fnv1a_64 as fnv1a_64
from duckgres_admin.platform.lockkeys import org_lock_key as org_lock_key


def lock_org(org_id: str) -> None:
    """Take the per-org transaction-scoped advisory lock; call inside ``transaction.atomic``."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_org must be called inside transaction.atomic()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [org_lock_key(org_id)])
