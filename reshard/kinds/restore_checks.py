"""A restore's own start checks, as rows of the start's table (docs/restore.md).

``RestoreStart`` is what the restore kinds add to a start (``start_checks.KindStart``): two rows
walked before the shared table — by the start fail-fast, by the dry run reported with every
other check — and the restore's fields on the passed plan:

- ``restore_target``: the target is a cnpg store (400 otherwise). The store the warehouse is on
  is an **in-place** restore (``ReshardOperation.in_place``): the request's target becomes a new
  sibling database on that store (:func:`sibling_database`), the tenant role and its secret the
  warehouse's own; the shared rows then refuse a target database another warehouse binds, or
  one that exists.
- ``restore_backup``: the backup is **one of the org's own, as recorded** — the key must be in
  the warehouse's listing (``reshard.backups.inventory.belonging``: an object its operation of this
  org wrote and recorded, unchanged since), so another warehouse's backup in a shared bucket, a
  planted key or an overwritten object is refused; its operation is terminal (a backup still
  being written is not restored); a backup whose restore test failed is refused (the reason is
  quoted). The recorded SHA-256, size and VersionId, and the fingerprint its operation recorded
  (for the verification; none: the dry run and the op log say the check is weaker), are copied
  onto the restore.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import secrets
from dataclasses import dataclass, field
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
from reshard.backups import inventory
from reshard.engines.backup import KEY_PREFIX
from reshard.kinds.checks import Check, Plan, Preflight

SIBLING_MARK = "_restored_"
_SIBLING_SUFFIX = re.compile(re.escape(SIBLING_MARK) + "[0-9a-f]{8}$")
SIBLING_BASE_MAX = 40  # + the mark (10) + 8 hex: within PostgreSQL's 63-byte names


def sibling_database(current: str) -> str:
    """The database an in-place restore of the catalog ``current`` restores into:
    ``<current>_restored_<8 hex>``; an earlier in-place restore's suffix is replaced, not
    stacked, so names never grow."""
    base = _SIBLING_SUFFIX.sub("", current)[:SIBLING_BASE_MAX]
    return f"{base}{SIBLING_MARK}{secrets.token_hex(4)}"


def resolve_backup(wh: Warehouse, key: str) -> tuple[inventory.Backup, ReshardOperation]:
    """The org's own backup ``key`` and the operation that made it, or a clear refusal."""
    if not key.startswith(KEY_PREFIX):
        raise ServiceError(
            400, f"backup_key: must be a key under {KEY_PREFIX} (GET /warehouses/<org>/backups)"
        )
    if not wh.data_bucket:
        raise ServiceError(409, "the warehouse has no data bucket: it has no backups")
    try:
        objects, truncated = inventory.warehouse_client(wh).list_objects(
            wh.data_bucket, KEY_PREFIX, limit=inventory.LIST_MAX_OBJECTS
        )
    except S3Error as exc:
        raise ServiceError(
            503, f"cannot list the backups in s3://{wh.data_bucket}/{KEY_PREFIX}: {exc}"
        ) from None
    listing = inventory.belonging(wh, objects, truncated, dt.datetime.now(dt.UTC))
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


@dataclass(frozen=True)
class RestoreFields:
    """The backup a restore operation restores, as the start recorded it."""

    key: str
    fingerprint: dict[str, Any] | None
    bucket: str = ""
    etag: str = ""
    # The identity the backup's operation recorded (docs/backup.md "Authenticated backups").
    sha256: str = ""
    size: int = 0
    version_id: str = ""


