"""The runner's top level: process flow (spec reshard §4.2), ``execute`` and ``run`` (§4.3).

Exit codes of :func:`run_process`: 0 whenever the op is terminal at exit (succeeded, failed
after rollback, cancelled, already terminal); 1 for infrastructure problems (op unreadable,
not claimable, fenced away, terminal write failed, roll-forward not possible).

Takeover rules (:func:`_takeover`, §4.8; a runner claiming an op whose ``step`` is stamped), in
this order:

1. A pending cancel before the cutoff is honoured first (``_boundary``): rollback, ``cancelled``.
2. A commit point passed (``source_drop_committed_at`` / ``external_verified_at``): roll forward;
   the source is never re-pointed.
3. Before the point of no return (safeguard reshard-73): a step of :func:`redoable_steps` (→cnpg:
   every step before ``cutover``; cnpg→external: every step before ``orphaning_source``) is
   redone: the whole sequence runs again **from its start** (``blocking``), never from the
   stamped step. Only when a fresh read shows the redo cannot act on anything but the op's own
   earlier effects: the binding still names the source, the op never unblocked the warehouse,
   the warehouse is ``resharding`` whenever ``blocked_at`` is set, nothing was rendered on a
   cnpg target, and for cnpg→external the runner holds the pulled target password (the copy
   needs it; the API hands it out once, so a relaunched runner holds it only when no earlier
   runner pulled it: a cnpg→external takeover after a pull rolls back, saying the password is
   gone, safeguard reshard-79). Otherwise it rolls back and fails ("cannot be resumed safely").
   Each redone step
   tolerates its own earlier partial effect under the op's fence: the block accepts
   ``resharding`` only when this op's ``blocked_at`` is set, access accepts a NOLOGIN tenant
   only when this op's ``source_fence_requested_at`` is set, the compaction pause keeps the
   first recorded prior (``COALESCE``), the fence re-sends ``NOLOGIN``, the drain waits again,
   the backup starts from scratch (aborting the earlier attempt's open uploads) and the
   cnpg→external copy drops each target table before re-creating it. The respawn budget is the
   janitor's (``respawn_attempts``); the runner adds none.
4. cnpg→cnpg at ``copying``/``verifying`` (flip still standing): resume at ``copying`` from the
   durable source fields; at ``cleaning_up``/``finalizing`` without the commit point: finalize
   without dropping.
5. Anything else: rollback, ``failed`` ("cannot be resumed safely").
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

import structlog
from django.conf import settings
from django.db import DatabaseError, connection

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines import testhooks
from reshard.operation import sequences
from reshard.runner import binding, waits
from reshard.runner.context import Progress, RunContext
from reshard.runner.errors import (
    Cancelled,
    Fenced,
    Interrupted,
    StepError,
    StepUnavailable,
)
from reshard.runner.fencing import Fencer, claim
from reshard.runner.heartbeat import Heartbeat, log_fenced_once
from reshard.runner.kind import kind_of
from reshard.runner.logwriter import OpLogWriter
from reshard.runner.password import (
    PasswordPullError,
    PullRequest,
    pull_password,
    read_pod_token,
    take_inherited_credential,
)
from reshard.runner.report import describe_source, describe_target, write_report
from reshard.runner.rollback import roll_forward, rollback
from reshard.runner.steps import StepEnv, backup_catalog, finalize, online

EXIT_OK = 0
EXIT_INFRA = 1
# For the log line only: ``reshard.control.janitor.MAX_RESPAWNS`` (not imported, the runner never
# loads the janitor); the janitor alone enforces the budget.
RESPAWN_BUDGET = 3

_plog: Any = structlog.get_logger("duckgres.reshard.runner")


def runner_identity() -> str:
    """``POD_NAME`` → hostname → ``reshard-runner`` (spec §4.2 step 2)."""
    return os.environ.get("POD_NAME") or socket.gethostname() or "reshard-runner"


def reconstruct(op: ReshardOperation) -> Progress:
    """Progress flags from the durable row (spec §4.8); over-marking is safe."""
    target, variant = op.target_kind, op.copy_variant
    return Progress(
        # The online steps before the block (the render, the pre-copy) block nothing.
        blocked=op.blocked_at is not None
        or sequences.at_or_past(op.step, "blocking", target, variant),
        source_access_verified=op.source_access_verified_at is not None,
        fence_requested=op.source_kind == "cnpg"
        and (
            op.source_fence_requested_at is not None
            or sequences.at_or_past(op.step, "fencing_source", target, variant)
        ),
        compaction_paused=op.compaction_prior is not None,
        flipped=sequences.at_or_past(op.step, "cutover", target, variant),
        copied=op.tables_copied > 0,
    )


def commit_point_passed(op: ReshardOperation) -> bool:
    return kind_of(op).commit_point_passed(op)


def before_cancel_cutoff(op: ReshardOperation) -> bool:
    """§4.5, per kind (``Kind.cancel_cutoff``): →cnpg until the cutover wait succeeded;
    →external until ``orphaning_source``; a restore, in place or onto another store, until
    ``cleaning_up`` (its commit point: nothing before is irreversible)."""
    return sequences.before_cutoff(
        kind_of(op).cancel_cutoff(op.target_kind),
        op.step,
        op.target_kind,
        op.target_login_ready_at is not None,
        op.copy_variant,
    )


# --- process -------------------------------------------------------------------------------------
def run_process(op_id: int, ctx: RunContext) -> int:
    """§4.2 steps 2-5. Always flushes the op log and writes the marker; wipes passwords."""
    # A local runner's one-time pull credential: read from its pipe before anything else, then
    # held in memory only (and scrubbed from every line), never in the environment.
    credential = take_inherited_credential()
    if credential:
        ctx.scrubber.add(credential)
    oplog = OpLogWriter(op_id, ctx.scrubber)
    oplog.bind(runner_id=ctx.runner_id)
    # Uncaught exceptions of any thread reach the op log and stderr scrubbed, never raw.
    oplog.install_excepthooks()
    op: ReshardOperation | None = None
    marker_epoch = 0
    try:
        try:
            op = ReshardOperation.objects.get(id=op_id)
        except ReshardOperation.DoesNotExist:
            _plog.error("reshard operation not found", op_id=op_id)
            return EXIT_INFRA
        except DatabaseError as exc:
            _plog.error(
                "cannot read the reshard operation",
                op_id=op_id,
                error=ctx.scrubber.scrub(str(exc)),
            )
            return EXIT_INFRA
        oplog.bind(org_id=op.org_id)
        marker_epoch = op.runner_epoch
        if op.is_terminal:
            oplog.info(f"runner started for an operation already {op.state}; nothing to do")
            return EXIT_OK
        try:
            sent_at = time.monotonic()  # the self-fence clock counts from when the claim was sent
            epoch = claim(op_id, ctx.runner_id, pod_uid=os.environ.get("POD_UID", ""))
        except DatabaseError as exc:
            oplog.error(f"claiming the operation failed: {exc}")
            return EXIT_INFRA
        if epoch is None:
            current = ReshardOperation.objects.filter(id=op_id).first()
            owner = current.runner_id if current else op.runner_id
            oplog.error(
                f"operation not claimable (owned by {owner or 'nobody'} with a fresh heartbeat?"
                f" state {current.state if current else 'gone'}); this runner exits"
            )
            return EXIT_INFRA
        ctx.epoch = marker_epoch = epoch
        ctx.note_write(sent_at)
        oplog.bind(epoch=epoch)
        op.refresh_from_db()
        env = StepEnv(ctx=ctx, op=op, fence=Fencer(ctx), log=oplog)
        # The heartbeat proves ownership from the claim on, the password pull included.
        heartbeat = Heartbeat(ctx, oplog, env.fence.heartbeat)
        env.heartbeat = heartbeat
        heartbeat.start()
        try:
            _maybe_pull_password(env, credential)
            credential = ""
            execute(env)
        finally:
            heartbeat.stop()
        return _exit_code(op_id, oplog)
    finally:
        if op is not None:
            oplog.persist_marker(
                os.environ.get("POD_NAME", ""), os.environ.get("POD_UID", ""), marker_epoch
            )
        oplog.close()
        ctx.wipe_passwords()


def _maybe_pull_password(env: StepEnv, credential: str = "") -> None:
    """Pull once, right after the claim (safeguard reshard-79): a local runner presents the
    credential of its pipe, a runner pod its projected token (read now: the kubelet rotates
    it). The API hands the password out once, so a relaunched runner's pull is a 404."""
    url = os.environ.get("DUCKGRES_RESHARD_PASSWORD_URL", "")
    if not url:
        return
    if not credential:
        credential = read_pod_token()
        if credential:
            env.ctx.scrubber.add(credential)
    request = PullRequest(
        url=url,
        runner_secret=settings.DUCKGRES_RUNNER_SECRET,
        epoch=env.ctx.epoch,
        runner_id=env.ctx.runner_id,
        credential=credential,
    )
    try:
        value = pull_password(request, env.ctx.stop)
    except PasswordPullError as exc:
        env.log.warn(
            f"could not pull the external target password: {exc}; continuing (the operation "
            "will fail at copying if it needs it)"
        )
        return
    env.ctx.set_target_password(value)
    env.log.info("pulled the ephemeral external target password")


