"""The instance sweep of the pool tick (spec trino-pools §4.4 step 10, §4.6): one step per tick.

Invariants:

1. **One step per tick, isolated.** ``progress`` visits the instances in id order; the first one
   that does work gets exactly one step and the sweep ends; any step that sent a mutation
   (Gateway or Kubernetes) is that step, also when it was refused (a ``POOL_NOT_DRAINED`` seal)
   or only issued DELETEs that are still finishing. A waiting instance (obligations open,
   resources still present, coordinator not ready, healthy) sent nothing and the sweep goes on.
2. **Failures stay with their instance.** A failing instance has its error recorded on its row
   (``last_error``, fenced) and in ``errors``; the sweep moves on. Only ``PoolConflict`` (a
   fence refusal) and ``LeadershipLost`` stop it.
3. **One handler per phase** (``HANDLERS``), grouped by module: ``candidates`` (``PENDING`` …
   ``VALIDATING``), ``serving`` (``ADMITTED``, ``SERVING``, ``SUSPECT``), ``draining``
   (``DRAINING``, ``SEALED``), ``teardown`` (``RETIRING``, ``LOST``, ``FAILED_PREPARING``).
   Terminal and unknown phases have none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance
from trino_pools import phases
from trino_pools.authority import PoolConflict
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import LeadershipLost
from trino_pools.operator.instances import base, candidates, draining, serving, teardown

P = InstancePhase
_log = logging.getLogger("duckgres.trino.instances")

Handler = Callable[[PoolContext, TrinoPoolInstance], bool]

HANDLERS: dict[str, Handler] = {
    P.PENDING: candidates.step_pending,
    P.CREATING: candidates.step_creating,
    P.PREPARING: candidates.step_preparing,
    P.VALIDATING: candidates.step_validating,
    P.ADMITTED: serving.step_admitted,
    P.SERVING: serving.step_serving,
    P.SUSPECT: serving.step_suspect,
    P.DRAINING: draining.step_draining,
    P.SEALED: draining.step_sealed,
    P.RETIRING: teardown.step_retiring,
    P.LOST: teardown.step_lost,
    P.FAILED_PREPARING: teardown.step_failed_preparing,
}


def progress(
    ctx: PoolContext, rows: Sequence[TrinoPoolInstance], errors: list[BaseException]
) -> bool:
    """Step 10: the first instance with work gets one step; True when one did."""
    for row in sorted(rows, key=lambda r: r.instance_id):
        if not phases.is_valid(row.phase) or phases.is_terminal(row.phase):
            continue
        try:
            if step(ctx, row):
                return True
        except (PoolConflict, LeadershipLost):
            raise
        except Exception as exc:  # noqa: BLE001 - per-instance isolation (invariant 2)
            errors.append(exc)
            _log.warning(
                "Trino pool instance step failed: %s",
                exc,
                extra={
                    "pool": ctx.cell.id,
                    "instance": row.instance_id,
                    "epoch": ctx.auth.epoch,
                    "phase": row.phase,
                },
            )
            base.record_error(ctx, row, exc)
    return False


def step(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """One step of one instance; True when it did work, False when it only waited."""
    handler = HANDLERS.get(row.phase)
    if handler is None:
        return False
    return handler(ctx, row)
