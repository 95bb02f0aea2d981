"""Live progress of an operation for the admin detail page (spec reshard §2.5, §2.8).

Progress comes only from the op's ``progress`` JSON (written by the runner at most every 2 s),
never from the success-only ``*_copied`` columns. The ETA is derived from the progress rate:
``tables_done`` over the time since the current ``copying`` step started (its step-timing row),
extrapolated to ``tables_total``. A backup has no known total, so it shows a throughput only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from duckgres_admin.base.times import rfc3339
from duckgres_admin.models import TERMINAL_STATES, ReshardOperation, ReshardStepTiming
from duckgres_admin.platform.names import MILESTONES
from reshard.kinds import kind_of

PROGRESS_KEYS = (
    "bytes_dumped",
    "backup_parts",
    "tables_done",
    "tables_total",
    "rows_copied",
    "bytes_copied",
)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.year in (1, 9999):  # -infinity / infinity as loaded by pgtypes
        return None
    return rfc3339(value)


def display_ts(value: datetime | None) -> str:
    if value is None:
        return "—"
    if value.year == 1:
        return "-infinity"
    if value.year == 9999:
        return "infinity"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def summary_rows(op: ReshardOperation) -> list[tuple[str, str]]:
    """The operation table of the detail page (re-sent by the status JSON). References only:
    the op has no password column."""
    source = (
        f"cnpg {op.from_shard}"
        if op.source_kind == "cnpg"
        else f"external {op.source_endpoint}:{op.source_port}"
    )
    target = (
        f"cnpg {op.to_shard}"
        if op.target_kind == "cnpg"
        else f"external {op.target_endpoint}:{op.target_port}"
    )
    rows = [
        ("org", op.org_id),
        ("kind", kind_of(op).describe(op)),
        ("direction", f"{op.source_kind} → {op.target_kind}"),
        ("cancel cutoff", kind_of(op).cancel_cutoff(op.target_kind).description),
        ("source", source),
        ("source tenant", f"{op.source_user} / {op.source_database}"),
        ("source password reference", op.source_password_secret_ref or "—"),
        ("target", target),
        ("target tenant", f"{op.target_user} / {op.target_database}"),
        ("target password reference", op.target_password_secret_ref or "—"),
        ("created by", op.created_by or "—"),
        ("launcher", op.launcher),
        ("runner", f"{op.runner_id or '—'} (epoch {op.runner_epoch})"),
        ("heartbeat", display_ts(op.heartbeat_at)),
        ("respawn attempts", str(op.respawn_attempts)),
        ("drain timeout", f"{op.drain_timeout_seconds} s"),
        ("created", display_ts(op.created_at)),
        ("started", display_ts(op.started_at)),
        ("finished", display_ts(op.finished_at)),
        ("maintenance window", f"{display_ts(op.blocked_at)} → {display_ts(op.unblocked_at)}"),
        *(
            (name.removesuffix("_at").replace("_", " "), display_ts(getattr(op, name)))
            for name in MILESTONES
        ),
        (
            "copied (on success)",
            f"{op.tables_copied} tables, {op.rows_copied} rows, {op.bytes_copied} bytes",
        ),
        ("backup", f"{op.backup_s3_uri} ({op.backup_bytes} bytes)" if op.backup_s3_uri else "—"),
        (
            "recovery",
            f"required={op.recovery_required} outcome={op.recovery_outcome or '—'} "
            f"owner={op.recovery_owner or '—'}",
        ),
    ]
    return [(label, str(value)) for label, value in rows]


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    return None


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        return None
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, timezone.get_current_timezone())
    return parsed


def _step_start(steps: list[ReshardStepTiming], name: str) -> datetime | None:
    for row in reversed(steps):
        if row.step == name:
            return row.started_at
    return None


def _step_state(steps: list[ReshardStepTiming], name: str) -> str:
    """``''`` (not reached), ``running`` (open row) or the last row's outcome."""
    for row in reversed(steps):
        if row.step == name:
            return row.outcome or "running"
    return ""


def progress_view(
    op: ReshardOperation, steps: list[ReshardStepTiming], now: datetime | None = None
) -> dict[str, Any]:
    """The progress block: the counters, rates and an ETA (seconds from ``now``) when derivable."""
    now = now or timezone.now()
    raw = op.progress if isinstance(op.progress, dict) else {}
    out: dict[str, Any] = {key: _int(raw.get(key)) for key in PROGRESS_KEYS}
    updated = _when(raw.get("updated_at"))
    out["updated_at"] = _iso(updated)
    out["eta_seconds"] = None
    out["eta_basis"] = ""
    out["tables_per_second"] = None
    out["dump_bytes_per_second"] = None
    out["backup_step"] = _step_state(steps, "backup_catalog")
    out["copy_step"] = _step_state(steps, "copying")
    active = op.state not in TERMINAL_STATES
    done, total = out["tables_done"], out["tables_total"]
    copy_start = _step_start(steps, "copying")
    if updated is not None and copy_start is not None and done is not None and total:
        elapsed = (updated - copy_start).total_seconds()
        if done >= total:
            out["eta_seconds"] = 0
            out["eta_basis"] = "all tables copied"
        elif done > 0 and elapsed > 0:
            rate = done / elapsed
            out["tables_per_second"] = round(rate, 3)
            if active:
                remaining = (total - done) / rate - (now - updated).total_seconds()
                out["eta_seconds"] = max(round(remaining), 0)
                out["eta_basis"] = (
                    f"{done}/{total} tables in {int(elapsed)} s since copying started"
                )
    dumped = out["bytes_dumped"]
    backup_start = _step_start(steps, "backup_catalog")
    if updated is not None and backup_start is not None and dumped:
        elapsed = (updated - backup_start).total_seconds()
        if elapsed > 0:
            out["dump_bytes_per_second"] = int(dumped / elapsed)
    return out


def step_json(row: ReshardStepTiming) -> dict[str, Any]:
    return {
        "step": row.step,
        "runner_epoch": row.runner_epoch,
        "started_at": _iso(row.started_at),
        "ended_at": _iso(row.ended_at),
        "outcome": row.outcome,
    }


def status_json(op: ReshardOperation, now: datetime | None = None) -> dict[str, Any]:
    """What the detail page polls: state, progress, step timings and the maintenance window."""
    now = now or timezone.now()
    steps = list(ReshardStepTiming.objects.filter(operation_id=op.id).order_by("started_at", "id"))
    return {
        "id": op.id,
        "org_id": op.org_id,
        "state": op.state,
        "step": op.step,
        "error": op.error,
        "cancel_requested": op.cancel_requested,
        "terminal": op.state in TERMINAL_STATES,
        "runner_epoch": op.runner_epoch,
        "created_at": _iso(op.created_at),
        "started_at": _iso(op.started_at),
        "finished_at": _iso(op.finished_at),
        "heartbeat_at": _iso(op.heartbeat_at),
        "blocked_at": _iso(op.blocked_at),
        "unblocked_at": _iso(op.unblocked_at),
        "now": _iso(now),
        "progress": progress_view(op, steps, now),
        "steps": [step_json(row) for row in steps],
        "recovery_required": op.recovery_required,
        "summary": summary_rows(op),
    }
