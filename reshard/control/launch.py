"""The launch service behind the ``reshard.launch_runner`` Celery task (spec reshard §4.13).

Idempotent by construction, because the task is ``acks_late`` and may be delivered twice:

- it acts only when the op row says a runner is wanted: the op needs an owner by the one
  ownership rule (``reshard.operation.ownership``: ``pending``, or ``running`` with a null or stale
  heartbeat, judged by the database clock), exactly what the runner's claim requires;
- a runner object that exists and has not exited is left alone (a duplicate delivery must
  never kill a live runner), and ``create(op, replace=False)`` repeats that rule inside the
  launcher; an exited same-name runner is deleted first, after the launcher has captured its
  log into the op log (``Launcher.capture_log``; unless its own exit marker is already there);
- failures never change the op: an error line "launching the reshard runner failed: <err>" is
  appended and the op stays ``pending`` for the janitor, which relaunches it after the pending
  grace (§4.15).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from duckgres_admin.models import ReshardOperation
from reshard.launchers import get_launcher
from reshard.launchers.base import Launcher, RunnerStatus, StillTerminating
from reshard.operation import oplog, ownership

_log = logging.getLogger("duckgres.reshard.launch")

LaunchOutcome = Literal["missing", "not-needed", "already-running", "launched", "failed"]


def launch_runner(
    op_id: int, *, launcher_for: Callable[[str], Launcher] = get_launcher
) -> LaunchOutcome:
    """Start the runner of ``op_id`` if, and only if, the row wants one."""
    op = (
        ReshardOperation.objects.filter(id=op_id)
        .annotate(launchable=ownership.needs_owner())
        .first()
    )
    if op is None:
        _log.warning("launch: reshard operation %s does not exist; nothing to launch", op_id)
        return "missing"
    if not op.launchable:
        _log.info("launch: op %s is %s with a live owner; nothing to do", op_id, op.state)
        return "not-needed"
    try:
        launcher = launcher_for(op.launcher)
        status = launcher.get_phase(op.id)
        if status.phase != "absent" and not status.exited:
            _log.info(
                "launch: runner %s already exists (phase %s%s); leaving it alone",
                op.runner_name,
                status.phase,
                ", terminating" if status.terminating else "",
            )
            return "already-running"
        if status.exited:
            # An exited runner of an op that still wants one: its log goes into the op log
            # first (invariant 13), then it is deleted so a fresh runner can take its name.
            launcher.capture_log(op.id, status)
            launcher.delete(op.id)
        launcher.create(op, replace=False)
    except StillTerminating as exc:
        existing: RunnerStatus | None = getattr(exc, "existing", None)
        if existing is not None and not existing.exited and not existing.terminating:
            # Lost a race with another delivery: a live runner appeared; leave it alone.
            _log.info("launch: runner %s appeared meanwhile; leaving it alone", op.runner_name)
            return "already-running"
        oplog.append(
            op.id, f"launching the reshard runner failed: {exc}", level="error", source="janitor"
        )
        return "failed"
    except Exception as exc:  # noqa: BLE001 - every failure leaves the op pending for the janitor
        oplog.append(
            op.id,
            f"launching the reshard runner failed: {exc}",
            level="error",
            source="janitor",
        )
        return "failed"
    _log.info("launch: started runner %s", op.runner_name)
    return "launched"
