"""The events the outbox carries and the two body formats (docs/notifications.md).

An event is built from the operation (or store drain) row once, when its outbox row is written,
from an explicit allowlist of fields: ids, states, kinds, store names (an external store's host,
never a user, database, DSN or secret reference), timestamps and a coarse ``error_code``. The
op's ``error`` text is never copied (it may name a secret reference); read it with ``GET
/api/v1/reshards/<id>``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from duckgres_admin.base.times import rfc3339
from duckgres_admin.models import ReshardOperation, StoreDrain

SCHEMA_VERSION = 1
# The janitor's force-fail message starts so (reshard.control.janitor.force_fail_message).
_RUNNER_LOST_PREFIX = "reshard runner could not be kept alive"


def _ts(value: datetime | None) -> str | None:
    return rfc3339(value) if value is not None else None


def error_code(op: ReshardOperation) -> str | None:
    """``None`` (succeeded), ``cancelled``, ``runner_lost`` (the janitor gave up relaunching),
    ``not_started`` (failed before a runner claimed it) or ``step_failed`` (see ``step``)."""
    if op.state == "succeeded":
        return None
    if op.state == "cancelled":
        return "cancelled"
    if op.error.startswith(_RUNNER_LOST_PREFIX):
        return "runner_lost"
    if op.started_at is None:
        return "not_started"
    return "step_failed"


def _store(kind: str, name: str, host: str) -> dict[str, str]:
    if kind == "cnpg":
        return {"kind": kind, "store": name}
    return {"kind": kind, "host": host}


def reshard_event(op: ReshardOperation) -> dict[str, Any]:
    """The event of a terminal operation (``op.state`` is its terminal state): ``kind``
    ``reshard``, or ``restore`` (with the restored ``backup_key``)."""
    kind = "restore" if op.kind == "restore" else "reshard"
    extra = {"backup_key": op.restore_backup_key} if kind == "restore" else {}
    return {
        "schema": SCHEMA_VERSION,
        "event": f"{kind}.{op.state}",
        "kind": kind,
        **extra,
        "operation_id": op.id,
        "org_id": op.org_id,
        "state": op.state,
        "error_code": error_code(op),
        "step": op.step,
        "direction": op.direction,
        "source": _store(op.source_kind, op.from_shard, op.source_endpoint),
        "target": _store(op.target_kind, op.to_shard, op.target_endpoint),
        "recovery_required": op.recovery_required,
        "created_at": _ts(op.created_at),
        "started_at": _ts(op.started_at),
        "blocked_at": _ts(op.blocked_at),
        "unblocked_at": _ts(op.unblocked_at),
        "finished_at": _ts(op.finished_at),
    }


def drain_event(drain: StoreDrain, progress: dict[str, int]) -> dict[str, Any]:
    """The event of a store drain that ended (``finished`` or ``cancelled``)."""
    return {
        "schema": SCHEMA_VERSION,
        "event": f"drain.{drain.state}",
        "kind": "drain",
        "drain_id": drain.id,
        "store": drain.store_id,
        "target_stores": list(drain.target_stores),
        "state": drain.state,
        "progress": dict(progress),
        "created_at": _ts(drain.created_at),
        "finished_at": _ts(drain.finished_at),
    }


_SLACK_ICON = {"succeeded": ":white_check_mark:", "failed": ":x:", "cancelled": ":no_entry_sign:"}


def _where(end: dict[str, Any]) -> str:
    return f"{end.get('kind')} {end.get('store') or end.get('host') or '?'}"


def _drain_text(event: dict[str, Any]) -> str:
    counts = event.get("progress") or {}
    done = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    return (
        f":card_file_box: drain {event.get('drain_id')} of store `{event.get('store')}` "
        f"*{event.get('state')}*: {done or 'nothing to move'}, finished "
        f"{event.get('finished_at') or '?'}"
    )


def slack_text(event: dict[str, Any]) -> str:
    if event.get("kind") == "drain":
        return _drain_text(event)
    state = str(event.get("state"))
    line = (
        f"{_SLACK_ICON.get(state, ':information_source:')} {event.get('kind')} "
        f"{event.get('operation_id')} "
        f"of org `{event.get('org_id')}` *{state}*: {_where(event.get('source') or {})} → "
        f"{_where(event.get('target') or {})}"
    )
    if event.get("error_code"):
        line += f" (error code {event['error_code']}, step {event.get('step') or '-'})"
    if event.get("recovery_required"):
        line += " — recovery required (`manage.py reshard_recover`)"
    return line + f", finished {event.get('finished_at') or '?'}"


def render(event: dict[str, Any], *, delivery_id: int, fmt: str) -> bytes:
    """The body sent: the event with its ``delivery_id`` (json), or Slack's ``{"text"}``."""
    if fmt == "slack":
        document: dict[str, Any] = {"text": slack_text(event)}
    else:
        document = {"delivery_id": delivery_id, **event}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