def _exit_code(op_id: int, oplog: OpLogWriter) -> int:
    try:
        state = ReshardOperation.objects.filter(id=op_id).values_list("state", flat=True).first()
    except DatabaseError as exc:
        oplog.error(f"cannot re-read the operation at exit: {exc}")
        return EXIT_INFRA
    if state in ("succeeded", "failed", "cancelled"):
        return EXIT_OK
    oplog.error(
        f"runner exits with the operation still {state}: it did not reach a terminal state "
        "(fenced away by a takeover?)"
    )
    return EXIT_INFRA


# --- execute and run ------------------------------------------------------------------------------
def execute(env: StepEnv) -> None:
    """§4.3 ``execute``; the caller runs the heartbeat thread around it."""
    ctx, op = env.ctx, env.op
    try:
        kind_of(op)
    except LookupError as exc:
        _refuse_unknown_kind(env, str(exc))
        return
    ctx.progress = reconstruct(op)
    env.log.info(
        f"operation claimed by {ctx.runner_id} (epoch {ctx.epoch}): "
        f"{describe_source(op)} → {describe_target(op)}"
    )
    with contextlib.suppress(DatabaseError):
        connection.ensure_connection()
        if connection.connection is not None:
            ctx.register_connection(connection.connection)
    try:
        _execute(env)
    finally:
        backup_catalog.abandon(env, "the run ended before the backup was joined")
        online.close_flip_snapshot(env)


