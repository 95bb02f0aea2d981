"""Open multipart uploads of catalog backups never outlive their operation (spec reshard §4.10).

A backup is one multipart upload under ``_reshard_catalog_backups/op-<id>-<ts>.dump``. A runner
killed mid-backup leaves its upload open; S3 bills the parts and no listing of objects shows
them. Two mechanisms close them:

1. **Every terminal path aborts the operation's uploads** (:func:`abort_for_op`): the runner's
   finalize (success, including a roll-forward) and rollback (failure, cancel), the janitor's
   force-fail, and ``reshard_recover --execute``. It lists the uploads under the op's own prefix
   ``op-<id>-`` (the dash makes ``op-1-`` never match ``op-12-``), aborts each (an upload already
   gone counts as aborted) and writes one op-log line saying what it aborted, or that there was
   nothing. It runs only for an op that reached ``backup_catalog`` (no upload exists before that
   step is stamped), never raises, and an S3 failure is a warning naming the sweep as the next
   line of defence.
2. **A periodic sweep** (:func:`sweep`, run by the leader janitor at most once per
   ``DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS``) lists the reserved prefix of every data bucket the
   warehouses name and aborts an upload only when its key parses as ``op-<id>-…`` **and** that
   operation exists and is terminal. An upload of an active op is left to its runner; one whose
   id names no operation here (another installation sharing the bucket) is never touched. It is
   bounded (``SWEEP_MAX_BUCKETS`` buckets, ``SWEEP_MAX_LISTED`` uploads read per bucket,
   ``SWEEP_MAX_ABORTS`` aborts per sweep), checks the
   caller's leadership before every abort, and logs every abort to the process log and to the
   op's log.

The bucket's ``AbortIncompleteMultipartUpload`` lifecycle rule stays the backstop for what
neither reaches (no ``s3:ListBucketMultipartUploads`` permission, S3 down for days).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import DatabaseError
from django.db.models import Q

from duckgres_admin.lib.s3 import S3, S3Error, session_name_for_op
from duckgres_admin.models import ReshardOperation, Warehouse
from duckgres_admin.models.reshard import ACTIVE_STATES
from reshard.engines.backup import KEY_PREFIX
from reshard.operation import oplog, sequences

_log = logging.getLogger("duckgres.reshard.uploads")

SWEEP_MAX_BUCKETS = 50
SWEEP_MAX_ABORTS = 200
SWEEP_MAX_LISTED = 1000  # uploads read per bucket per sweep
SWEEP_SESSION_NAME = "duckgres-reshard-upload-sweep"
_KEY = re.compile(r"^op-(\d+)-")

Log = Callable[[str, str], None]  # (level, message): the caller's op-log sink


def op_prefix(op_id: int) -> str:
    return f"{KEY_PREFIX}op-{op_id}-"


def reached_backup(op: ReshardOperation) -> bool:
    """True when the op's stamped step is ``backup_catalog`` or later (an upload may exist)."""
    return sequences.at_or_past(op.step or "", "backup_catalog", op.target_kind, op.copy_variant)


def _client(wh: Warehouse, session_name: str) -> S3:
    return S3(region=wh.data_region, role_arn=wh.data_role_arn, session_name=session_name)


def abort_for_op(op: ReshardOperation, log: Log, *, s3: S3 | None = None) -> int | None:
    """Abort every open upload under the op's prefix; the number aborted, ``None`` when it could
    not look (logged as a warning). Nothing is logged for an op that never reached the backup."""
    if not reached_backup(op):
        return 0
    try:
        wh = Warehouse.objects.filter(org_id=op.org_id).first()
    except DatabaseError as exc:
        log("warn", f"could not read the warehouse to abort this operation's backup uploads: {exc}")
        return None
    if wh is None or not wh.data_bucket:
        return 0
    where = f"s3://{wh.data_bucket}/{op_prefix(op.id)}"
    try:
        client = s3 or _client(wh, session_name_for_op(op.id))
        keys: list[str] = []
        for key, upload_id in client.list_multipart_uploads(wh.data_bucket, op_prefix(op.id)):
            client.abort_multipart_upload(wh.data_bucket, key, upload_id)
            keys.append(key)
    except S3Error as exc:
        log(
            "warn",
            f"could not abort this operation's open backup uploads under {where}: {exc} — the "
            "janitor's upload sweep retries; the bucket's AbortIncompleteMultipartUpload "
            "lifecycle rule is the backstop",
        )
        return None
    if keys:
        names = ", ".join(key.removeprefix(KEY_PREFIX) for key in keys)
        log("info", f"aborted {len(keys)} open backup upload(s) under {where}: {names}")
    else:
        log("info", f"no open backup upload left under {where}")
    return len(keys)


