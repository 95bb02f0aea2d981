"""Operator recovery of a force-failed reshard (spec reshard §4.16; safeguards 34 and 59).

``python manage.py reshard_recover <id> [--execute] [--force]`` is a thin wrapper over this
module.

- **Preconditions** (:func:`check_preconditions`): the op is ``failed`` with
  ``recovery_required``; no other op of the org is ``pending``/``running``; no runner object is
  left for the op (its launcher reports ``absent``). Otherwise :class:`RecoveryRefused` with
  what to do.
- **Plan** (:func:`describe`): the durable progress (state, step, error, milestones, counters),
  the binding, ``compaction_prior``, the source fence state read live from the source store
  with the provisioner credential, the backup URI, and the plan :func:`execute` would run.
- **Claim** (:func:`claim`): a CAS ``recovery_owner '' → me`` with ``recovery_claimed_at =
  now()``; a claim held by someone else is refused ("recovery already claimed by X at T");
  ``force`` takes it over only when ``recovery_claimed_at`` is older than 30 minutes (one
  guarded UPDATE on the old owner), after which the old owner's writes match zero rows.
- **Execute**: every write is guarded by ``id AND state='failed' AND recovery_owner=:me`` and
  refreshes ``recovery_claimed_at`` (:class:`RecoveryFencer`, the runner's ``Fencer`` with
  another guard), so the runner's rollback (§4.6) and roll-forward (§4.7) run unchanged: the
  transaction rule and the pre-statement check of §4.1 hold with this guard. A heartbeat thread
  refreshes the claim while long waits run. Op-log lines carry source ``recovery``. The end is
  one guarded UPDATE: ``recovered_at``, ``recovery_outcome``, ``recovery_required`` cleared
  unless ``left_blocked``, claim released. The op stays ``failed``: terminal ops are never
  revived.
- Owner identity: ``<user>@<host> pid <pid> <token>`` (or ``--as NAME`` + the pid and token),
  unique per invocation, so a takeover of one's own stale claim still fences the old process.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from duckgres_admin.base.scrub import Scrubber, process_scrubber
from duckgres_admin.base.times import rfc3339
from duckgres_admin.models import ACTIVE_STATES, ReshardOperation, Warehouse
from duckgres_admin.platform.names import MILESTONES, runner_name
from reshard.engines import uploads
from reshard.engines.restore.stream import login_role_name
from reshard.launchers import LauncherError, get_launcher
from reshard.launchers.base import runner_namespace
from reshard.operation import sequences
from reshard.runner import binding, connections
from reshard.runner.context import RunContext
from reshard.runner.env import StepEnv
from reshard.runner.errors import Fenced, StepError
from reshard.runner.execute import commit_point_passed, reconstruct
from reshard.runner.fencing import Fencer
from reshard.runner.heartbeat import Heartbeat
from reshard.runner.logwriter import OpLogWriter
from reshard.runner.rollback import target_known, target_where

TAKEOVER_MINUTES = 30
FENCED_MESSAGE = (
    "recovery fenced: another operator took the recovery claim over (--force); this run stops "
    "without further changes"
)


class RecoveryRefused(Exception):
    """The command must not run (or not go on): the message says why and what to do."""


def default_owner(name: str = "") -> str:
    who = name.strip() or f"{_login()}@{socket.gethostname()}"
    return f"{who} pid {os.getpid()} {secrets.token_hex(3)}"


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in a container
        return "operator"


# --- preconditions ------------------------------------------------------------------------------
def load(op_id: int) -> ReshardOperation:
    op = ReshardOperation.objects.filter(id=op_id).first()
    if op is None:
        raise RecoveryRefused(f"no such reshard operation {op_id}")
    return op


def check_preconditions(op_id: int) -> ReshardOperation:
    """§4.16 preconditions; :class:`RecoveryRefused` with operator instructions otherwise."""
    op = load(op_id)
    if op.state != "failed":
        if op.state in ACTIVE_STATES:
            hint = (
                "it is still active: the runner and the janitor own it (follow it with GET "
                f"/api/v1/reshards/{op.id}/log; cancel it with POST "
                f"/api/v1/reshards/{op.id}/cancel)"
            )
        else:
            hint = "only failed operations are recovered; terminal operations are never revived"
        raise RecoveryRefused(f"operation {op.id} is {op.state}: {hint}")
    if not op.recovery_required:
        done = (
            f" (recovered at {_ts(op.recovered_at)}, outcome {op.recovery_outcome})"
            if op.recovered_at
            else ""
        )
        raise RecoveryRefused(
            f"operation {op.id} does not require recovery (recovery_required is false){done}; "
            "nothing to do"
        )
    active = (
        ReshardOperation.objects.filter(org_id=op.org_id, state__in=ACTIVE_STATES)
        .exclude(id=op.id)
        .values_list("id", "state")
        .first()
    )
    if active is not None:
        raise RecoveryRefused(
            f"org {op.org_id} has an active reshard operation {active[0]} ({active[1]}): wait "
            f"for it to finish or cancel it (POST /api/v1/reshards/{active[0]}/cancel), then "
            "run reshard_recover again"
        )
    _check_no_runner_object(op)
    return op


def _check_no_runner_object(op: ReshardOperation) -> None:
    name = runner_name(op.id)
    try:
        status = get_launcher(op.launcher or None).get_phase(op.id)
    except (LauncherError, Exception) as exc:  # noqa: BLE001 - cannot prove absence: refuse
        raise RecoveryRefused(
            f"cannot check for a runner object of operation {op.id} ({op.launcher} launcher): "
            f"{exc}; make sure no runner {name} is left, then retry"
        ) from None
    if status.phase == "absent":
        return
    state = status.phase + (" (terminating)" if status.terminating else "")
    if op.launcher == "pod":
        namespace = runner_namespace() or "<runner namespace>"
        how = (
            f"delete it first: kubectl delete pod {name} -n {namespace} (after saving its log: "
            f"kubectl logs {name} -n {namespace})"
        )
    else:
        directory = settings.DUCKGRES_RESHARD_LOCAL_STATE_DIR
        how = (
            f"stop it first: kill the process whose pid is in {directory}/op-{op.id}.json "
            f"(its process group), then remove {directory}/op-{op.id}.json, op-{op.id}.exit and "
            f"op-{op.id}.log (the janitor's reap does this once the op has been terminal for "
            "DUCKGRES_RESHARD_REAP_AFTER_SECONDS)"
        )
    raise RecoveryRefused(f"a runner object {name} is still present (phase {state}): {how}")


# --- the printout -------------------------------------------------------------------------------
def _ts(value: Any) -> str:
    return rfc3339(value) if value is not None else "—"


def _binding_line(org_id: str) -> str:
    wh = Warehouse.objects.filter(org_id=org_id).first()
    if wh is None:
        return "binding: no warehouse row"
    if wh.metadata_store_kind == "cnpg":
        where = f"cnpg store {wh.metadata_store_id}"
    elif wh.metadata_store_kind == "external":
        where = f"external {wh.metadata_store_host}:{wh.metadata_store_port}"
    else:
        where = f"kind {wh.metadata_store_kind or '<empty>'}"
    return (
        f"binding: {where}, database {wh.metadata_store_database}, user "
        f"{wh.metadata_store_user} (warehouse state {wh.state}, compaction_enabled "
        f"{wh.compaction_enabled})"
    )


def fence_state(op: ReshardOperation, scrubber: Scrubber) -> str:
    """The source fence read live from the source store with the provisioner credential."""
    if op.source_kind != "cnpg":
        return "external source: never fenced (external stores are never modified)"
    ctx = RunContext(op_id=op.id, runner_id="reshard-recover", scrubber=scrubber)
    try:
        prov = connections.provisioner(ctx, op.from_shard)
        with connections.provisioner_conn(ctx, prov, connect_timeout=8) as conn:
            login = connections.role_state(conn, op.source_user)
            present = connections.database_exists(conn, op.source_database)
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename = %s",
                [op.source_database, op.source_user],
            ).fetchone()
            backends = int(str(row[0])) if row else 0
    except (StepError, Exception) as exc:  # noqa: BLE001 - reported, never fatal for the plan
        return scrubber.scrub(f"unreadable on store {op.from_shard}: {exc}")
    role = {None: "missing", True: "LOGIN (not fenced)", False: "NOLOGIN (fenced)"}[login]
    return (
        f"store {op.from_shard} (live): tenant role {op.source_user} {role}; database "
        f"{op.source_database} {'present' if present else 'missing'}; {backends} tenant "
        "backends"
    )


CAPTURE_ACTION = (
    "remove the online copy's change capture (schema duckgres_capture, its triggers on the "
    "tenant's tables) from {db} on source store {store}"
)


def plan(op: ReshardOperation) -> tuple[str, list[str]]:
    """(``rollback`` | ``roll_forward``, the actions in order)."""
    progress = reconstruct(op)
    if commit_point_passed(op):
        actions = []
        if op.capture_installed_at is not None and op.capture_removed_at is None:
            actions.append(CAPTURE_ACTION.format(db=op.source_database, store=op.from_shard))
        if op.source_kind == "cnpg" and op.source_dropped_at is None:
            actions.append(
                f"redo DROP DATABASE IF EXISTS {op.source_database} on source store "
                f"{op.from_shard} (source_dropped_at is not set)"
            )
        if op.in_place:
            actions.append(
                f"drop the restore's login role {login_role_name(op)} (NOLOGIN, its sessions "
                f"ended, what it owns handed to {op.target_user}), ALTER ROLE "
                f"{op.target_user} LOGIN on {op.to_shard}, then wait for a tenant SELECT 1 on "
                f"{op.target_database}"
            )
        actions.append(
            "unblock: warehouse resharding → ready (metadata-store reshard complete), "
            "restoring compaction_enabled from compaction_prior"
        )
        actions.append("record recovery_outcome rolled_forward (binding stays on the target)")
        return "roll_forward", actions
    actions = []
    written = sequences.at_or_past(
        op.step or "",
        sequences.first_target_write(op.copy_variant),
        op.target_kind,
        op.copy_variant,
    )
    if progress.flipped:
        actions.append("flip the binding back to the source (only to a usable source binding)")
    if op.in_place:
        actions.append(
            f"end the sessions of the restore's login role {login_role_name(op)}, drop the "
            f"sibling database {op.target_database} and the login role on {op.to_shard} (the "
            "database only if this operation claimed it before creating it, "
            f"{'claimed' if op.target_claimed_at else 'not claimed: it is kept'}; only "
            "if the binding names the source again and no other warehouse binds the sibling; "
            "if either is left, the warehouse stays resharding); the tenant role gets LOGIN "
            "only once the binding names the source"
        )
    elif written and op.target_claimed_at is None:
        actions.append(
            f"nothing is dropped on the target {target_where(op)}: this operation did not "
            "create it or adopt it empty (it may hold a stranger's tables)"
        )
    elif written:
        actions.append(
            f"drop every ducklake_* table the target {target_where(op)} holds when this runs "
            "(the operation created it or adopted it empty, so they are its own) "
            f"(re-read as the target tenant; the copy reached step {op.step}, and a copy killed "
            "part-way leaves tables its counter never recorded), only if the binding names the "
            "source; "
            "each dropped table is logged"
        )
    elif target_known(op):
        actions.append(f"nothing to drop on the target: the copy never started (step {op.step})")
    if op.target_kind == "cnpg" and op.target_rendered_at is not None and not op.in_place:
        actions.append(
            f"set the target tenant role {op.target_user} NOLOGIN on {op.to_shard} (only if "
            "it passes the tenant role identity check: never the provisioner or another "
            "warehouse's role)"
        )
    if op.capture_installed_at is not None and op.capture_removed_at is None:
        actions.append(CAPTURE_ACTION.format(db=op.source_database, store=op.from_shard))
    if progress.fence_requested:
        actions.append(
            f"un-fence: ALTER ROLE {op.source_user} LOGIN on {op.from_shard}, then wait for "
            "LOGIN, the database and a tenant SELECT 1 through the source tenant endpoint (only "
            "if the role passes the tenant role identity check; otherwise nothing is sent and "
            "the warehouse stays resharding)"
        )
    elif op.source_kind == "external" and progress.flipped:
        actions.append("wait for a tenant SELECT 1 on the external source")
    if progress.blocked:
        actions.append(
            "unblock: warehouse resharding → ready (metadata-store reshard rolled back)"
            + (
                ", restoring compaction_enabled from compaction_prior"
                if op.compaction_prior is not None
                else " (compaction was never paused)"
            )
        )
    actions.append(
        "record recovery_outcome rolled_back (left_blocked if any step above cannot be "
        "verified; the warehouse then stays resharding)"
    )
    return "rollback", actions


def describe(op: ReshardOperation) -> list[str]:
    """The dry-run printout (never a password)."""
    scrubber = process_scrubber()
    direction = f"{op.source_kind}_to_{op.target_kind}"
    source = (
        f"cnpg {op.from_shard}"
        if op.source_kind == "cnpg"
        else (f"external {op.source_endpoint}:{op.source_port}")
    )
    target = (
        f"cnpg {op.to_shard}"
        if op.target_kind == "cnpg"
        else (f"external {op.target_endpoint}:{op.target_port}")
    )
    lines = [
        f"operation {op.id}: org {op.org_id}: {source} → {target} ({direction})",
        f"state {op.state}; step {op.step or '<none>'}; error: {op.error or '<none>'}",
        f"recovery_required {op.recovery_required}; recovery claim: "
        + (
            f"{op.recovery_owner} at {_ts(op.recovery_claimed_at)}" if op.recovery_owner else "none"
        ),
        f"maintenance window: blocked_at {_ts(op.blocked_at)}, unblocked_at {_ts(op.unblocked_at)}",
        "milestones:",
        *(f"  {name}: {_ts(getattr(op, name))}" for name in MILESTONES),
        f"copied: {op.tables_copied} tables, {op.rows_copied} rows, {op.bytes_copied} bytes",
        "compaction_prior: "
        + (
            json.dumps(op.compaction_prior, sort_keys=True)
            if op.compaction_prior is not None
            else "NULL (never paused)"
        ),
        _binding_line(op.org_id) + f" — names {binding.named_side(op)}",
        f"source fence: {fence_state(op, scrubber)}",
        f"backup: {op.backup_s3_uri or '<none>'}"
        + (f" ({op.backup_bytes} bytes)" if op.backup_s3_uri else ""),
    ]
    if op.step and op.step not in sequences.ordering_list(op.target_kind, op.copy_variant):
        lines.append(f"note: step {op.step} is unknown to this build (treated as not reached)")
    kind, actions = plan(op)
    commit = "passed" if commit_point_passed(op) else "not passed"
    lines.append(f"plan ({kind.replace('_', '-')}; commit point {commit}):")
    lines.extend(f"  {n}. {a}" for n, a in enumerate(actions, 1))
    return [scrubber.scrub(line) for line in lines]


# --- claim --------------------------------------------------------------------------------------
def _claim_row(op_id: int) -> tuple[str, Any, float | None] | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT recovery_owner, recovery_claimed_at, "
            "EXTRACT(EPOCH FROM now() - recovery_claimed_at) "
            "FROM duckgres_reshard_operations WHERE id = %s",
            [op_id],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return str(row[0]), row[1], float(row[2]) if row[2] is not None else None


def claim(op_id: int, me: str, *, force: bool = False) -> str:
    """Take the recovery claim; returns the previous owner taken over ('' for a fresh claim)."""
    fresh = ReshardOperation.objects.filter(
        id=op_id, state="failed", recovery_required=True, recovery_owner=""
    ).update(recovery_owner=me, recovery_claimed_at=Now())
    if fresh == 1:
        return ""
    row = _claim_row(op_id)
    if row is None:
        raise RecoveryRefused(f"no such reshard operation {op_id}")
    owner, claimed_at, age = row
    if not owner:
        raise RecoveryRefused(
            f"operation {op_id} changed while claiming (no longer failed with "
            "recovery_required?); run reshard_recover again to see its state"
        )
    held = f"recovery already claimed by {owner} at {_ts(claimed_at)}"
    if not force:
        raise RecoveryRefused(
            f"{held}; if that recovery died, --force takes the claim over once it is older "
            f"than {TAKEOVER_MINUTES} minutes"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET recovery_owner = %s, "
            "recovery_claimed_at = now() WHERE id = %s AND state = 'failed' "
            "AND recovery_owner = %s "
            "AND recovery_claimed_at < now() - make_interval(mins => %s)",
            [me, op_id, owner, TAKEOVER_MINUTES],
        )
        taken = cursor.rowcount
    if taken != 1:
        minutes = f"{age / 60:.0f}" if age is not None else "?"
        raise RecoveryRefused(
            f"{held}; --force takes over only a claim older than {TAKEOVER_MINUTES} minutes "
            f"(this one was claimed or refreshed {minutes} minutes ago)"
        )
    return owner


class RecoveryFencer(Fencer):
    """The runner's fenced writer under the recovery guard (§4.16)."""

    def __init__(self, ctx: RunContext, owner: str) -> None:
        super().__init__(ctx)
        self.owner = owner

    def _guarded(self) -> Any:
        return ReshardOperation.objects.filter(
            id=self.ctx.op_id, state="failed", recovery_owner=self.owner
        )

    def _touch(self) -> dict[str, Any]:
        return {"recovery_claimed_at": Now()}