def _refuse_unknown_kind(env: StepEnv, why: str) -> None:
    """An operation of a kind this build does not know (a newer release's): nothing of it is
    run or rolled back here — what its steps mean is unknown — and it fails saying so; a
    stamped step or a block means an earlier runner acted, and ``reshard_recover`` decides."""
    op, log = env.op, env.log
    acted = bool(op.step) or op.blocked_at is not None
    error = f"{why}: this runner cannot run the operation and touched nothing"
    log.error(error + ("; an earlier runner acted on it: run reshard_recover" if acted else ""))
    if env.heartbeat is not None:
        env.heartbeat.stop()
    try:
        env.fence.terminal("failed", error, recovery_required=acted)
    except Fenced as exc:
        log_fenced_once(env.ctx, log, str(exc))
    except DatabaseError as exc:
        log.error(f"terminal write failed: {exc}; the operation stays running")


def _execute(env: StepEnv) -> None:
    ctx, log = env.ctx, env.log
    unavailable = False
    try:
        run(env)
        return
    except Fenced as exc:
        log_fenced_once(ctx, log, str(exc))
        return
    except Cancelled:
        if ctx.fenced:
            log_fenced_once(ctx, log)
            return
        state, error = "cancelled", "cancelled by operator"
        log.warn(f"cancel requested — rolling back from step {ctx.current_step or '(none)'}")
    except Interrupted:
        if ctx.fenced:
            log_fenced_once(ctx, log)
            return
        step = ctx.current_step or "(before the first step)"
        state, error = (
            "failed",
            f"runner received {ctx.signal_name or 'SIGTERM'} during step {step}",
        )
        log.error(f"step {step} failed: {error} — rolling back")
    except Exception as exc:  # noqa: BLE001 - any step failure rolls back (spec §4.3)
        if ctx.fenced:
            log_fenced_once(ctx, log)
            return
        state = "failed"
        error = str(exc) if isinstance(exc, StepError) else f"{type(exc).__name__}: {exc}"
        if _past_commit_point(env):
            log.error(f"step {ctx.current_step or '(none)'} failed: {error}")
            _roll_forward_after_error(env)
            return
        log.error(f"step {ctx.current_step or '(none)'} failed: {error} — rolling back")
        unavailable = isinstance(exc, StepUnavailable)
    if _past_commit_point(env):
        _roll_forward_after_error(env)
        return
    _roll_back_and_finish(env, state, error, unavailable=unavailable)