@dataclass
class SweepReport:
    buckets: int = 0
    aborted: list[str] = field(default_factory=list)
    left_active: int = 0
    left_foreign: int = 0
    errors: list[str] = field(default_factory=list)
    truncated: bool = False


def _terminal_ops(op_ids: set[int]) -> tuple[set[int], set[int]]:
    """(terminal, active) among ``op_ids``; ids that name no operation are in neither."""
    rows = ReshardOperation.objects.filter(id__in=op_ids).values_list("id", "state")
    terminal = {op_id for op_id, state in rows if state not in ACTIVE_STATES}
    active = {op_id for op_id, state in rows if state in ACTIVE_STATES}
    return terminal, active


def sweep(may_act: Callable[[], bool]) -> SweepReport:
    """One bounded pass over the reserved prefix of every data bucket (see the module doc).
    ``may_act()`` is asked before every abort; ``False`` ends the pass at once."""
    report = SweepReport()
    targets = (
        Warehouse.objects.exclude(Q(data_bucket="") | Q(data_bucket__isnull=True))
        .values_list("data_bucket", "data_region", "data_role_arn")
        .distinct()
        .order_by("data_bucket", "data_region", "data_role_arn")
    )
    seen: set[str] = set()
    for bucket, region, role_arn in targets[: SWEEP_MAX_BUCKETS + 1]:
        if report.buckets == SWEEP_MAX_BUCKETS:
            report.truncated = True
            break
        if bucket in seen:
            continue  # one listing per bucket, whichever role reaches it first
        seen.add(bucket)
        report.buckets += 1
        try:
            client = S3(region=region, role_arn=role_arn, session_name=SWEEP_SESSION_NAME)
            uploads = client.list_multipart_uploads(bucket, KEY_PREFIX, limit=SWEEP_MAX_LISTED)
        except S3Error as exc:
            report.errors.append(f"s3://{bucket}/{KEY_PREFIX}: {exc}")
            _log.warning("upload sweep: cannot list s3://%s/%s: %s", bucket, KEY_PREFIX, exc)
            continue
        parsed: list[tuple[int, str, str]] = []
        for key, upload_id in uploads:
            match = _KEY.match(key.removeprefix(KEY_PREFIX))
            if match is None:
                report.left_foreign += 1
                continue
            parsed.append((int(match.group(1)), key, upload_id))
        terminal, active = _terminal_ops({op_id for op_id, _, _ in parsed})
        for op_id, key, upload_id in parsed:
            if op_id in active:
                report.left_active += 1
                continue
            if op_id not in terminal:
                report.left_foreign += 1
                continue
            if len(report.aborted) >= SWEEP_MAX_ABORTS:
                report.truncated = True
                return report
            if not may_act():
                report.truncated = True
                return report
            try:
                client.abort_multipart_upload(bucket, key, upload_id)
            except S3Error as exc:
                report.errors.append(f"s3://{bucket}/{key}: {exc}")
                _log.warning("upload sweep: cannot abort s3://%s/%s: %s", bucket, key, exc)
                continue
            report.aborted.append(f"s3://{bucket}/{key}")
            message = (
                f"upload sweep: aborted an open backup upload a lost process left: "
                f"s3://{bucket}/{key}"
            )
            _log.info(message, extra={"op_id": op_id})
            oplog.append(op_id, message, level="info", source="janitor")
    return report
