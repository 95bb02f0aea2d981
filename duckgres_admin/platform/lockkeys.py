"""Every PostgreSQL advisory-lock key the product takes, in one registry.

**Values never change.** During an upgrade the fleet runs two versions side by side, and both
must take the very same key for the same thing; a changed key is two locks that exclude nothing.
A new key is added here (a new name and a value no other key has), never reused.

Fixed keys (``FIXED_KEYS``, checked unique when this module is imported):

``COPY_TARGET_LOCK_KEY`` = 824460
    Guards: one catalog copier per target database (docs/copy.md "One copier per target").
    Session-level ``pg_try_advisory_lock`` on the copy's primary target connection, held for
    the whole copy and released when that connection closes; a second copier is refused.
    Taken by: ``reshard.engines.copy.catalog`` (``_fence_target``), in the reshard runner's copy
    step, on the
    **target metadata store**.

``BACKUP_RETENTION_LOCK_KEY`` = 824461
    Guards: one backup-retention run at a time (docs/backup.md "Retention"), so two runs never
    delete concurrently. Session-level ``pg_try_advisory_lock`` on the **config store**
    connection of the run, held for the whole run (checked before every deletion) and released
    at its end or when that connection closes; a second run finds it taken and does nothing.
    Taken by: ``reshard.backups.inventory`` (``apply_retention``), in the
    ``reshard.backup_retention`` task on ``duckgres.default``.

``STORE_DRAIN_LOCK_CLASS`` = 824462, with the drain's id: ``(824462, <drain id>)``
    Guards: one advance of a store drain at a time (docs/drains.md), so that a janitor leader
    that lost its lease mid-launch and its successor never count and launch the same drain's
    children together (the ``max_concurrent`` bound holds across a failover). Session-level
    ``pg_try_advisory_lock(int4, int4)`` on the **config store** connection of the janitor,
    held while it advances that drain and released right after (or when the connection
    closes: a killed leader frees it); a second advance finds it taken and skips the drain for
    this tick. Taken by: ``reshard.control.drains`` (``advance``), in the janitor's tick on
    ``duckgres.control``. The two-int form never meets the fixed keys, which use ``(0, key)``.

``RESTORE_TEST_LOCK_KEY`` = 824463
    Guards: one backup restore-test run at a time (docs/backup.md "Restore tests"), so two runs
    never restore into, or sweep, the same scratch database. Session-level
    ``pg_try_advisory_lock`` on the **config store** connection of the run, held for the whole
    run (checked before every restore) and released at its end or when that connection closes.
    Taken by: ``reshard.backups.restore_test`` (``run``), in the ``reshard.backup_restore_test``
    task on ``duckgres.default``.

Derived keys (one key per value, in a space no fixed key is meant to share):

``org_lock_key(org_id)``: the per-org connections lock (spec reshard §4.4 A)
    Key: the 64-bit FNV-1a hash of ``duckgres:org-connections:<org>`` with the sign bit masked
    (a non-negative ``bigint``). Guards: once a reshard's block commits, no connection lease is
    granted for the org and its warehouse/Trino rows do not move under the runner.
    Transaction-scoped ``pg_advisory_xact_lock`` on the **config store**, through
    ``duckgres_admin.platform.orglock.lock_org``. Taken by: the lease grant
    (``duckgres_admin.dataplane.leases``), the
    warehouse PATCH (``reshard.warehouses.writes``), the runner's block, drain and rollback steps
    (``reshard.runner.steps.blocking``, ``.draining``, ``reshard.runner.rollback``), Trino
    enable, disable and cell move (``trino_pools.placement``, also from the Trino API view),
    and the org reconcile's orphan removal (``trino_pools.reconcile``).
"""

from __future__ import annotations

from collections.abc import Mapping

COPY_TARGET_LOCK_KEY = 824460
BACKUP_RETENTION_LOCK_KEY = 824461
STORE_DRAIN_LOCK_CLASS = 824462
RESTORE_TEST_LOCK_KEY = 824463

FIXED_KEYS: Mapping[str, int] = {
    "COPY_TARGET_LOCK_KEY": COPY_TARGET_LOCK_KEY,
    "BACKUP_RETENTION_LOCK_KEY": BACKUP_RETENTION_LOCK_KEY,
    "STORE_DRAIN_LOCK_CLASS": STORE_DRAIN_LOCK_CLASS,
    "RESTORE_TEST_LOCK_KEY": RESTORE_TEST_LOCK_KEY,
}

ORG_LOCK_PREFIX = "duckgres:org-connections:"

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF
_MASK63 = 0x7FFFFFFFFFFFFFFF
_BIGINT_MIN = -(2**63)
_BIGINT_MAX = 2**63 - 1


def fnv1a_64(data: bytes) -> int:
    value = _FNV_OFFSET
    for byte in data:
        value ^= byte
        value = (value * _FNV_PRIME) & _MASK64
    return value


def org_lock_key(org_id: str) -> int:
    """The per-org connections lock's key (see the module docstring)."""
    return fnv1a_64(f"{ORG_LOCK_PREFIX}{org_id}".encode()) & _MASK63


def _check_fixed_keys(keys: Mapping[str, int]) -> None:
    """Refuse a registry where two names share a value or a value is not a ``bigint``."""
    owners: dict[int, str] = {}
    for name, value in keys.items():
        if not _BIGINT_MIN <= value <= _BIGINT_MAX:
            raise RuntimeError(f"advisory-lock key {name} = {value} is not a PostgreSQL bigint")
        if value in owners:
            raise RuntimeError(
                f"advisory-lock keys {owners[value]} and {name} share the value {value}"
            )
        owners[value] = name


_check_fixed_keys(FIXED_KEYS)
