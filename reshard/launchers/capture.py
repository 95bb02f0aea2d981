"""Runner log capture (spec reshard §1 inv. 13, §4.15): a runner's log reaches the op log first.

Before a runner object is deleted — an exited runner replaced by the launch task or the janitor,
a wedged one, or one reaped after its operation finished — its log is copied into the op log,
unless it is durable there already. Every launcher implements ``Launcher.capture_log`` with
:func:`capture_log` over its own ``read_log``; the launch task and the janitor only call it.
"""

from __future__ import annotations

from collections.abc import Callable

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import ReshardLogEntry
from duckgres_admin.platform.names import runner_name
from reshard.launchers.base import RunnerStatus
from reshard.operation import oplog

CAPTURE_LIMIT_BYTES = 5 * 1024 * 1024
CAPTURE_HEADER = "==== runner pod log (captured before deletion) ===="


def marker_present(op_id: int, uid: str) -> bool:
    """The runner's own exit marker for this runner uid is in the op log (its log is durable)."""
    if not uid:
        return False
    return ReshardLogEntry.objects.filter(
        operation_id=op_id,
        message__startswith="runner log persisted: pod ",
        message__contains=f" uid {uid} epoch ",
    ).exists()


def _capture_tag(op_id: int, uid: str) -> str:
    return f"captured from runner pod {runner_name(op_id)} uid {uid or 'unknown'}:"


def already_captured(op_id: int, uid: str) -> bool:
    if not uid:
        return False
    return ReshardLogEntry.objects.filter(
        operation_id=op_id, source="pod-log", message__startswith=_capture_tag(op_id, uid)
    ).exists()


def capture_log(op_id: int, status: RunnerStatus, read_log: Callable[[int, int], str]) -> bool:
    """Copy a runner's log, read by ``read_log``, into the op log unless it is already durable
    there (invariant 13).

    Skipped when the op log holds the runner's own exit marker for this runner uid, or an
    earlier capture of the same uid. The captured block starts with ``CAPTURE_HEADER`` and is
    written with source ``pod-log``; a read failure becomes a warn line and returns False (the
    caller goes on: a capture failure never blocks a reap).
    """
    if marker_present(op_id, status.uid) or already_captured(op_id, status.uid):
        return True
    try:
        text = read_log(op_id, CAPTURE_LIMIT_BYTES)
    except Exception as exc:  # noqa: BLE001 - a capture failure never blocks the reap
        oplog.append(
            op_id,
            f"capturing the log of runner {runner_name(op_id)} failed: {exc}",
            level="warn",
            source="janitor",
        )
        return False
    lines = text.replace("\x00", "").splitlines()
    scrubber = process_scrubber()
    oplog.append(op_id, CAPTURE_HEADER, source="pod-log")
    oplog.append(
        op_id,
        f"{_capture_tag(op_id, status.uid)} {len(lines)} lines "
        f"(last {CAPTURE_LIMIT_BYTES // (1024 * 1024)} MiB at most)",
        source="pod-log",
    )
    ReshardLogEntry.objects.bulk_create(
        [
            ReshardLogEntry(
                operation_id=op_id, level="info", message=scrubber.scrub(line), source="pod-log"
            )
            for line in lines
        ],
        batch_size=1000,
    )
    return True
