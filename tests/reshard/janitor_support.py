"""Shared helpers for the janitor, lease, launch and metrics tests.

``FakeLauncher`` is the one seam to the runner-launching world (Kubernetes or local child
processes) for pure-logic tests: an in-memory implementation of the ``Launcher`` protocol
with the semantics of spec §4.13 (``create(replace=False)`` never touches a live runner;
an exited same-name runner is deleted first; a terminating one refuses with
``StillTerminating``; ``delete`` marks a live runner terminating). Everything else is real:
PostgreSQL rows, the lease rows, the database clock.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from prometheus_client import REGISTRY

from duckgres_admin.leadership import LeaderLease
from duckgres_admin.models import ReshardLogEntry, ReshardOperation
from reshard import janitor as janitor_module
from reshard.janitor import Janitor
from reshard.launchers import capture
from reshard.launchers.base import RunnerObject, RunnerStatus, StillTerminating

_uids = itertools.count(1)
_orgs = itertools.count(1)


class FakeClock:
    """A monotonic clock the test moves by hand (the lease's renew-deadline judgement)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeLauncher:
    kind = "local"
    default_grace_seconds = 600

    def __init__(self) -> None:
        self.runners: dict[int, RunnerStatus] = {}
        self.logs: dict[int, str] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.create_error: Exception | None = None
        self.read_log_error: Exception | None = None
        self.phase_error: Exception | None = None
        self.lock = threading.Lock()
        self.on_call: Any = None  # hook(name, op_id) run on every call

    def _hook(self, name: str, op_id: int) -> None:
        if self.on_call is not None:
            self.on_call(name, op_id)

    # --- protocol -----------------------------------------------------------------------------
    def create(self, op: ReshardOperation, replace: bool) -> RunnerStatus:
        self._hook("create", op.id)
        with self.lock:
            self.calls.append(("create", op.id, replace))
            if self.create_error is not None:
                raise self.create_error
            existing = self.runners.get(op.id)
            if existing is not None:
                if existing.terminating or not existing.exited:
                    raise StillTerminating(existing)
                del self.runners[op.id]  # an exited one is deleted first
            status = RunnerStatus(
                phase="Pending", spawned_at=datetime.now(UTC), uid=f"uid-{next(_uids)}"
            )
            self.runners[op.id] = status
            self.logs[op.id] = f"runner {op.id} started\nsecond line\n"
            return status

    def get_phase(self, op_id: int) -> RunnerStatus:
        self._hook("get_phase", op_id)
        with self.lock:
            self.calls.append(("get_phase", op_id))
            if self.phase_error is not None:
                raise self.phase_error
            return self.runners.get(op_id, RunnerStatus(phase="absent"))

    def list(self) -> list[RunnerObject]:
        with self.lock:
            self.calls.append(("list",))
            return [
                RunnerObject(name=f"duckgres-reshard-op-{op_id}", op_id_label=str(op_id), status=s)
                for op_id, s in self.runners.items()
            ]

    def delete(self, op_id: int, grace_seconds: int | None = None) -> None:
        self._hook("delete", op_id)
        with self.lock:
            self.calls.append(("delete", op_id, grace_seconds))
            status = self.runners.get(op_id)
            if status is None:
                return
            if status.exited:
                del self.runners[op_id]
            else:
                self.runners[op_id] = replace(status, terminating=True)

    def read_log(self, op_id: int, limit_bytes: int = 5 * 1024 * 1024) -> str:
        with self.lock:
            self.calls.append(("read_log", op_id))
            if self.read_log_error is not None:
                raise self.read_log_error
            return self.logs.get(op_id, "")[-limit_bytes:]

    def capture_log(self, op_id: int, status: RunnerStatus) -> bool:
        return capture.capture_log(op_id, status, self.read_log)

    # --- test controls --------------------------------------------------------------------------
    def put(self, op_id: int, phase: str, *, age_seconds: float = 0, **kw: Any) -> RunnerStatus:
        status = RunnerStatus(
            phase=phase,
            spawned_at=datetime.now(UTC) - timedelta(seconds=age_seconds),
            uid=kw.pop("uid", f"uid-{next(_uids)}"),
            **kw,
        )
        with self.lock:
            self.runners[op_id] = status
            self.logs.setdefault(op_id, f"runner {op_id} log line\n")
        return status

    def kill(self, op_id: int, reason: str = "OOMKilled") -> None:
        with self.lock:
            self.runners[op_id] = replace(self.runners[op_id], phase="Failed", reason=reason)

    def gone(self, op_id: int) -> None:
        with self.lock:
            self.runners.pop(op_id, None)

    def creates(self, op_id: int | None = None) -> builtins.list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "create" and (op_id is None or c[1] == op_id)]

    def deletes(self, op_id: int | None = None) -> builtins.list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "delete" and (op_id is None or c[1] == op_id)]


