"""The pre-flip catalog backups a warehouse has, and their retention (docs/backup.md).

Listing (:func:`backups_for_org`, the API's ``GET /warehouses/<org>/backups``): the objects
under the reserved prefix ``_reshard_catalog_backups/`` of the warehouse's ``data_bucket``
that belong to **this** warehouse. A key belongs to it only when it is exactly
``op-<id>-<yyyymmddThhmmssZ>.dump``, ``<id>`` is a reshard operation **of this org**, and the
key's time stamp lies within that operation's life (created - 10 min … finished + 10 min): an
object of another org's operation, of an id this installation does not know, or of another
installation sharing the bucket (same id, another life) is never listed, only counted in
``ignored_objects``.

**Only recorded objects are backups** (docs/backup.md "Authenticated backups"; safeguard
reshard-109). The bucket is the tenant's: it can overwrite an object or plant keys. An object
is listed only when its operation recorded exactly it when the runner wrote it — its URI, a
SHA-256, and the size and ETag the listing still shows. Any other key of this org's
operations (a planted one, a killed attempt's complete object) is counted in
``unrecorded_objects``; a recorded key whose size or ETag changed since is never listed, and
``changed_objects`` names it with what differs. So the restore start, the restore test and
retention, which all read this listing, never see such an object, and the readers check the
digest again while they stream (``reshard.engines.restore.stream``).

The S3 listing is bounded (:data:`LIST_MAX_OBJECTS` objects per bucket);
a listing that stops there says so (``truncated``). ``verified`` is the latest restore test's
result for the object (``true`` passed, ``false`` failed, ``null`` never tested;
``reshard.backups.restore_test``).

Retention (:func:`plan`, :func:`apply_retention`): an object is deleted only when it is **not**
among the newest ``keep_last`` of its warehouse (by ``LastModified``), **and** older than
``min_age_days``, **and** its operation is terminal; a truncated listing deletes nothing of
that warehouse (the newest N are unknown). Off by default (``DUCKGRES_BACKUP_RETENTION_ENABLED``
false): the plan is still shown. A run takes the advisory lock ``BACKUP_RETENTION_LOCK_KEY``
(``duckgres_admin.platform.lockkeys``) and checks it is still held before every deletion, so two
runs
never delete concurrently; it deletes at most :data:`MAX_DELETES_PER_RUN` objects and logs every
deletion (process log and the operation's op log).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Q

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.times import rfc3339
from duckgres_admin.lib.s3 import S3, ListedObject, S3Error, plain_etag
from duckgres_admin.models import (
    BackupVerification,
    ReshardOperation,
    VerificationResult,
    Warehouse,
)
from duckgres_admin.models.reshard import ACTIVE_STATES
from duckgres_admin.platform.lockkeys import BACKUP_RETENTION_LOCK_KEY
from reshard.backups.retention import ENABLED_VAR, RetentionPolicy
from reshard.engines.backup import KEY_PREFIX
from reshard.operation import oplog

_log = logging.getLogger("duckgres.reshard.backups")

LIST_MAX_OBJECTS = 5000  # objects read per bucket listing (a hard cap)
MAX_DELETES_PER_RUN = 100
MAX_WAREHOUSES_PER_RUN = 1000
SESSION_NAME = "duckgres-backup-listing"
STAMP_SLACK = dt.timedelta(minutes=10)
VERIFIED_NOTE = (
    "verified: true when the latest restore test restored the object and its DuckLake state "
    "matched what its operation recorded, false when that test failed, null when none has run"
)
_KEY = re.compile(r"^op-([1-9]\d{0,17})-(\d{8}T\d{6}Z)\.dump$")


def retention_policy() -> RetentionPolicy:
    """The policy the settings parsed at start (``DUCKGRES_BACKUP_RETENTION``)."""
    policy: RetentionPolicy = settings.DUCKGRES_BACKUP_RETENTION
    return policy


@dataclass
class Backup:
    key: str
    size: int
    last_modified: dt.datetime
    op_id: int
    op_state: str
    recorded: bool  # always True for a listed backup (only recorded objects are listed)
    etag: str = ""  # as listed: a restore reads exactly this object (IfMatch)
    sha256: str = ""  # recorded by its operation when it wrote the object
    version_id: str = ""  # recorded VersionId ('' in an unversioned bucket)
    verified: bool | None = None  # the latest restore test (None: never tested)
    verified_at: dt.datetime | None = None
    verification_detail: str = ""
    action: str = ""  # retention: keep | delete ("" when no plan was asked)
    reason: str = ""


@dataclass
class Listing:
    org_id: str
    bucket: str
    backups: list[Backup]  # newest first
    listed_objects: int
    ignored_objects: int
    truncated: bool
    limit: int
    unrecorded_objects: int = 0
    changed: list[tuple[str, str]] = field(default_factory=list)  # (key, what differs)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def warehouse_client(wh: Warehouse) -> S3:
    return S3(region=wh.data_region, role_arn=wh.data_role_arn, session_name=SESSION_NAME)


def _stamp(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)


def belonging(
    wh: Warehouse, objects: list[ListedObject], truncated: bool, now: dt.datetime
) -> Listing:
    """The objects of a bucket listing that are this warehouse's backups (module doc)."""
    parsed: list[tuple[int, dt.datetime, ListedObject]] = []
    ignored = 0
    for obj in objects:
        name = obj.key.removeprefix(KEY_PREFIX)
        match = _KEY.match(name) if name != obj.key else None
        if match is None:
            ignored += 1
            continue
        try:
            stamp = _stamp(match.group(2))
        except ValueError:
            ignored += 1
            continue
        parsed.append((int(match.group(1)), stamp, obj))
    ops = {
        op.id: op
        for op in ReshardOperation.objects.filter(
            org_id=wh.org_id, id__in={op_id for op_id, _, _ in parsed}
        ).only(
            "id", "state", "created_at", "finished_at", "backup_s3_uri", "backup_bytes",
            "backup_sha256", "backup_etag", "backup_version_id",
        )
    }  # fmt: skip
    backups: list[Backup] = []
    unrecorded = 0
    changed: list[tuple[str, str]] = []
    for op_id, stamp, obj in parsed:
        op = ops.get(op_id)
        if op is None:
            ignored += 1  # another org's operation, or an id this installation does not know
            continue
        end = op.finished_at or now
        if not (op.created_at - STAMP_SLACK <= stamp <= end + STAMP_SLACK):
            ignored += 1  # same id, another life: not this operation's backup
            continue
        if op.backup_s3_uri != f"s3://{wh.data_bucket}/{obj.key}" or not op.backup_sha256:
            unrecorded += 1  # planted, or an attempt its operation did not record
            continue
        difference = _changed(op, obj)
        if difference:
            changed.append((obj.key, difference))
            continue
        backups.append(
            Backup(
                key=obj.key,
                size=obj.size,
                last_modified=obj.last_modified,
                op_id=op_id,
                op_state=op.state,
                recorded=True,
                etag=obj.etag,
                sha256=op.backup_sha256,
                version_id=op.backup_version_id,
            )
        )
    tests = {
        v.key: v
        for v in BackupVerification.objects.filter(
            bucket=wh.data_bucket, key__in=[b.key for b in backups]
        ).only("key", "result", "checked_at", "detail")
    }
    for b in backups:
        test = tests.get(b.key)
        if test is not None:
            b.verified = test.result == VerificationResult.PASSED
            b.verified_at, b.verification_detail = test.checked_at, test.detail
    # Newest first; S3 times have one-second resolution, so a tie goes to the later operation.
    backups.sort(key=lambda b: (b.last_modified, b.op_id, b.key), reverse=True)
    return Listing(
        wh.org_id, wh.data_bucket, backups, len(objects), ignored, truncated, LIST_MAX_OBJECTS,
        unrecorded, changed,
    )  # fmt: skip