@dataclass
class RestoreStart:
    """One restore start's rows and what they established (a fresh object per walk)."""

    key: str
    in_place_database: str = ""
    found: inventory.Backup | None = None
    made_by: ReshardOperation | None = None
    bucket: str = ""
    checks: tuple[Check, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.checks = (
            Check("restore_target", self._target),
            Check("restore_backup", self._backup),
        )

    def _target(self, pf: Preflight) -> str:
        target, wh = pf.request.target, pf.warehouse
        if target.type != StoreKind.CNPG:
            raise ServiceError(
                400, "target.type: a restore's target is a cnpg metadata store (type cnpg)"
            )
        if wh.metadata_store_kind == StoreKind.CNPG and target.cnpg_shard == wh.metadata_store_id:
            self.in_place_database = sibling_database(wh.metadata_store_database)
            pf.request = dataclasses.replace(pf.request, in_place_database=self.in_place_database)
            return (
                f"in place on store {target.cnpg_shard}: into the new database "
                f"{self.in_place_database}"
            )
        return f"onto cnpg store {target.cnpg_shard}"

    def _backup(self, pf: Preflight) -> str:
        self.bucket = pf.warehouse.data_bucket
        self.found, self.made_by = resolve_backup(pf.warehouse, self.key)
        tested = "its restore test passed" if self.found.verified else "not restore-tested yet"
        return (
            f"s3://{self.bucket}/{self.key}: {self.found.size} bytes, recorded by operation "
            f"{self.made_by.id}; {tested}"
        )

    def fields(self) -> RestoreFields:
        """The restore's row fields (only after ``restore_backup`` passed)."""
        assert self.found is not None
        assert self.made_by is not None
        fingerprint = self.made_by.catalog_fingerprint
        return RestoreFields(
            self.key,
            fingerprint if isinstance(fingerprint, dict) else None,
            bucket=self.bucket,
            etag=self.found.etag,
            sha256=self.found.sha256,
            size=self.found.size,
            version_id=self.found.version_id,
        )

    def shape(self, plan: Plan) -> None:
        """The checked start becomes a restore of that backup (the rest of the row is the
        reshard's)."""
        restore = self.fields()
        plan.fields.update(
            copy_mode="offline",
            copy_mode_reason="offline (a restore streams a backup: it has no online mode)",
            backup_after_unblock=False,
            kind=OpKind.RESTORE,
            restore_backup_key=restore.key,
            restore_backup_bucket=restore.bucket,
            restore_backup_etag=restore.etag,
            restore_backup_sha256=restore.sha256,
            restore_backup_size=restore.size,
            restore_backup_version_id=restore.version_id,
            restore_fingerprint=restore.fingerprint,
        )
        plan.description = f"restore of {restore.key} ({plan.description})"

    def dry_run_section(self, cnpg_shard: str) -> dict[str, Any]:
        """The dry run's ``restore`` block: the backup's facts (``None`` where the backup could
        not be resolved: its row says why)."""
        found, made_by = self.found, self.made_by
        tested = (
            BackupVerification.objects.filter(bucket=self.bucket, key=self.key).first()
            if found is not None
            else None
        )
        fingerprint = self.fields().fingerprint if found is not None else None
        return {
            "backup_key": self.key,
            "uri": f"s3://{self.bucket}/{self.key}" if found is not None else None,
            "size": found.size if found is not None else None,
            "made_by_op": made_by.id if made_by is not None else None,
            "restore_test": (
                None
                if tested is None
                else {"passed": tested.result == VerificationResult.PASSED, "detail": tested.detail}
            ),
            "verification": _verification(made_by, fingerprint),
            "in_place": bool(self.in_place_database),
            "replaces": _replaces(cnpg_shard, self.in_place_database),
        }


def _verification(made_by: ReshardOperation | None, fingerprint: dict[str, Any] | None) -> str:
    if made_by is None:
        return "the backup was not resolved (see the restore_backup check)"
    if fingerprint:
        return (
            "the restored DuckLake state is compared with the fingerprint operation "
            f"{made_by.id} recorded (snapshot {fingerprint.get('snapshot_id')}, "
            f"{fingerprint.get('data_files')} data files)"
        )
    return (
        f"operation {made_by.id} recorded no DuckLake fingerprint: only the presence "
        "of the DuckLake tables is verified"
    )


def _replaces(cnpg_shard: str, in_place_database: str) -> str:
    if in_place_database:
        return (
            f"in place on store {cnpg_shard}: the backup is restored into the "
            f"new database {in_place_database} while the tenant role stays fenced; "
            "the current catalog is backed up (mandatory), the binding moves to the new "
            "database, the current one is dropped, then the tenant role logs in again"
        )
    return (
        "the current catalog is backed up (mandatory), the restored one takes its "
        "place, and the current one is dropped after the binding moved"
    )
