"""The janitor: the leader-only reshard reconciler (spec reshard §4.15, invariants 12, 13, 15).

Driven by Celery beat every 30 s on the ``duckgres.control`` queue. Every tick:

1. Renew or take the ``janitor`` lease (``duckgres_admin.platform.leadership``); not leader →
return.
   List the active ops (an error skips the tick).
2. An **observed death** is acted on at once: a ``running`` op whose heartbeat is still fresh but
   whose runner the launcher reports exited (the local child is gone, the pod's container
   terminated) or, for pods, absent, has its heartbeat cleared by CAS (guarded by its state,
   epoch and the very heartbeat read, so a live or newer runner is never touched). It then needs a
   runner like a stale op, in this same tick, within the same bounded respawn budget; the epoch
   still fences a survivor. One launcher listing per launcher kind per tick, not one per op.
   For each op that **needs a runner** (``reshard.operation.ownership.NEEDS_RUNNER_SQL``: the one
   ownership rule the claim and the launch task use too — ``pending``, here past the pending grace,
   or ``running`` with a null heartbeat or one older than the stale window; always judged by the
   database clock), read its runner's phase. A live runner spawned within the spawn grace is
   left alone; a *terminating* one gets a (rate-limited) warning and ``delete`` again, without
   consuming an attempt.
3. Stale and not exited (wedged): the launcher captures its log (``Launcher.capture_log``);
   delete it with its normal grace (the epoch fences the old runner), no increment.
4. Absent or exited: ``respawn_attempts + 1`` by CAS (guarded by the same predicate); ≤ 3 →
   relaunch with ``create(op, replace=True)``. "Previous runner pod still terminating" gives
   the increment back by CAS.
5. Count 4 → force-fail by CAS with operator instructions (``recovery_required`` when the op
   may have changed anything); the CAS sets ``respawn_attempts`` back to 3, the relaunches
   that were made, as the message says.
6. Gauges; histograms of terminal ops, each observed once after a CAS on
   ``metrics_observed_at``.
7. Reap runner objects of terminal ops (after the launcher has captured their log, unless the
   runner's own marker is in the op log: ``Launcher.capture_log``) and exited orphans.
8. At most once per ``DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS``: the bounded sweep of open backup
   uploads of terminal operations (``reshard.engines.uploads``; leadership checked before each
   abort). A force-fail (step 5) aborts that op's own uploads at once.
9. Store drains (``reshard.control.drains``): each active drain's children are launched as ordinary
   reshards, at most ``max_concurrent`` active, under the drain's advisory lock; a cancelling
   drain requests cancel of its children; a drain with nothing left ends.
10. The tick is *completed*: ``duckgres_janitor_last_reconcile_timestamp_seconds`` = now. Only a
   leader tick that was neither stopped (leadership unproven) nor skipped (listing failed)
   gets here; one op's failure or a failing runner listing does not prevent it.

The lease is renewed before acting and before every intervention (relaunch, force-fail,
delete); past the renew deadline the tick stops where it is. Nothing is ever reset by a success:
``respawn_attempts`` only rises (except the give-back of step 4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import Error as DbError
from django.db import connection, transaction
from django.db.models import BooleanField, DateTimeField, QuerySet
from django.db.models.expressions import RawSQL

from duckgres_admin.models import ReshardOperation
from duckgres_admin.models.reshard import ACTIVE_STATES
from duckgres_admin.platform.leadership import LeaderLease
from duckgres_admin.platform.leadership import lease as process_lease
from duckgres_admin.platform.names import runner_name
from reshard.control import drains, metrics
from reshard.engines import uploads
from reshard.launchers import get_launcher, login
from reshard.launchers.base import (
    DEFAULT_GRACE_SECONDS,
    Launcher,
    RunnerStatus,
    StillTerminating,
)
from reshard.operation import oplog
from reshard.operation.ownership import NEEDS_RUNNER_SQL, needs_runner, needs_runner_params

_log = logging.getLogger("duckgres.reshard.janitor")

MAX_RESPAWNS = 3
STILL_TERMINATING = "previous runner pod still terminating"
TERMINATING_WARN_INTERVAL = 60.0
_last_sweep: float | None = None  # monotonic time of this process's last upload sweep

# What the tick's listing reads of each active op: enough to decide that most need nothing.
_LISTED_FIELDS = ("id", "state", "launcher", "runner_epoch", "heartbeat_at")


def _annotated(ops: QuerySet[ReshardOperation]) -> QuerySet[ReshardOperation]:
    # needs_runner: the one ownership rule (reshard.operation.ownership), as the janitor applies it.
    return ops.annotate(
        needs_runner=needs_runner(), db_now=RawSQL("now()", [], output_field=DateTimeField())
    )


def force_fail_message(
    op_id: int, *, blocked: bool, step: str = "<step>", started: bool = False
) -> str:
    """The janitor's force-fail error: ``blocked`` (``blocked_at`` set), else ``started`` (a
    step stamped: an online copy's pre-copy may have left its capture and a target), else
    never started."""
    name = runner_name(op_id)
    head = (
        f"reshard runner could not be kept alive: the runner pod {name} died or failed to start "
        f"{MAX_RESPAWNS} times; "
    )
    if not blocked and started:
        return head + (
            "automatic recovery has stopped and this operation is marked failed. The warehouse "
            f"was never blocked (last step: {step}), but the operation may have left work on "
            "the stores: a target database and, for the online copy, its change capture on "
            "the source catalog's tables. Fix the cause (pod events, the log above), then run "
            f"`python manage.py reshard_recover {op_id}` to remove it from its durable "
            "progress. Do not edit the catalog by hand."
        )
    if not blocked:
        return head + "the warehouse was never blocked; fix the cause and start a new operation."
    return head + (
        "automatic recovery has stopped and this operation is marked failed. The warehouse may "
        f"still be blocked (state resharding) with its catalog mid-move (last step: {step}). "
        "Fix the cause (pod events, the log above), then run "
        f"`python manage.py reshard_recover {op_id}` to roll it back or forward from its "
        "durable progress. Do not edit the warehouse row by hand."
    )


_STEP_PLACEHOLDER = "\x01step\x01"

# The respawn increment and the force-fail re-check "needs a runner" (NEEDS_RUNNER_SQL, bound by
# needs_runner_params()), so each CAS re-checks exactly what the decision was based on.
_INCREMENT_SQL = f"""
UPDATE duckgres_reshard_operations SET respawn_attempts = respawn_attempts + 1
 WHERE id = %s AND state IN ('pending', 'running') AND {NEEDS_RUNNER_SQL}