def _changed(op: ReshardOperation, obj: ListedObject) -> str:
    """'' when the listed object still is what its operation recorded; else what differs."""
    if obj.size != op.backup_bytes:
        return (
            f"size {obj.size} differs from the {op.backup_bytes} bytes operation {op.id} wrote: "
            "the object was replaced since"
        )
    if op.backup_etag and plain_etag(obj.etag) != op.backup_etag:
        return (
            f"ETag {plain_etag(obj.etag)} differs from the {op.backup_etag} operation {op.id} "
            "recorded: the object was replaced since"
        )
    return ""


def plan(listing: Listing, policy: RetentionPolicy, now: dt.datetime) -> list[Backup]:
    """Mark every backup keep/delete with its reason; returns the ones to delete."""
    min_age = dt.timedelta(days=policy.min_age_days)
    deletes: list[Backup] = []
    for index, b in enumerate(listing.backups):  # newest first
        age = now - b.last_modified
        days = f"{age.total_seconds() / 86400:.1f} days old"
        if listing.truncated:
            b.action, b.reason = (
                "keep",
                (
                    f"the listing stopped at {listing.limit} objects: retention needs the complete "
                    "listing of the warehouse's backups, nothing of it is deleted"
                ),
            )
        elif index < policy.keep_last:
            b.action, b.reason = "keep", f"among the newest {policy.keep_last} ({days})"
        elif b.op_state in ACTIVE_STATES:
            b.action, b.reason = "keep", f"operation {b.op_id} is still {b.op_state}"
        elif age < min_age:
            b.action, b.reason = "keep", f"younger than {policy.min_age_days} days ({days})"
        else:
            b.action, b.reason = (
                "delete",
                (
                    f"not among the newest {policy.keep_last}, older than {policy.min_age_days} "
                    f"days ({days}), operation {b.op_id} {b.op_state}"
                ),
            )
            deletes.append(b)
    return deletes