class _ClaimRefresher(Heartbeat):
    """Refreshes ``recovery_claimed_at`` during long waits; a lost claim fences the run."""

    def tick(self) -> None:
        try:
            self.beat()
        except Fenced:
            if self.ctx.mark_fenced():
                self.oplog.error(FENCED_MESSAGE)
        except Exception as exc:  # noqa: BLE001 - transient: retried on the next tick
            self.oplog.warn(f"recovery claim refresh failed (will retry): {exc}")
            with contextlib.suppress(Exception):
                connection.close()

    def check_self_fence(self) -> None:
        age = self.ctx.seconds_since_write()
        if age > self.self_fence_after and not self.ctx.fenced and self.ctx.mark_fenced():
            self.oplog.error(
                f"recovery self-fenced: the claim could not be refreshed for {int(age)} s; "
                "stopping without further changes"
            )


@dataclass(frozen=True)
class RecoveryResult:
    outcome: str  # rolled_back | rolled_forward | left_blocked
    reason: str = ""


def execute(
    op_id: int,
    me: str,
    *,
    force: bool = False,
    echo: Callable[[str], None] = lambda _line: None,
) -> RecoveryResult:
    """Claim, then roll back or forward from the durable progress, then record the outcome.

    Raises :class:`RecoveryRefused` (nothing done) or :class:`Fenced` (claim lost mid-way)."""
    op = check_preconditions(op_id)
    previous = claim(op_id, me, force=force)
    scrubber = process_scrubber()
    log = OpLogWriter(op_id, scrubber, source="recovery")
    log.bind(org_id=op.org_id, recovery_owner=me)
    ctx = RunContext(op_id=op_id, runner_id=me, scrubber=scrubber)
    fencer = RecoveryFencer(ctx, me)
    refresher = _ClaimRefresher(ctx, log, fencer.heartbeat)
    try:
        op.refresh_from_db()
        taken = f" (taken over from {previous} with --force)" if previous else ""
        _say(log, echo, "info", f"recovery claimed by {me}{taken}")
        ctx.progress = reconstruct(op)
        if op.target_kind == "external" and op.target_password_secret_ref:
            # The runner had it from the stash; its reference holds the same value (checked at
            # submit). Best effort: without it the external partial tables are left in place.
            with contextlib.suppress(StepError):
                ctx.set_target_password(
                    connections.resolve_secret(
                        ctx, op.target_password_secret_ref, "the target tenant password"
                    )
                )
        env = StepEnv(ctx=ctx, op=op, fence=fencer, log=log)
        refresher.start()
        result = _run(env, log, echo)
        refresher.stop()
        if ctx.fenced:
            raise Fenced(FENCED_MESSAGE)
        _record(fencer, result)
        _say(
            log,
            echo,
            "error" if result.outcome == "left_blocked" else "info",
            f"recovery finished: outcome {result.outcome}"
            + (f" ({result.reason})" if result.reason else "")
            + "; claim released; the operation stays failed",
        )
        return result
    except Fenced:
        refresher.stop()
        if ctx.mark_fenced():
            log.error(FENCED_MESSAGE)
        echo(FENCED_MESSAGE)
        raise
    except BaseException as exc:
        refresher.stop()
        _release(fencer)
        _say(
            log,
            echo,
            "error",
            f"recovery stopped by an error: {type(exc).__name__}: {exc}; the claim is released "
            "and nothing further was recorded — fix the cause and run reshard_recover again",
        )
        raise
    finally:
        refresher.stop()
        log.flush()
        log.close()
        ctx.wipe_passwords()


