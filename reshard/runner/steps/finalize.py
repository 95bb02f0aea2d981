"""Step P ``finalizing`` (spec §4.4 P; invariant 14; safeguard 30).

One transaction: warehouse ``resharding → ready`` (``metadata-store reshard complete``,
``compaction_enabled`` restored exactly from a recorded prior) and the fenced op update
``state='succeeded'`` with ``unblocked_at = finished_at = heartbeat_at = now()``; the open step
row closes ``ok``. Zero warehouse rows → "warehouse state mismatch"; zero op rows → ``Fenced``,
rolling the warehouse write back. The heartbeat thread is stopped first (a tick after the op
left ``running`` would look like fencing) and restarted if the transaction fails.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from duckgres_admin.models import ReshardOperation, ReshardStepTiming, StepOutcome, Warehouse
from reshard.engines import uploads
from reshard.runner.env import StepEnv
from reshard.runner.errors import Fenced, StepError

COMPLETE_MESSAGE = "metadata-store reshard complete"


def prior_to_flag(prior: Any) -> tuple[bool, bool | None]:
    """(restore?, value) from a ``compaction_prior`` shape; NULL = never paused = untouched."""
    if prior is None:
        return False, None
    if isinstance(prior, dict) and prior.get("present"):
        return True, bool(prior.get("value"))
    return True, None


def restore_fields(op_id: int) -> dict[str, Any]:
    prior = (
        ReshardOperation.objects.filter(id=op_id).values_list("compaction_prior", flat=True).first()
    )
    restore, value = prior_to_flag(prior)
    return {"compaction_enabled": value} if restore else {}


def run(env: StepEnv) -> None:
    from reshard.runner.report import write_report

    # No upload of this op can start after the backup step: close what a killed attempt left.
    uploads.abort_for_op(env.op, env.log.append)
    restart = None
    if env.heartbeat is not None:
        env.heartbeat.stop()
        restart = env.heartbeat
    env.op.refresh_from_db(fields=["target_opened_at", "source_kept_reason"])
    opened = env.op.target_opened_at is not None
    fields: dict[str, Any] = {}
    try:
        with transaction.atomic():
            if opened:  # the online mode unblocked it at its commit point (``opening``)
                _finish_opened(env)
            else:
                fields = restore_fields(env.op.id)
                moved = Warehouse.objects.filter(org_id=env.op.org_id, state="resharding").update(
                    state="ready", status_message=COMPLETE_MESSAGE, updated_at=Now(), **fields
                )
                if moved != 1:
                    raise StepError("warehouse state mismatch")
                env.fence.update(state="succeeded", error="", unblocked_at=Now(), finished_at=Now())
            ReshardStepTiming.objects.filter(
                operation_id=env.op.id, outcome=StepOutcome.OPEN
            ).update(outcome=StepOutcome.OK, ended_at=Now())
    except Fenced:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure is the finalize error
        _restart_heartbeat(env, restart)
        raise StepError(f"atomically finalize reshard and unblock warehouse: {exc}") from None
    env.ctx.finalized = True
    state = "failed" if env.op.source_kept_reason else "succeeded"
    if opened:
        env.log.info(f"operation {state}: the warehouse was unblocked on the target at the flip")
    else:
        restored = (
            f"; compaction_enabled restored to {fields['compaction_enabled']}" if fields else ""
        )
        env.log.info(f"warehouse unblocked: resharding → ready ({COMPLETE_MESSAGE}){restored}")
    try:
        write_report(env, state)
    except Exception as exc:  # noqa: BLE001 - the op is already succeeded
        env.log.warn(f"could not write the end-of-op report: {exc}")


def kept_source_error(op: ReshardOperation) -> str:
    return (
        "the catalog was moved and the warehouse runs on the target, but the source was kept "
        f"instead of dropped: {op.source_kept_reason}. The source database {op.source_database} "
        f"on store {op.from_shard} is intact with its tenant role NOLOGIN: compare it with the "
        'target and drop it by hand once satisfied (docs/runner.md "The online mode")'
    )


def _finish_opened(env: StepEnv) -> None:
    """The terminal write of an operation whose warehouse is already ready on its target:
    ``succeeded``, or ``failed`` when the source was kept (``source_kept_reason``)."""
    op = env.op
    if op.source_kept_reason:
        env.fence.update(state="failed", error=kept_source_error(op), finished_at=Now())
    else:
        env.fence.update(state="succeeded", error="", finished_at=Now())


def _restart_heartbeat(env: StepEnv, old: Any) -> None:
    if old is None:
        return
    from reshard.runner.heartbeat import Heartbeat

    fresh = Heartbeat(env.ctx, env.log, env.fence.heartbeat)
    env.heartbeat = fresh
    fresh.start()