def _iso(moment: dt.datetime) -> str:
    return rfc3339(moment.astimezone(dt.UTC))


def _s3_refusal(what: str, exc: S3Error) -> ServiceError:
    if exc.code:
        return ServiceError(502, f"{what}: {exc}", code="backup_listing_failed")
    return ServiceError(503, f"{what}: {exc}", code="backup_storage_unavailable")


def backups_for_org(
    org_id: str, *, with_plan: bool, now: dt.datetime | None = None, s3: S3 | None = None
) -> dict[str, Any]:
    """The API's answer (docs/api.md "Backups")."""
    now = now or _now()
    wh = Warehouse.objects.filter(org_id=org_id).first()
    if wh is None:
        raise ServiceError(404, "org has no managed warehouse")
    policy = retention_policy() if with_plan else None
    if not wh.data_bucket:
        listing = Listing(org_id, "", [], 0, 0, False, LIST_MAX_OBJECTS)
    else:
        where = f"cannot list the backups in s3://{wh.data_bucket}/{KEY_PREFIX}"
        try:
            client = s3 or warehouse_client(wh)
            objects, truncated = client.list_objects(
                wh.data_bucket, KEY_PREFIX, limit=LIST_MAX_OBJECTS
            )
        except S3Error as exc:
            raise _s3_refusal(where, exc) from None
        listing = belonging(wh, objects, truncated, now)
    body: dict[str, Any] = {
        "org_id": org_id,
        "bucket": listing.bucket or None,
        "prefix": KEY_PREFIX,
        "backups": [],
        "listed_objects": listing.listed_objects,
        "ignored_objects": listing.ignored_objects,
        "unrecorded_objects": listing.unrecorded_objects,
        "changed_objects": [{"key": key, "reason": why} for key, why in listing.changed],
        "truncated": listing.truncated,
        "max_listed_objects": listing.limit,
        "verified_note": VERIFIED_NOTE,
    }
    if policy is not None:
        deletes = plan(listing, policy, now)
        body["retention"] = {
            "enabled": policy.enabled,
            "keep_last": policy.keep_last,
            "min_age_days": policy.min_age_days,
            "deletes": len(deletes),
            "note": (
                "the task deletes the keys marked delete at its next run"
                if policy.enabled
                else f"retention is disabled ({ENABLED_VAR}=false): nothing is deleted; the "
                "keys marked delete are what it would delete"
            ),
        }
    for b in listing.backups:
        entry: dict[str, Any] = {
            "key": b.key,
            "uri": f"s3://{listing.bucket}/{b.key}",
            "size": b.size,
            "last_modified": _iso(b.last_modified),
            "op_id": b.op_id,
            "op_state": b.op_state,
            "recorded": b.recorded,
            "sha256": b.sha256,
            "version_id": b.version_id or None,
            "verified": b.verified,
            "verified_at": _iso(b.verified_at) if b.verified_at else None,
            "verification_detail": b.verification_detail,
        }
        if policy is not None:
            entry["retention"] = {"action": b.action, "reason": b.reason}
        body["backups"].append(entry)
    return body