def _past_commit_point(env: StepEnv) -> bool:
    try:
        env.op.refresh_from_db(
            fields=["source_drop_committed_at", "external_verified_at", "target_opened_at"]
        )
    except DatabaseError:
        return env.op.source_drop_committed_at is not None or (
            env.op.external_verified_at is not None
        )
    return commit_point_passed(env.op)


def _finalize_rolled_forward(env: StepEnv) -> None:
    """The roll-forward's finish: ``finalizing`` is stamped like any step first, so an operation
    that succeeded this way does not keep the step it was taken over in (e.g. ``cleaning_up``)."""
    env.fence.stamp_step("finalizing")
    env.op.step = "finalizing"
    finalize.run(env)


def _roll_forward_after_error(env: StepEnv) -> None:
    """§4.3: after a commit point never roll back; roll forward, no terminal write of our own."""
    ctx, log = env.ctx, env.log
    log.error("refusing rollback; retrying cleanup/finalization")
    try:
        roll_forward(env, _finalize_rolled_forward)
    except Fenced as exc:
        log_fenced_once(ctx, log, str(exc))
    except Exception as exc:  # noqa: BLE001 - the op stays running for a relaunch
        log.error(
            f"roll-forward failed: {exc}; the operation stays running with the warehouse "
            "resharding — the janitor relaunches a runner after the stale window"
        )