def _say(log: OpLogWriter, echo: Callable[[str], None], level: str, message: str) -> None:
    log.append(level, message)
    echo(log.scrubber.scrub(message))


def _run(env: StepEnv, log: OpLogWriter, echo: Callable[[str], None]) -> RecoveryResult:
    from reshard.runner import rollback as rb

    op = env.op
    kind, actions = plan(op)
    for n, action in enumerate(actions, 1):
        _say(log, echo, "info", f"recovery plan {n}. {action}")
    if kind == "roll_forward":
        _say(log, echo, "info", "commit point passed: rolling forward (never re-pointing)")
        rb.roll_forward(env, rb.unblock_completed)
        uploads.abort_for_op(op, log.append)
        return RecoveryResult("rolled_forward")
    _say(log, echo, "info", "commit point not passed: rolling back from durable progress")
    outcome = rb.rollback(env)
    if outcome.recovery_required:  # blocked, or the online copy's capture is left
        return RecoveryResult("left_blocked", outcome.reason)
    return RecoveryResult("rolled_back", outcome.reason)


def _record(fencer: RecoveryFencer, result: RecoveryResult) -> None:
    """One guarded UPDATE: outcome, ``recovered_at``, ``recovery_required``, claim released."""
    fencer.update(
        recovered_at=Now(),
        recovery_outcome=result.outcome,
        recovery_required=result.outcome == "left_blocked",
        recovery_owner="",
        recovery_claimed_at=None,
    )


def _release(fencer: RecoveryFencer) -> None:
    """Release our claim after an unexpected error (guarded: never someone else's claim)."""
    with contextlib.suppress(Exception):
        ReshardOperation.objects.filter(
            id=fencer.ctx.op_id, state="failed", recovery_owner=fencer.owner
        ).update(recovery_owner="", recovery_claimed_at=None)
