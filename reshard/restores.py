"""Restore operations: the start and its dry run (docs/restore.md).

A restore is an operation of kind ``restore`` run by the reshard machinery (the same launch,
claim, fencing, heartbeats, janitor, cancel and rollback): its catalog comes from a backup
object instead of the live source (``reshard.runner.steps.restoring``). What this module adds
to the reshard's start checks, before anything is created:

- the backup is **one of the org's own, as recorded**: the key must be in the warehouse's
  listing (``reshard.backups.belonging``: an object its operation of this org wrote and
  recorded, unchanged since), so another warehouse's backup in a shared bucket, a planted key
  or an overwritten object is refused; the recorded SHA-256, size and VersionId are copied onto
  the restore, whose reader checks them while it streams;
- its operation is terminal (a backup still being written is not restored);
- a backup whose restore test failed is refused (the reason is quoted);
- the target is a cnpg store; the reshard's checks then refuse a target database another
  warehouse binds, or one that exists. The store the warehouse is on is an **in-place**
  restore (``ReshardOperation.in_place``): the target is a new sibling database on that store
  (:func:`sibling_database`), the tenant role and its secret the warehouse's own;
- the fingerprint the backup's operation recorded is copied onto the restore, for its
  verification (none recorded: the dry run and the op log say the check is weaker).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import secrets
from typing import Any

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lib.s3 import S3Error
from duckgres_admin.models import (
    ACTIVE_STATES,
    BackupVerification,
    OpKind,
    ReshardOperation,
    StoreKind,
    VerificationResult,
    Warehouse,
)
from reshard import backups, dryrun, operations
from reshard.backup import KEY_PREFIX
from reshard.kinds import restore_kind
from reshard.start_checks import StartRequest


def _warehouse(org_id: str) -> Warehouse:
    wh = Warehouse.objects.filter(org_id=org_id).first()
    if wh is None:
        raise ServiceError(404, "org has no managed warehouse")
    return wh


SIBLING_MARK = "_restored_"
_SIBLING_SUFFIX = re.compile(re.escape(SIBLING_MARK) + "[0-9a-f]{8}$")
SIBLING_BASE_MAX = 40  # + the mark (10) + 8 hex: within PostgreSQL's 63-byte names


def sibling_database(current: str) -> str:
    """The database an in-place restore of the catalog ``current`` restores into:
    ``<current>_restored_<8 hex>``; an earlier in-place restore's suffix is replaced, not
    stacked, so names never grow."""
    base = _SIBLING_SUFFIX.sub("", current)[:SIBLING_BASE_MAX]
    return f"{base}{SIBLING_MARK}{secrets.token_hex(4)}"


def check_target(wh: Warehouse, request: StartRequest) -> StartRequest:
    """The request a restore starts with: as given, or — onto the store the warehouse is on —
    with the sibling database of the in-place restore."""
    target = request.target
    if target.type != StoreKind.CNPG:
        raise ServiceError(
            400, "target.type: a restore's target is a cnpg metadata store (type cnpg)"
        )
    if wh.metadata_store_kind == StoreKind.CNPG and target.cnpg_shard == wh.metadata_store_id:
        return dataclasses.replace(
            request, in_place_database=sibling_database(wh.metadata_store_database)
        )
    return request


def resolve_backup(wh: Warehouse, key: str) -> tuple[backups.Backup, ReshardOperation]:
    """The org's own backup ``key`` and the operation that made it, or a clear refusal."""
    if not key.startswith(KEY_PREFIX):
        raise ServiceError(
            400, f"backup_key: must be a key under {KEY_PREFIX} (GET /warehouses/<org>/backups)"
        )
    if not wh.data_bucket:
        raise ServiceError(409, "the warehouse has no data bucket: it has no backups")
    try:
        objects, truncated = backups.warehouse_client(wh).list_objects(
            wh.data_bucket, KEY_PREFIX, limit=backups.LIST_MAX_OBJECTS
        )
    except S3Error as exc:
        raise ServiceError(
            503, f"cannot list the backups in s3://{wh.data_bucket}/{KEY_PREFIX}: {exc}"
        ) from None
    listing = backups.belonging(wh, objects, truncated, dt.datetime.now(dt.UTC))
    found = next((b for b in listing.backups if b.key == key), None)
    changed = next((why for changed_key, why in listing.changed if changed_key == key), "")
    if changed:
        raise ServiceError(
            409,
            f"backup_key: s3://{wh.data_bucket}/{key} is not restored: {changed}",
            code="backup_changed",
        )
    if found is None:
        raise ServiceError(
            404,
            f"backup_key: {key} is not a recorded backup of this warehouse in "
            f"s3://{wh.data_bucket} (only objects the product wrote and recorded are backups; "
            "GET /warehouses/<org>/backups lists them)",
        )
    if found.op_state in ACTIVE_STATES:
        raise ServiceError(409, f"the backup's operation {found.op_id} is still {found.op_state}")
    if found.verified is False:
        raise ServiceError(
            409,
            f"the restore test of this backup failed ({found.verification_detail}); restore "
            "another backup",
        )
    op = ReshardOperation.objects.get(pk=found.op_id)
    return found, op