RETURNING respawn_attempts
"""

_GIVE_BACK_SQL = """
UPDATE duckgres_reshard_operations SET respawn_attempts = respawn_attempts - 1
 WHERE id = %s AND respawn_attempts = %s
"""

_FORCE_FAIL_SQL = f"""
UPDATE duckgres_reshard_operations
   SET state = 'failed', finished_at = now(), runner_epoch = runner_epoch + 1,
       runner_id = 'janitor',
       -- the attempt that found the budget spent relaunched nothing: it reads as the relaunches
       respawn_attempts = LEAST(respawn_attempts, %s),
       recovery_required = (step <> '' OR blocked_at IS NOT NULL),
       error = CASE WHEN blocked_at IS NOT NULL
                    THEN replace(%s, %s, COALESCE(NULLIF(step, ''), 'none'))
                    WHEN step <> '' THEN replace(%s, %s, step)
                    ELSE %s END
 WHERE id = %s AND state IN ('pending', 'running') AND {NEEDS_RUNNER_SQL}
RETURNING recovery_required, error, runner_epoch
"""

# Close the step-timing row the dead runner left open, so the report and the step histogram
# see the step the op failed in.
_CLOSE_STEPS_SQL = """
UPDATE duckgres_reshard_operation_steps SET ended_at = now(), outcome = 'failed'
 WHERE operation_id = %s AND outcome = ''