def new_op(state: str = "pending", **overrides: Any) -> ReshardOperation:
    fields: dict[str, Any] = {
        "org_id": f"org-janitor-{next(_orgs)}",
        "source_kind": "cnpg",
        "from_shard": "shard-a",
        "target_kind": "cnpg",
        "to_shard": "shard-b",
        "state": state,
        "launcher": "local",
    }
    fields.update(overrides)
    return ReshardOperation.objects.create(**fields)


def sql(statement: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def age_op(op_id: int, **intervals: str) -> None:
    """Backdate timestamp columns with the database clock: age_op(1, heartbeat_at='10 minutes')."""
    sets = ", ".join(f"{col} = now() - interval %s" for col in intervals)
    sql(
        f"UPDATE duckgres_reshard_operations SET {sets} WHERE id = %s", [*intervals.values(), op_id]
    )


def stale_pending(**overrides: Any) -> ReshardOperation:
    op = new_op("pending", **overrides)
    age_op(op.id, created_at="10 minutes")
    return op


def stale_running(
    step: str = "copying", blocked: bool = True, **overrides: Any
) -> ReshardOperation:
    op = new_op(
        "running", step=step, runner_id="duckgres-reshard-op-x", runner_epoch=1, **overrides
    )
    age_op(op.id, created_at="20 minutes", heartbeat_at="10 minutes")
    if blocked:
        age_op(op.id, blocked_at="15 minutes")
    return op


def reset_leases() -> None:
    sql(
        "INSERT INTO duckgres_leases (name, holder, epoch, expires_at) VALUES "
        "('janitor', '', 0, '-infinity'), ('trino', '', 0, '-infinity') "
        "ON CONFLICT (name) DO UPDATE SET holder = '', epoch = 0, acquired_at = NULL, "
        "renewed_at = NULL, expires_at = '-infinity'"
    )


def expire_lease(name: str = "janitor") -> None:
    sql(
        "UPDATE duckgres_leases SET expires_at = now() - interval '1 second' WHERE name = %s",
        [name],
    )


def make_janitor(
    launcher: FakeLauncher, holder: str = "janitor-a.1.aaaaaaaa", clock: Any = None
) -> Janitor:
    kwargs: dict[str, Any] = {"holder": holder}
    if clock is not None:
        kwargs["clock"] = clock
    return Janitor(LeaderLease("janitor", **kwargs), launcher_for=lambda kind: launcher)


def op_log(op_id: int, source: str | None = None) -> list[str]:
    rows = ReshardLogEntry.objects.filter(operation_id=op_id).order_by("id")
    if source is not None:
        rows = rows.filter(source=source)
    return list(rows.values_list("message", flat=True))


def refresh(op: ReshardOperation) -> ReshardOperation:
    return ReshardOperation.objects.get(id=op.id)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def janitor_env(db: None, settings: Any) -> Iterator[None]:
    """Lease rows as seeded, no leftover warn rate-limit state, production thresholds."""
    reset_leases()
    janitor_module._warned_at.clear()
    settings.DUCKGRES_RESHARD_PENDING_GRACE_SECONDS = 120
    settings.DUCKGRES_RESHARD_STALE_SECONDS = 300
    settings.DUCKGRES_RESHARD_SPAWN_GRACE_SECONDS = 120
    settings.DUCKGRES_RESHARD_REAP_AFTER_SECONDS = 300
    settings.DUCKGRES_RESHARD_LAUNCHER = "local"
    yield
    janitor_module._warned_at.clear()