def _roll_back_and_finish(env: StepEnv, state: str, error: str, *, unavailable: bool) -> None:
    ctx, log = env.ctx, env.log
    backup_catalog.abandon(env, "rolling back")
    try:
        outcome = rollback(env)
    except Fenced as exc:
        log_fenced_once(ctx, log, str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - a store error leaves the op to a takeover
        log.error(
            f"rollback failed: {type(exc).__name__}: {exc}; the operation stays running and "
            "a takeover runner will roll it back"
        )
        return
    if ctx.fenced:
        log_fenced_once(ctx, log)
        return
    if unavailable and outcome.recovered:
        error = f"{error}; the operation was rolled back"
    try:
        write_report(env, state)
    except DatabaseError as exc:
        log.warn(f"could not write the end-of-op report: {exc}")
    if env.heartbeat is not None:
        env.heartbeat.stop()
    try:
        env.fence.terminal(state, error, recovery_required=outcome.recovery_required)
    except Fenced as exc:
        log_fenced_once(ctx, log, str(exc))
        return
    except DatabaseError as exc:
        log.error(f"terminal write failed: {exc}; the operation stays running")
        return
    log.info(f"operation {state}: {error}")


def _boundary(env: StepEnv) -> None:
    """Checks made before stamping each step (and at the start of ``run``)."""
    ctx, op = env.ctx, env.op
    if ctx.fenced:
        raise Fenced()
    if ctx.stop.is_set():
        raise Interrupted()
    if waits.cancel_requested(op.id):
        if before_cancel_cutoff(op):
            raise Cancelled()
        if not ctx.late_cancel_logged:
            env.log.warn(
                "cancel requested after the point of no return; the operation will complete"
            )
            ctx.late_cancel_logged = True


def run(env: StepEnv) -> None:
    ctx, op = env.ctx, env.op
    _boundary(env)
    if op.step:
        ctx.current_step = op.step
        _takeover(env)
        return
    _run_steps(env, kind_of(op).sequence(op.source_kind, op.target_kind))


def _run_steps(env: StepEnv, steps: tuple[str, ...]) -> None:
    for step in steps:
        _boundary(env)
        env.fence.stamp_step(step)
        env.op.step = step  # the cancel cutoff reads the in-memory op (§4.5)
        testhooks.kill_point(f"step:{step}")
        fn = kind_of(env.op).step(step)
        if fn is None:
            raise StepUnavailable(step)
        fn(env)
    if not env.ctx.finalized:
        raise StepError("the step sequence ended without finalizing")


def redoable_steps(op: ReshardOperation) -> tuple[str, ...]:
    """The steps a takeover redoes from the start (safeguard reshard-73): those before the
    binding can switch and before anything irreversible (→cnpg: before ``cutover``;
    cnpg→external: before ``orphaning_source``, its cancel cutoff; per ``Kind``)."""
    return kind_of(op).redoable_steps(op.source_kind, op.target_kind)


def _redo_refusal(env: StepEnv) -> str:
    """'' when a takeover may redo the pre-cutover steps from the start; else why not.

    Fresh reads only: the op row, the binding and the warehouse state."""
    op, ctx = env.op, env.ctx
    op.refresh_from_db()
    if commit_point_passed(op):
        return "a commit point was passed"
    if op.unblocked_at is not None:
        return "this operation already unblocked the warehouse (a rollback was under way)"
    if op.target_login_ready_at is not None or (
        op.target_rendered_at is not None and not kind_of(op).renders_before_block
    ):
        return "the target tenant was already rendered"
    if not binding.names_source(op):
        return f"the binding no longer names the source ({binding.describe(op.org_id)})"
    state = Warehouse.objects.filter(org_id=op.org_id).values_list("state", flat=True).first()
    if op.blocked_at is not None and state != "resharding":
        return f"the warehouse is {state or 'gone'}, no longer blocked by this operation"
    if op.target_kind == "external" and not ctx.target_password:
        return (
            "the external target password is gone: the API hands it out once, to the first "
            "runner's pull, and this relaunched runner could not pull it again (safeguard "
            "reshard-79); the operation is rolled back — start it again"
        )
    return ""


def _redo(env: StepEnv, step: str) -> bool:
    """Redo the sequence from its start when :func:`_redo_refusal` allows it (False: refused,
    logged; the caller rolls back)."""
    op, log = env.op, env.log
    refusal = _redo_refusal(env)
    full = kind_of(op).sequence(op.source_kind, op.target_kind)
    if refusal:
        log.warn(f"takeover at step {step} (before the cutover): not redoing the steps: {refusal}")
        return False
    log.info(
        f"takeover at step {step} (before the cutover): redoing the steps from {full[0]} "
        f"(attempt {op.respawn_attempts} of the respawn budget of {RESPAWN_BUDGET}; the "
        "binding still names the source)"
    )
    _run_steps(env, full)
    return True


def _takeover(env: StepEnv) -> None:
    """§4.8 per direction (progress was reconstructed from the row by ``execute``); the rules
    are in the module docstring."""
    op, log = env.op, env.log
    step = op.step
    if commit_point_passed(op):
        log.info(
            f"takeover at step {step} after the commit point: rolling forward from the durable "
            "source fields (the source is never re-pointed)"
        )
        roll_forward(env, _finalize_rolled_forward)
        return
    unsafe = StepError(
        f"takeover at step {step} cannot be resumed safely; rolling back from durable progress"
    )
    if step in redoable_steps(op):
        if _redo(env, step):
            return
        raise unsafe
    if op.source_kind == "external" or op.target_kind == "external":
        raise unsafe
    kind = kind_of(op)
    full = kind.sequence(op.source_kind, op.target_kind)
    if step in ("copying", "verifying", "cleaning_up", "finalizing"):
        # Resume forward only while the flip still stands: a rollback that already re-pointed
        # the binding at the source (and maybe unblocked) leaves ``step`` unchanged, and
        # resuming then would copy from, and drop, the catalog the binding names.
        op.refresh_from_db(fields=["unblocked_at"])
        if op.unblocked_at is not None or not binding.names_cnpg_target(op):
            log.warn(
                f"takeover at step {step}: the binding no longer names the target "
                f"({binding.describe(op.org_id)}) or the warehouse was unblocked; not resuming"
            )
            raise unsafe
    if step in ("copying", "verifying") and "copying" in full:
        if not (op.source_endpoint and op.source_user and op.source_database):
            raise StepError(
                f"takeover at step {step}: the durable source endpoint, user or database is "
                "empty; refusing to guess the source (recordSource is never re-run after cutover)"
            )
        log.info(
            f"takeover at step {step}: resuming at copying from the durable source fields "
            f"({op.source_endpoint}:{op.source_port}/{op.source_database}); the binding names "
            "the target"
        )
        _run_steps(env, full[full.index("copying") :])
        return
    if step == "cleaning_up" and kind.reruns_cleanup_on_takeover:
        # E.g. an in-place restore: before its commit point the tenant role is still NOLOGIN,
        # and finalizing alone would unblock a warehouse nobody can log in to. The cleanup is
        # idempotent: run it again.
        log.info(f"takeover at step cleaning_up of an {kind.label}: running it again")
        _run_steps(env, full[full.index("cleaning_up") :])
        return
    if step in ("cleaning_up", "finalizing"):
        log.error(
            f"source database {op.source_database} on store {op.from_shard} was not dropped; "
            "drop it manually"
        )
        _run_steps(env, ("finalizing",))
        return
    raise unsafe