"""


class _StopTick(Exception):
    """Leadership can no longer be proven (lost, or past the renew deadline)."""


@dataclass
class TickReport:
    """What one tick did (for tests, logs and the task result)."""

    leader: bool = False
    stopped: bool = False
    completed: bool = False
    actions: list[str] = field(default_factory=list)

    def add(self, action: str) -> None:
        self.actions.append(action)


# "previous runner pod still terminating" at most once per runner per minute (process-local).
_warned_at: dict[tuple[int, str], float] = {}
_warned_lock = threading.Lock()


def _should_warn(op_id: int, uid: str, clock: Callable[[], float] = time.monotonic) -> bool:
    key = (op_id, uid)
    now = clock()
    with _warned_lock:
        last = _warned_at.get(key)
        if last is not None and now - last < TERMINATING_WARN_INTERVAL:
            return False
        _warned_at[key] = now
        if len(_warned_at) > 10_000:
            _warned_at.clear()
            _warned_at[key] = now
        return True


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Janitor:
    """One reconcile tick's worth of behaviour around a process-wide lease object."""

    def __init__(
        self,
        lease: LeaderLease | None = None,
        *,
        launcher_for: Callable[[str], Launcher] = get_launcher,
    ) -> None:
        self.lease = lease or process_lease("janitor")
        self._launcher_for = launcher_for
        self._launchers: dict[str, Launcher] = {}

    # --- helpers --------------------------------------------------------------------------------
    def _launcher(self, kind: str) -> Launcher:
        launcher = self._launchers.get(kind)
        if launcher is None:
            launcher = self._launcher_for(kind)
            self._launchers[kind] = launcher
        return launcher

    def _may_act(self) -> None:
        """Renew before an intervention; raise to stop the tick when leadership is unproven."""
        if not self.lease.ensure():
            raise _StopTick

    def _check_deadline(self) -> None:
        if not self.lease.acting_allowed():
            raise _StopTick

    def _warn_terminating(self, op_id: int, status: RunnerStatus) -> None:
        if _should_warn(op_id, status.uid or runner_name(op_id)):
            oplog.append(
                op_id,
                f"{STILL_TERMINATING}: waiting for {runner_name(op_id)} to go away",
                level="warn",
                source="janitor",
            )

    # --- the tick -------------------------------------------------------------------------------
    def reconcile(self) -> TickReport:
        report = TickReport()
        leader = self.lease.acquire()
        metrics.set_leadership(leader, self.lease.epoch)
        if not leader:
            return report
        report.leader = True
        try:
            report.completed = self._tick(report)
        except _StopTick:
            report.stopped = True
            metrics.set_leadership(False, None)
            _log.warning(
                "janitor: leadership could not be proven (lease %s, epoch %s); "
                "stopping this tick without further interventions",
                self.lease.name,
                self.lease.epoch,
            )
        if report.completed:
            metrics.mark_reconcile_completed()
        return report

    def _tick(self, report: TickReport) -> bool:
        """Steps 1-7; True when the tick ran to its end (False: skipped, nothing listed)."""
        try:
            ops = list(_annotated(ReshardOperation.objects.filter(state__in=ACTIVE_STATES))
                       .only(*_LISTED_FIELDS).order_by("id"))  # fmt: skip
        except DbError as exc:
            _log.warning("janitor: listing active operations failed, skipping this tick: %s", exc)
            return False

        dead = self._observed_dead(ops)
        stale = 0
        for listed in ops:
            if not getattr(listed, "needs_runner", False) and not (
                listed.id in dead and self._release(listed, dead[listed.id])
            ):
                continue  # fresh heartbeat and a runner not seen dead: never touched
            stale += 1
            self._check_deadline()
            try:
                self._reconcile_op(listed, getattr(listed, "db_now"), report)  # noqa: B009
            except _StopTick:
                raise
            except Exception:  # noqa: BLE001 - one op's failure never stops the tick
                _log.exception("janitor: reconciling op %s failed; next op", listed.id)

        self._check_deadline()
        try:
            recovery = ReshardOperation.objects.filter(
                state="failed", recovery_required=True
            ).count()
        except DbError as exc:
            _log.warning("janitor: counting recovery-required operations failed: %s", exc)
        else:
            metrics.set_gauges(active=len(ops), stale=stale, recovery_required=recovery)
        try:
            metrics.observe_terminal_operations()
        except DbError as exc:
            _log.warning("janitor: observing terminal-operation metrics failed: %s", exc)
        try:
            metrics.set_backup_verified_ages(datetime.now(UTC))
        except DbError as exc:
            _log.warning("janitor: reading the restore tests' results failed: %s", exc)

        self._check_deadline()
        live = self._reap(report)
        if live is not None:
            self._sweep_logins(report, live)
        self._sweep_uploads(report)
        self._advance_drains(report)
        return True

    # --- step 7b: runner logins (reshard.launchers.login) -------------------------------------
    def _sweep_logins(self, report: TickReport, live: set[int]) -> None:
        """Drop the config-store login of every operation that is terminal and whose runner
        object is gone (``live``: the op ids the reap listed; a runner it just deleted is
        still listed, so its login goes on a later tick)."""
        launcher = self._launcher(settings.DUCKGRES_RESHARD_LAUNCHER)
        try:
            ended = login.ended(login.logins(), live)
        except DbError as exc:  # a later tick retries
            _log.warning("janitor: listing runner logins failed: %s", exc)
            return
        for name in ended:
            self._check_deadline()
            self._may_act()
            op_id = login.op_id_of(name)
            try:
                if op_id is not None:
                    launcher.forget_login(op_id)
                login.drop(name)
            except Exception as exc:  # noqa: BLE001 - one login's failure never stops the sweep
                _log.warning("janitor: dropping runner login %s failed: %s", name, exc)
                continue
            report.add(f"drop-login {op_id}")

    # --- step 9: store drains (reshard.control.drains)
    # -----------------------------------------------
    def _advance_drains(self, report: TickReport) -> None:
        """Launch, cancel and end the store drains' children; leadership is renewed before
        every launch and cancel. A failure is logged and never fails the tick."""
        self._check_deadline()
        try:
            result = drains.advance(self._may_act)
        except _StopTick:
            raise
        except Exception:  # noqa: BLE001 - the drains never fail the tick
            _log.exception("janitor: advancing the store drains failed")
            return
        for action in result.actions:
            report.add(action)

    # --- step 8: the upload sweep (reshard.engines.uploads) -----------------------------------
    def _sweep_uploads(self, report: TickReport) -> None:
        """At most once per ``DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS`` per leader process (0 turns
        it off); a failure is logged and never fails the tick."""
        global _last_sweep
        interval = float(settings.DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS)
        now = time.monotonic()
        if interval <= 0 or (_last_sweep is not None and now - _last_sweep < interval):
            return
        _last_sweep = now
        self._check_deadline()
        try:
            result = uploads.sweep(self.lease.ensure)
        except Exception:  # noqa: BLE001 - the sweep never fails the tick
            _log.exception("janitor: the backup upload sweep failed")
            return
        for uri in result.aborted:
            report.add(f"abort-upload {uri}")
        _log.info(
            "janitor: upload sweep: %d bucket(s), %d aborted, %d of active operations and %d "
            "not ours left alone, %d error(s)%s",
            result.buckets,
            len(result.aborted),
            result.left_active,
            result.left_foreign,
            len(result.errors),
            " (bounded: the rest waits for the next sweep)" if result.truncated else "",
        )

    # --- step 2: observed deaths ------------------------------------------------------------------
    def _observed_dead(self, ops: Sequence[ReshardOperation]) -> dict[int, RunnerStatus]:
        """Runners reported dead for ``running`` ops whose heartbeat is still fresh.

        Exited counts for every launcher; absent only for the pod launcher, whose listing is the
        API server's (a local runner's state lives on the host that started it)."""
        fresh = [
            op for op in ops if op.state == "running" and not getattr(op, "needs_runner", False)
        ]
        dead: dict[int, RunnerStatus] = {}
        for kind in sorted({op.launcher for op in fresh}):
            try:
                listed = self._launcher(kind).list()
            except Exception as exc:  # noqa: BLE001 - a failed listing only delays, as before
                _log.warning("janitor: listing %s runners failed: %s", kind, exc)
                continue
            by_op = {obj.op_id_label: obj.status for obj in listed}
            for op in (o for o in fresh if o.launcher == kind):
                status = by_op.get(str(op.id))
                if status is None:
                    if kind == "pod":
                        dead[op.id] = RunnerStatus(phase="absent")
                elif status.exited and not status.terminating:
                    dead[op.id] = status
        return dead

    def _release(self, op: ReshardOperation, status: RunnerStatus) -> bool:
        """Clear the heartbeat of an op whose runner was seen dead (CAS); True when released."""
        self._may_act()
        released = ReshardOperation.objects.filter(
            id=op.id,
            state="running",
            runner_epoch=op.runner_epoch,
            heartbeat_at=op.heartbeat_at,
        ).update(heartbeat_at=None)
        if released != 1:
            return False  # it heartbeated, finished or was taken over since the listing
        seen = (
            "is gone"
            if status.phase == "absent"
            else f"exited (phase {status.phase}{', ' + status.reason if status.reason else ''})"
        )
        oplog.append(
            op.id,
            f"runner {runner_name(op.id)} (epoch {op.runner_epoch}) {seen} while its heartbeat "
            "was fresh: relaunching now instead of waiting for the heartbeat to go stale",
            level="warn",
            source="janitor",
        )
        op.heartbeat_at = None
        return True

    # --- steps 3-5 --------------------------------------------------------------------------------
    def _reconcile_op(self, op: ReshardOperation, db_now: datetime, report: TickReport) -> None:
        name = runner_name(op.id)
        launcher = self._launcher(op.launcher)
        try:
            status = launcher.get_phase(op.id)
        except Exception as exc:  # noqa: BLE001 - any launcher failure: warn, next op
            _log.warning("janitor: reading the phase of %s failed: %s", name, exc)
            return

        present = status.phase != "absent"
        if present and not status.exited and not status.terminating:
            spawned = status.spawned_at
            grace = int(settings.DUCKGRES_RESHARD_SPAWN_GRACE_SECONDS)
            if spawned is not None and (db_now - _aware(spawned)).total_seconds() <= grace:
                return  # a fresh replacement gets time to schedule and claim
        if status.terminating:
            self._may_act()
            self._warn_terminating(op.id, status)
            try:
                launcher.delete(op.id)
            except Exception as exc:  # noqa: BLE001
                _log.warning("janitor: repeating delete of %s failed: %s", name, exc)
            report.add(f"terminating {op.id}")
            return
        if present and not status.exited:
            self._delete_wedged(op, launcher, status, report)
            return
        self._respawn(op, launcher, status, report)

    def _delete_wedged(
        self, op: ReshardOperation, launcher: Launcher, status: RunnerStatus, report: TickReport
    ) -> None:
        name = runner_name(op.id)
        self._may_act()
        # Re-check on the row just before deleting: a runner that heartbeated since the
        # listing is alive after all.
        still_stale = (
            ReshardOperation.objects.filter(id=op.id, state__in=ACTIVE_STATES)
            .annotate(needs_runner=needs_runner())
            .filter(needs_runner=True)
            .exists()
        )
        if not still_stale:
            return
        launcher.capture_log(op.id, status)
        grace = int(getattr(launcher, "default_grace_seconds", DEFAULT_GRACE_SECONDS))
        oplog.append(
            op.id,
            f"deleting wedged runner {name} (grace {grace} s)",
            level="warn",
            source="janitor",
        )
        try:
            launcher.delete(op.id)  # normal grace, never 0: the epoch fences the old runner
        except Exception as exc:  # noqa: BLE001
            _log.warning("janitor: deleting wedged runner %s failed: %s", name, exc)
        report.add(f"delete-wedged {op.id}")

    def _respawn(
        self, op: ReshardOperation, launcher: Launcher, status: RunnerStatus, report: TickReport
    ) -> None:
        name = runner_name(op.id)
        self._may_act()
        with connection.cursor() as cursor:
            cursor.execute(_INCREMENT_SQL, [op.id, *needs_runner_params()])
            row = cursor.fetchone()
        if row is None:
            return  # the op changed under us (claimed, finished, cancelled): nothing to do
        attempt = int(row[0])
        if attempt > MAX_RESPAWNS:
            self._force_fail(op, report)
            return
        if status.phase == "absent":
            what = "no pod"
        else:
            what = f"pod phase {status.phase}, reason {status.reason or 'unknown'}"
        oplog.append(
            op.id,
            f"runner pod missing or dead ({what}) — respawning {name} "
            f"(attempt {attempt}/{MAX_RESPAWNS})",
            level="warn",
            source="janitor",
        )
        if status.exited:
            launcher.capture_log(op.id, status)
        try:
            # The listing read only what the decision needs; the launcher gets the whole row.
            launcher.create(ReshardOperation.objects.get(id=op.id), replace=True)
        except StillTerminating:
            with connection.cursor() as cursor:
                cursor.execute(_GIVE_BACK_SQL, [op.id, attempt])
                returned = cursor.rowcount == 1
            _log.info(
                "janitor: %s still terminating; attempt %d %s",
                name,
                attempt,
                "given back" if returned else "not given back (row changed)",
            )
            self._warn_terminating(op.id, status)
            report.add(f"still-terminating {op.id}")
            return
        except Exception as exc:  # noqa: BLE001 - any launcher failure is an outcome
            oplog.append(
                op.id, f"respawning runner pod failed: {exc}", level="error", source="janitor"
            )
            metrics.count_respawn("failed")
            report.add(f"respawn-failed {op.id} attempt {attempt}")
            return
        metrics.count_respawn("spawned")
        report.add(f"respawn {op.id} attempt {attempt}")

    def _force_fail(self, op: ReshardOperation, report: TickReport) -> None:
        self._may_act()
        blocked_msg = force_fail_message(op.id, blocked=True, step=_STEP_PLACEHOLDER)
        started_msg = force_fail_message(op.id, blocked=False, started=True, step=_STEP_PLACEHOLDER)
        never_msg = force_fail_message(op.id, blocked=False)
        with transaction.atomic(), connection.cursor() as cursor:
            params: list[int | str] = [
                MAX_RESPAWNS, blocked_msg, _STEP_PLACEHOLDER, started_msg, _STEP_PLACEHOLDER,
                never_msg, op.id,
            ]  # fmt: skip
            cursor.execute(_FORCE_FAIL_SQL, [*params, *needs_runner_params()])
            row = cursor.fetchone()
            if row is not None:
                cursor.execute(_CLOSE_STEPS_SQL, [op.id])
        if row is None:
            return
        _recovery, error, epoch = row
        oplog.append(op.id, error, level="error", source="janitor", epoch=int(epoch))
        report.add(f"force-fail {op.id}")
        uploads.abort_for_op(
            ReshardOperation.objects.get(id=op.id),
            lambda level, message: oplog.append(
                op.id, message, level=level, source="janitor", epoch=int(epoch)
            ),
        )

    # --- step 7: reap -------------------------------------------------------------------------
    def _reap(self, report: TickReport) -> set[int] | None:
        """Reap finished runners; the op ids of the runner objects listed (None: no listing)."""
        launcher = self._launcher(settings.DUCKGRES_RESHARD_LAUNCHER)
        try:
            objects = launcher.list()
        except Exception as exc:  # noqa: BLE001
            _log.warning("janitor: listing runner objects failed: %s", exc)
            return None
        parsed: list[tuple[int, RunnerStatus]] = []
        for obj in objects:
            try:
                parsed.append((int(obj.op_id_label), obj.status))
            except ValueError:
                continue  # not ours to judge
        live = {op_id for op_id, _ in parsed}
        if not parsed:
            return live
        try:
            rows = {
                op.id: (op, bool(op.reap_due))
                for op in ReshardOperation.objects.filter(
                    id__in=[op_id for op_id, _ in parsed]
                ).annotate(
                    reap_due=RawSQL(
                        "(finished_at IS NOT NULL AND "
                        "finished_at < now() - make_interval(secs => %s))",
                        [int(settings.DUCKGRES_RESHARD_REAP_AFTER_SECONDS)],
                        output_field=BooleanField(),
                    )
                )
            }
        except DbError as exc:
            _log.warning("janitor: reading ops for the reap failed; keeping runners: %s", exc)
            return live
        for op_id, status in parsed:
            try:
                found = rows.get(op_id)
                op, due = found if found is not None else (None, False)
                self._reap_one(launcher, op_id, status, op, due, report)
            except _StopTick:
                raise
            except Exception:  # noqa: BLE001 - one runner's failure never stops the reap
                _log.exception("janitor: reaping runner of op %s failed; next", op_id)
        return live

    def _reap_one(
        self,
        launcher: Launcher,
        op_id: int,
        status: RunnerStatus,
        op: ReshardOperation | None,
        reap_due: bool,
        report: TickReport,
    ) -> None:
        name = runner_name(op_id)
        if op is None:
            if not status.exited:
                return  # running with no row: keep (never kill what we cannot judge)
            self._may_act()
            self._delete(launcher, op_id, f"reaping orphan runner {name} (no operation row)")
            report.add(f"reap-orphan {op_id}")
            return
        if op.state in ACTIVE_STATES:
            return
        if status.terminating:
            self._may_act()
            self._warn_terminating(op_id, status)
            self._delete(launcher, op_id, None)
            return
        if not (status.exited or reap_due):
            return  # running and only just terminal: its own exit path persists its log
        self._may_act()
        launcher.capture_log(op_id, status)
        oplog.append(
            op_id,
            f"reaping runner {name} (phase {status.phase}) of the {op.state} operation",
            source="janitor",
        )
        self._delete(launcher, op_id, None)
        report.add(f"reap {op_id}")

    @staticmethod
    def _delete(launcher: Launcher, op_id: int, message: str | None) -> None:
        if message:
            _log.info("janitor: %s", message)
        try:
            launcher.delete(op_id)
        except Exception as exc:  # noqa: BLE001 - delete errors are warnings
            _log.warning("janitor: deleting %s failed: %s", runner_name(op_id), exc)


def reconcile() -> TickReport:
    """One janitor tick with this process's lease (the Celery task calls this)."""
    return Janitor().reconcile()
