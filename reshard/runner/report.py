"""The end-of-op report written to the op log (spec reshard §4.12).

Written after rollback and before the terminal write (failure, cancel), or after finalize
(success). Times come from the row and the database clock.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from duckgres_admin.models import ReshardOperation, ReshardStepTiming
from reshard.runner.env import StepEnv


def describe_source(op: ReshardOperation) -> str:
    if op.source_kind == "cnpg":
        return f"cnpg {op.from_shard}"
    return f"external {op.source_endpoint}:{op.source_port}"


def describe_target(op: ReshardOperation) -> str:
    if op.target_kind == "cnpg":
        return f"cnpg {op.to_shard}"
    return f"external {op.target_endpoint}:{op.target_port}"


def format_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def report_lines(op: ReshardOperation, state: str, *, open_outcome: str) -> list[str]:
    now = _db_now()
    lines = [
        f"==== reshard report ({state}) ====",
        f"org {op.org_id}: {describe_source(op)} → {describe_target(op)}",
    ]
    # The mode when it is online, or when online was asked and the stores refused it (why).
    if op.copy_mode == "online" or "online" in op.copy_mode_reason:
        lines.append(f"copy mode: {op.copy_mode_reason or op.copy_mode}")
    if op.source_kept_reason:
        lines.append(f"source kept, not dropped: {op.source_kept_reason}")
    if op.started_at:
        lines.append(f"started {op.started_at.isoformat()}")
    if op.blocked_at:
        end = op.unblocked_at or now
        lines.append(
            "maintenance mode (connections blocked): "
            f"{format_duration((end - op.blocked_at).total_seconds())} "
            f"(from {op.blocked_at.isoformat()} to "
            f"{op.unblocked_at.isoformat() if op.unblocked_at else 'now (still blocked)'})"
        )
    else:
        lines.append("maintenance mode: never entered")
    for row in ReshardStepTiming.objects.filter(operation_id=op.id).order_by("id"):
        end = row.ended_at or now
        outcome = row.outcome or open_outcome
        lines.append(
            f"step {row.step}: {format_duration((end - row.started_at).total_seconds())} "
            f"({outcome}, epoch {row.runner_epoch})"
        )
    if op.tables_copied > 0 or state == "succeeded":
        lines.append(
            f"copied: {op.tables_copied} tables, {op.rows_copied} rows, {op.bytes_copied} bytes"
        )
    if op.backup_s3_uri:
        lines.append(f"pre-flip catalog backup: {op.backup_s3_uri}")
    if op.source_kind == "external":
        lines.append("external source: left untouched")
    if op.cancel_requested and state == "succeeded":
        lines.append("cancel requested: after the point of no return")
    if op.created_at:
        lines.append(f"total runtime: {format_duration((now - op.created_at).total_seconds())}")
    return lines


def write_report(env: StepEnv, state: str) -> None:
    """Re-read the row and append the report lines to the op log."""
    op = ReshardOperation.objects.get(id=env.op.id)
    open_outcome = {"succeeded": "ok", "cancelled": "cancelled"}.get(state, "failed")
    for line in report_lines(op, state, open_outcome=open_outcome):
        env.log.info(line)
