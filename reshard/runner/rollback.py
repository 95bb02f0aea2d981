"""Rollback (spec reshard §4.6), limited to what this build's steps can have done.

This build's steps can block the warehouse and record the source; nothing flips the binding,
copies, fences the source or pauses compaction. So rollback here is step 5, **unblock**: one
transaction under the per-org lock with the CAS ``resharding → ready`` (``metadata-store reshard
rolled back``), ``compaction_enabled`` restored only when ``compaction_prior`` was recorded,
and the fenced op update ``unblocked_at = now()``.

When the durable progress says more happened (a takeover of an op driven by a newer build:
flipped, copied, fence requested), this build cannot undo it: it must not unblock onto a
possibly wrong catalog, so it restores compaction only and leaves the warehouse ``resharding``
with ``recovery_required`` — the carve-out of invariant 9 — and logs what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard import locks
from reshard.runner.steps.base import StepEnv

ROLLED_BACK_MESSAGE = "metadata-store reshard rolled back"


@dataclass(frozen=True)
class RollbackOutcome:
    recovered: bool
    left_blocked: bool
    reason: str = ""


def _prior_to_flag(prior: Any) -> tuple[bool, bool | None]:
    """(restore?, value) from a ``compaction_prior`` shape; NULL = never paused = untouched."""
    if prior is None:
        return False, None
    if isinstance(prior, dict) and prior.get("present"):
        return True, bool(prior.get("value"))
    return True, None


def rollback(env: StepEnv) -> RollbackOutcome:
    progress = env.ctx.progress
    undone: list[str] = []
    if progress.flipped:
        undone.append("flip the binding back to the source")
    if progress.copied:
        undone.append("drop the partial target catalog")
    if progress.fence_requested:
        undone.append("re-enable LOGIN for the source tenant role (un-fence)")
    blocked = progress.blocked or env.op.blocked_at is not None
    if undone:
        reason = (
            "rollback needs to "
            + "; ".join(undone)
            + ", which this build of Duckgres Admin cannot do"
        )
        env.log.error(f"{reason}; nothing was unblocked")
        if blocked:
            _restore_compaction_only(env)
            env.log.error(
                f"warehouse intentionally left in the resharding state: {reason}; run "
                f"reshard_recover {env.op.id} after fixing it (with a build that has these steps)"
            )
        return RollbackOutcome(recovered=False, left_blocked=blocked, reason=reason)
    if blocked:
        unblock(env)
    else:
        env.log.info("rollback: the warehouse was never blocked; nothing to undo")
    return RollbackOutcome(recovered=True, left_blocked=False)


def unblock(env: StepEnv) -> bool:
    """§4.6 step 5; True when the warehouse moved ``resharding → ready``."""
    org = env.op.org_id
    with transaction.atomic():
        locks.lock_org(org)
        prior = (
            ReshardOperation.objects.filter(id=env.op.id)
            .values_list("compaction_prior", flat=True)
            .first()
        )
        restore, value = _prior_to_flag(prior)
        fields: dict[str, Any] = {
            "state": "ready",
            "status_message": ROLLED_BACK_MESSAGE,
            "updated_at": Now(),
        }
        if restore:
            fields["compaction_enabled"] = value
        moved = Warehouse.objects.filter(org_id=org, state="resharding").update(**fields)
        if moved == 0:
            found = Warehouse.objects.filter(org_id=org).values_list("state", flat=True).first()
            env.log.warn(
                f"rollback: warehouse is not in the resharding state (found {found or 'no row'});"
                " nothing to unblock"
            )
            return False
        env.fence.update(unblocked_at=Now())
    env.log.info(
        f"warehouse unblocked: resharding → ready ({ROLLED_BACK_MESSAGE})"
        + (f"; compaction_enabled restored to {value}" if restore else "")
    )
    return True


def _restore_compaction_only(env: StepEnv) -> None:
    with transaction.atomic():
        prior = (
            ReshardOperation.objects.filter(id=env.op.id)
            .values_list("compaction_prior", flat=True)
            .first()
        )
        restore, value = _prior_to_flag(prior)
        if not restore:
            return
        Warehouse.objects.filter(org_id=env.op.org_id, state="resharding").update(
            compaction_enabled=value, updated_at=Now()
        )
        env.fence.update()
    env.log.info(f"compaction_enabled restored to {value}")
