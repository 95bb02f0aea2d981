"""Claim and fenced writes: the runner's single-writer guarantee (spec reshard §1 inv. 4, §4.1).

Fencing invariants (each is relied on by the janitor, the API and a takeover runner):

1. **Claim by CAS.** One ``UPDATE … WHERE id=:id AND <needs an owner>`` — the one ownership
   rule, ``reshard.operation.ownership.NEEDS_OWNER_SQL``: ``pending``, or ``running`` with a null
   heartbeat or one older than the stale window, the rule the launch task and the janitor judge by
   too — sets ``state='running'``, ``runner_id``, ``runner_epoch = runner_epoch + 1``,
   ``heartbeat_at = now()`` and ``started_at = COALESCE(started_at, now())``. Zero rows: not
   claimable. Nothing else is reset: a takeover inherits every durable field. The same
   transaction closes the previous epochs' open step-timing rows as ``superseded``.
2. **Every runner write except log appends is fenced**: ``WHERE id=:id AND state='running'
   AND runner_id=:me AND runner_epoch=:epoch``, and sets ``heartbeat_at = now()``. Zero rows
   raise :class:`Fenced`; the runner then stops all side effects, rolls nothing back and makes
   no terminal write.
3. **Warehouse writes share a transaction with a fenced op update.** A fenced update matching
   zero rows raises inside that ``transaction.atomic`` block, so the warehouse write rolls back
   with it.
4. **Once fenced, always fenced.** After the heartbeat thread (or a write) observed fencing, or
   the runner fenced itself, every fenced write raises without touching the store.
5. **Database clock.** Every time written here is ``now()`` of the config store; only the
   self-fence uses the runner's monotonic clock (the time of its last successful fenced write,
   sampled when the write is sent, so the estimate errs on the early side).
6. **Self-fence** at ``DUCKGRES_RESHARD_STALE_SECONDS - 60`` seconds since the last successful
   fenced write: before that age a takeover cannot claim (its claim needs a heartbeat older than
   the stale window), after it the runner gives up (``heartbeat.py``).
7. **Short fenced transactions.** A transaction that has updated the op row holds its row lock
   until it ends, and the heartbeat's update waits for it; keep such transactions to a few
   statements (never wrap a long step, a copy or a wait in one), or the runner self-fences.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from duckgres_admin.models import ReshardOperation, ReshardStepTiming, StepOutcome
from reshard.operation.ownership import NEEDS_OWNER_SQL, needs_owner_params
from reshard.runner.context import RunContext
from reshard.runner.errors import Fenced

TERMINAL_OUTCOMES = {"succeeded": StepOutcome.OK, "failed": StepOutcome.FAILED}

# Invariant 1: the claim takes the op exactly when it needs an owner (reshard.operation.ownership).
_CLAIM_SQL = f"""
UPDATE duckgres_reshard_operations
   SET state = 'running', runner_id = %s, runner_pod_uid = %s, runner_epoch = runner_epoch + 1,
       heartbeat_at = now(), started_at = COALESCE(started_at, now())
 WHERE id = %s AND {NEEDS_OWNER_SQL}
RETURNING runner_epoch
"""


def claim(
    op_id: int, runner_id: str, stale_seconds: int | None = None, *, pod_uid: str = ""
) -> int | None:
    """Claim the op (invariant 1); the new epoch, or None when not claimable. ``pod_uid`` (the
    runner's ``POD_UID``) is recorded in the same write: the password route binds a pull to it
    (safeguard reshard-79)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, [runner_id, pod_uid, op_id, *needs_owner_params(stale_seconds)])
        row = cursor.fetchone()
        if row is None:
            return None
        epoch = int(row[0])
        ReshardStepTiming.objects.filter(
            operation_id=op_id, outcome=StepOutcome.OPEN, runner_epoch__lt=epoch
        ).update(outcome=StepOutcome.SUPERSEDED, ended_at=Now())
    return epoch


class Fencer:
    """Every fenced write of one runner (invariants 2-5)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def _guarded(self) -> Any:
        """The guard of every write (a recovery writer overrides it, spec §4.16)."""
        return ReshardOperation.objects.filter(
            id=self.ctx.op_id,
            state="running",
            runner_id=self.ctx.runner_id,
            runner_epoch=self.ctx.epoch,
        )

    def _touch(self) -> dict[str, Any]:
        """The ownership stamp every guarded write refreshes (recovery: ``recovery_claimed_at``)."""
        return {"heartbeat_at": Now()}

    def _record_success(self, sent_at: float) -> None:
        if connection.in_atomic_block:
            transaction.on_commit(lambda: self.ctx.note_write(sent_at))
        else:
            self.ctx.note_write(sent_at)

    def update(self, **fields: Any) -> None:
        """A fenced field update (also refreshes ``heartbeat_at``); zero rows → ``Fenced``.

        Inside ``transaction.atomic`` the raise rolls back the caller's whole transaction.
        """
        if self.ctx.fenced:
            raise Fenced()
        sent_at = time.monotonic()
        matched = self._guarded().update(**{**self._touch(), **fields})
        if matched == 0:
            raise Fenced()
        self._record_success(sent_at)

    def heartbeat(self) -> None:
        """The plain fenced heartbeat write."""
        self.update()

    def pre_statement_heartbeat(self) -> None:
        """Before an irreversible statement (§4.1): check the self-fence age, then heartbeat.

        ``Fenced`` (or an expired age, raised as ``Fenced``) means the statement must not be
        sent; a store error propagates and fails the step.
        """
        stale = settings.DUCKGRES_RESHARD_STALE_SECONDS
        age = self.ctx.seconds_since_write()
        if age > stale - 60:
            raise Fenced(
                f"runner self-fenced: no successful heartbeat for {int(age)} s (stale window "
                f"{stale} s); abandoning the operation to a takeover"
            )
        self.heartbeat()

    def stamp_step(self, step: str) -> None:
        """Stamp ``step`` on entry: close the open timing row (ok), open the new one."""
        with transaction.atomic():
            self.update(step=step)
            ReshardStepTiming.objects.filter(
                operation_id=self.ctx.op_id,
                runner_epoch=self.ctx.epoch,
                outcome=StepOutcome.OPEN,
            ).update(outcome=StepOutcome.OK, ended_at=Now())
            ReshardStepTiming.objects.create(
                operation_id=self.ctx.op_id, step=step, runner_epoch=self.ctx.epoch
            )
        self.ctx.current_step = step

    def terminal(self, state: str, error: str, *, recovery_required: bool = False) -> None:
        """The fenced terminal write; closes the open step row with the terminal outcome."""
        if state not in ("succeeded", "failed", "cancelled"):
            raise ValueError(f"not a terminal state: {state}")
        outcome = TERMINAL_OUTCOMES.get(state, StepOutcome.CANCELLED)
        fields: dict[str, Any] = {
            "state": state,
            "error": self.ctx.scrubber.scrub(error),
            "finished_at": Now(),
        }
        if recovery_required:
            fields["recovery_required"] = True
        with transaction.atomic():
            self.update(**fields)
            ReshardStepTiming.objects.filter(
                operation_id=self.ctx.op_id, outcome=StepOutcome.OPEN
            ).update(outcome=outcome, ended_at=Now())