def _fields(
    wh: Warehouse, key: str, request: StartRequest
) -> tuple[StartRequest, operations.RestoreFields, backups.Backup, ReshardOperation]:
    request = check_target(wh, request)
    found, made_by = resolve_backup(wh, key)
    fingerprint = made_by.catalog_fingerprint
    fields = operations.RestoreFields(
        key,
        fingerprint if isinstance(fingerprint, dict) else None,
        bucket=wh.data_bucket,
        etag=found.etag,
        sha256=found.sha256,
        size=found.size,
        version_id=found.version_id,
    )
    return request, fields, found, made_by


def restore_start(
    *, org_id: str, key: str, request: StartRequest, actor: str
) -> operations.StartOutcome:
    wh = _warehouse(org_id)
    request, fields, _, _ = _fields(wh, key, request)
    return operations.reshard_op_start(org_id=org_id, request=request, actor=actor, restore=fields)


def restore_dry_run(org_id: str, key: str, request: StartRequest) -> dict[str, Any]:
    """The reshard's dry run to the target, with the backup's facts; creates nothing."""
    wh = _warehouse(org_id)
    request, fields, found, made_by = _fields(wh, key, request)
    plan = dryrun.dry_run(org_id, request)
    plan["kind"] = OpKind.RESTORE.value
    plan["cancel_cutoff"] = (
        restore_kind(in_place=bool(request.in_place_database))
        .cancel_cutoff(StoreKind.CNPG.value)
        .description
    )
    tested = BackupVerification.objects.filter(bucket=wh.data_bucket, key=key).first()
    plan["restore"] = {
        "backup_key": key,
        "uri": f"s3://{wh.data_bucket}/{key}",
        "size": found.size,
        "made_by_op": made_by.id,
        "restore_test": (
            None
            if tested is None
            else {"passed": tested.result == VerificationResult.PASSED, "detail": tested.detail}
        ),
        "verification": (
            "the restored DuckLake state is compared with the fingerprint operation "
            f"{made_by.id} recorded (snapshot {fields.fingerprint.get('snapshot_id')}, "
            f"{fields.fingerprint.get('data_files')} data files)"
            if fields.fingerprint
            else f"operation {made_by.id} recorded no DuckLake fingerprint: only the presence "
            "of the DuckLake tables is verified"
        ),
        "in_place": bool(request.in_place_database),
        "replaces": (
            f"in place on store {request.target.cnpg_shard}: the backup is restored into the "
            f"new database {request.in_place_database} while the tenant role stays fenced; "
            "the current catalog is backed up (mandatory), the binding moves to the new "
            "database, the current one is dropped, then the tenant role logs in again"
            if request.in_place_database
            else "the current catalog is backed up (mandatory), the restored one takes its "
            "place, and the current one is dropped after the binding moved"
        ),
    }
    plan["backup"]["mandatory"] = True
    return plan