# --- the retention run --------------------------------------------------------------------------


@dataclass
class RetentionReport:
    enabled: bool = False
    ran: bool = False  # False: disabled, or another run holds the lock
    warehouses: int = 0
    deleted: list[str] = field(default_factory=list)
    kept_truncated: list[str] = field(default_factory=list)  # orgs whose listing was truncated
    errors: list[str] = field(default_factory=list)
    bounded: bool = False  # stopped at MAX_DELETES_PER_RUN / MAX_WAREHOUSES_PER_RUN / lock lost


def _lock_parts(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


@contextlib.contextmanager
def run_lock(key: int = BACKUP_RETENTION_LOCK_KEY) -> Iterator[bool]:
    """A run's session-level advisory lock on the config store: ``True`` when taken."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        row = cursor.fetchone()
    taken = bool(row and row[0])
    try:
        yield taken
    finally:
        if taken:
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def lock_held(key: int = BACKUP_RETENTION_LOCK_KEY) -> bool:
    """This session still holds the run's lock (a lost connection does not)."""
    classid, objid = _lock_parts(key)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid() AND classid = %s AND objid = %s AND objsubid = 1)",
                [classid, objid],
            )
            row = cursor.fetchone()
    except DatabaseError:
        return False
    return bool(row and row[0])


def apply_retention(
    *,
    now: dt.datetime | None = None,
    client_for: Callable[[Warehouse], S3] | None = None,
) -> RetentionReport:
    """One bounded, fleet-wide retention run (module doc). Never raises for S3 problems."""
    policy = retention_policy()
    report = RetentionReport(enabled=policy.enabled)
    if not policy.enabled:
        return report
    now = now or _now()
    make_client = client_for or warehouse_client
    with run_lock() as taken:
        if not taken:
            _log.info("backup retention: another run holds the lock; this run does nothing")
            return report
        report.ran = True
        warehouses = list(
            Warehouse.objects.exclude(Q(data_bucket="") | Q(data_bucket__isnull=True)).order_by(
                "org_id"
            )[: MAX_WAREHOUSES_PER_RUN + 1]
        )
        if len(warehouses) > MAX_WAREHOUSES_PER_RUN:
            warehouses, report.bounded = warehouses[:MAX_WAREHOUSES_PER_RUN], True
        listings: dict[tuple[str, str, str], tuple[S3, list[ListedObject], bool]] = {}
        for wh in warehouses:
            report.warehouses += 1
            source = (wh.data_bucket, wh.data_region, wh.data_role_arn)
            try:
                if source not in listings:
                    client = make_client(wh)
                    objects, truncated = client.list_objects(
                        wh.data_bucket, KEY_PREFIX, limit=LIST_MAX_OBJECTS
                    )
                    listings[source] = (client, objects, truncated)
            except S3Error as exc:
                report.errors.append(f"{wh.org_id}: s3://{wh.data_bucket}/{KEY_PREFIX}: {exc}")
                _log.warning(
                    "backup retention: cannot list s3://%s/%s for org %s: %s",
                    wh.data_bucket,
                    KEY_PREFIX,
                    wh.org_id,
                    exc,
                )
                continue
            client, objects, truncated = listings[source]
            listing = belonging(wh, objects, truncated, now)
            if truncated:
                report.kept_truncated.append(wh.org_id)
            for b in plan(listing, policy, now):
                if len(report.deleted) >= MAX_DELETES_PER_RUN or not lock_held():
                    report.bounded = True
                    return report
                op = ReshardOperation.objects.filter(pk=b.op_id, org_id=wh.org_id).first()
                if op is None or op.state in ACTIVE_STATES:
                    continue
                uri = f"s3://{wh.data_bucket}/{b.key}"
                try:
                    client.delete_object(wh.data_bucket, b.key)
                except S3Error as exc:
                    report.errors.append(f"{uri}: {exc}")
                    _log.warning("backup retention: cannot delete %s: %s", uri, exc)
                    continue
                report.deleted.append(uri)
                message = (
                    f"backup retention: deleted {uri} ({b.size} bytes, last modified "
                    f"{b.last_modified.isoformat()}): {b.reason}"
                )
                _log.info(message, extra={"op_id": b.op_id})
                with contextlib.suppress(DatabaseError):
                    oplog.append(b.op_id, message, level="info", source="janitor")
    return report
