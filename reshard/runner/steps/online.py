"""The online mode's steps (docs/copy.md "Online copy", docs/runner.md "The online mode"):
``rendering_target`` and ``precopying`` before the block, ``catching_up`` under the fence,
``opening`` (the unblock on the target) and the online ``verifying`` and ``backup_catalog``.

Invariants:

- **The capture never outlives the operation.** ``capture_installed_at`` is recorded before the
  capture is installed (a crash in between still removes it) and ``capture_removed_at`` only
  after a removal. Every terminal path removes it: the catch-up on the way to success, the
  rollback (failure, cancel, a takeover that cannot resume) and ``reshard_recover`` (after a
  force-fail) through :func:`remove_capture`, which is idempotent.
- **A pre-copy restarts from a clean slate, decided by observation.** ``precopying`` removes a
  capture it finds on the source and drops the ``ducklake_*`` tables it finds on the target (the
  target is this operation's: claimed by ``rendering_target``) before it installs the capture
  and copies again, so a takeover's redo never mixes two pre-copies' rows or changes.
- **The target is written before the block only by this operation**, under the target copier's
  advisory lock, and the binding names the source until ``cutover``.
- **The catch-up applies every change the pre-copy did not see:** it runs only once the tenant
  is fenced (``fencing_source``: NOLOGIN, its sessions ended), takes the write fence, and reads
  the changes after the fence is up, applying them in one target transaction; the in-window
  check (snapshot, data files, metadata) runs before the flip. The capture is removed before
  any backup: in the catch-up when the backup runs before the flip, else after the unblock's
  comparison, right before the backup (out of the window).
- **With the backup after the unblock** (``backup_after_unblock``), ``opening`` unblocks the
  warehouse on the target and records ``target_opened_at`` in one transaction: the commit point.
  After it the source is never re-pointed, and it is dropped only once the whole-catalog
  comparison against the target's snapshot held from the flip passed and a backup is recorded;
  otherwise it is kept, fenced, and the operation ends ``failed`` with ``source_kept_reason``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from duckgres_admin.models import Warehouse
from reshard.engines import capture, testhooks, verify
from reshard.engines.copy import catalog as catalog_copy
from reshard.engines.copy import introspection
from reshard.engines.copy import online as online_copy
from reshard.engines.copy.base import CopyError
from reshard.runner import connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.hooks import StepHooks
from reshard.runner.steps import backup_catalog, cutover, preflight, record_source
from reshard.runner.steps.copying import release_handle
from reshard.runner.steps.finalize import COMPLETE_MESSAGE, restore_fields

MIN_SOURCE_VERSION = 130000  # pg_current_snapshot, pg_visible_in_snapshot and xid8
ROUND_ENOUGH_CHANGES = 200  # a round that applied at most this many ends the rounds
MAX_ROUNDS = 5
CAPTURE_SECONDS = 120.0  # how long a capture action is retried while tenants hold a table
CAPTURE_PAUSE_SECONDS = 0.05
PROGRESS_KEYS = ("tables_total", "tables_done", "rows_copied", "bytes_copied")


# --- before the block ---------------------------------------------------------------------------
def run_rendering_target(env: StepEnv) -> None:
    """The target store's preflight and identity checks, then the tenant rendered there (role
    LOGIN, database), recorded as this operation's; the binding still names the source. The
    source is recorded first (``recordSource``, again at the block): the pre-copy reads it."""
    record_source.run(env)
    preflight.run(env)
    cutover.render(env)
    env.log.info(
        f"target tenant rendered on store {env.op.to_shard} before the block (database "
        f"{env.op.target_database}); the binding still names the source"
    )


def _retrying(
    env: StepEnv, what: str, action: Callable[[int], Any], *, stoppable: bool = True
) -> Any:
    """Run ``action(wait_ms)`` (a resumable capture action that gives up on a table a tenant's
    transaction held for ``wait_ms``: ``capture.Busy``) until it is done, for at most
    CAPTURE_SECONDS, the wait growing with each busy attempt (``capture.lock_wait_ms``);
    between attempts the stop and the cancel are checked (``stoppable``; a rollback's removal
    is not: it is what a cancel or a stop asks for), and every tenth busy attempt is logged.
    Any other failure is final."""
    deadline = time.monotonic() + CAPTURE_SECONDS
    attempts = 0
    while True:
        attempts += 1
        try:
            result = action(capture.lock_wait_ms(attempts))
        except capture.Busy as exc:
            if time.monotonic() >= deadline:
                raise StepError(
                    f"{what}: the tenant's writes held a table for {CAPTURE_SECONDS:g} s "
                    f"({attempts} attempts; last: {exc})"
                ) from None
            if attempts % 10 == 1:
                env.log.info(f"{what}: attempt {attempts} found a table busy ({exc}); retrying")
            if stoppable and env.ctx.stop.is_set():
                raise Interrupted() from None
            if stoppable and waits.cancel_requested(env.op.id):
                raise Cancelled() from None
            time.sleep(CAPTURE_PAUSE_SECONDS)
            continue
        except capture.CaptureError as exc:
            raise StepError(f"{what} failed: {exc}") from None
        if attempts > 1:
            env.log.info(f"{what}: done at attempt {attempts} (the tenant's writes held a table)")
        return result


def _source_version(conn: connections.PgConn) -> int:
    return int(conn.info.server_version)


def run_precopying(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    source = connections.source_side(ctx, op)
    target = connections.target_side(ctx, op)
    preflight.check_target_identity(env)
    hooks = StepHooks(env, progress_keys=PROGRESS_KEYS)
    try:
        with source.connect(ctx) as conn, connections.registered(ctx, conn):
            version = _source_version(conn)
            if version < MIN_SOURCE_VERSION:
                raise StepError(
                    f"the source server is PostgreSQL {version // 10000}: the online copy's "
                    "capture needs 13 or newer; start the operation offline"
                )
            if capture.installed(conn):
                env.log.info("found a change capture of an earlier attempt: removing it first")
                _retrying(env, "removing the earlier capture", lambda ms: capture.remove(conn, ms))
        with target.connect(ctx) as conn, connections.registered(ctx, conn):
            dropped = catalog_copy.drop_ducklake_tables(conn, hooks)
        if dropped:
            env.log.info(f"dropped {len(dropped)} tables an earlier pre-copy left on the target")
        env.fence.update(capture_installed_at=Now(), capture_removed_at=None)
        with source.connect(ctx) as conn, connections.registered(ctx, conn):
            tables = introspection.discover_tables(conn)
            _retrying(env, "creating the change capture", lambda _: capture.create_schema(conn))
            _retrying(
                env,
                "installing the change capture",
                lambda ms: capture.add_triggers(conn, tables, ms),
            )
    except psycopg.Error as exc:
        raise StepError(f"preparing the pre-copy failed: {exc}") from None
    except CopyError as exc:
        raise StepError(str(exc)) from None
    env.log.info(f"change capture installed on {len(tables)} source tables")
    testhooks.kill_point("precopy:captured")
    ctx.precopied = _precopy(env, source, target)


def _precopy(
    env: StepEnv, source: connections.Side, target: connections.Side
) -> online_copy.Precopied:
    ctx = env.ctx
    with waits.cancel_watch(ctx, env.log, enabled=True) as cancelled:
        hooks = StepHooks(env, cancelled=cancelled, progress_keys=PROGRESS_KEYS)

        def src() -> connections.PgConn:
            return source.connect(ctx)

        def tgt() -> connections.PgConn:
            return target.connect(ctx)

        try:
            done = online_copy.precopy_catalog(
                src, tgt, hooks, parallelism=int(settings.DUCKGRES_RESHARD_COPY_PARALLELISM)
            )
            testhooks.kill_point("precopy:copied")
            for number in range(1, MAX_ROUNDS + 1):
                if cancelled.is_set() or ctx.stop.is_set():
                    break
                done = online_copy.advance(src, tgt, hooks, done)
                if done.last_round <= ROUND_ENOUGH_CHANGES:
                    env.log.info(f"catch-up round {number} applied {done.last_round} changes")
                    break
        except CopyError as exc:
            _raise_stopped(env, cancelled.is_set())
            raise StepError(str(exc)) from None
        _raise_stopped(env, cancelled.is_set())
    rows = sum(t.rows for t in done.tables)
    env.log.info(
        f"pre-copy done while the tenant ran: {len(done.tables)} tables, {rows} rows; the "
        "changes since are captured"
    )
    return done


def _raise_stopped(env: StepEnv, cancelled: bool) -> None:
    if env.ctx.stop.is_set():
        raise Interrupted() from None
    if cancelled:
        raise Cancelled() from None


# --- in the window --------------------------------------------------------------------------------
def run_catching_up(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    precopied: online_copy.Precopied | None = ctx.precopied
    if precopied is None:
        raise StepError("the pre-copy's marker is not held by this runner; cannot catch up")
    source = connections.source_side(ctx, op)
    target = connections.target_side(ctx, op)
    # With the backup after the unblock the capture is removed then, before the backup, out of
    # the window (the tenant is fenced: its triggers see no write); before the flip it must go
    # now, as the backup starts next.
    in_window = not op.backup_after_unblock
    if in_window:
        try:
            with source.connect(ctx) as conn, connections.registered(ctx, conn):
                _retrying(
                    env, "dropping the capture triggers", lambda _: capture.drop_triggers(conn)
                )
        except psycopg.Error as exc:
            raise StepError(f"cannot reach the source to end the capture: {exc}") from None
        testhooks.kill_point("catch_up:triggers_dropped")
    with waits.cancel_watch(ctx, env.log, enabled=True) as cancelled:
        hooks = StepHooks(env, cancelled=cancelled, progress_keys=PROGRESS_KEYS)
        try:
            caught = online_copy.catch_up(
                lambda: source.connect(ctx), lambda: target.connect(ctx), hooks, precopied
            )
        except CopyError as exc:
            _raise_stopped(env, cancelled.is_set())
            raise StepError(str(exc)) from None
    ctx.release_handle = caught.release
    testhooks.kill_point("catch_up:applied")
    if in_window:
        remove_capture(env, during_rollback=False)
    _check_caught_up(env, target)
    tables = [*precopied.tables, *caught.created]
    gone = set(caught.dropped)
    kept = [t for t in tables if t.name not in gone]
    env.fence.update(
        tables_copied=len(kept),
        rows_copied=sum(t.rows for t in kept) + caught.applied.total,
        bytes_copied=sum(t.bytes for t in kept),
    )
    op.refresh_from_db(fields=["tables_copied", "rows_copied", "bytes_copied"])
    ctx.progress.copied = bool(kept)


def _check_caught_up(env: StepEnv, target: connections.Side) -> None:
    """Before the flip: the target's DuckLake state (snapshot, data files, metadata) is the
    fenced source's (``reshard.engines.verify``)."""
    handle: Any = env.ctx.release_handle
    try:
        with target.connect(env.ctx) as conn, connections.registered(env.ctx, conn):
            result = verify.verify_ducklake(handle.connection, conn)
    except verify.VerifyError as exc:
        raise StepError(f"the catch-up left the target behind the source: {exc}") from None
    except psycopg.Error as exc:
        raise StepError(f"the catch-up check could not read the target: {exc}") from None
    env.log.info(f"catch-up checked before the flip: {result.message}")


def remove_capture(env: StepEnv, *, during_rollback: bool) -> bool:
    """Remove the change capture from the source when this operation installed it and did not
    remove it yet (idempotent). False (logged) only when it could not be removed."""
    op, ctx = env.op, env.ctx
    op.refresh_from_db(fields=["capture_installed_at", "capture_removed_at"])
    if op.capture_installed_at is None or op.capture_removed_at is not None:
        return True
    try:
        source = connections.source_side(ctx, op)
        with source.connect(ctx) as conn, connections.registered(ctx, conn):
            found = _retrying(
                env,
                "removing the change capture",
                lambda ms: capture.remove(conn, ms),
                stoppable=not during_rollback,
            )
    except (psycopg.Error, StepError, Cancelled, Interrupted) as exc:
        if not during_rollback:
            raise
        env.log.error(f"rollback: the change capture could not be removed from the source: {exc}")
        return False
    env.fence.update(capture_removed_at=Now())
    op.refresh_from_db(fields=["capture_removed_at"])
    prefix = "rollback: " if during_rollback else ""
    env.log.info(
        f"{prefix}change capture removed from the source database {op.source_database} "
        + ("(schema duckgres_capture and its triggers)" if found else "(nothing was left)")
    )
    return True


def run_cutover(env: StepEnv) -> None:
    """The rendered target: flip the binding and wait for its login (no render here)."""
    cutover.flip_cnpg(env)


def run_opening(env: StepEnv) -> None:
    """Hold the target's snapshot as it is at the flip, then unblock the warehouse on the
    target and record the commit point, in one transaction."""
    op, ctx = env.op, env.ctx
    target = connections.target_side(ctx, op)
    try:
        held = target.connect(ctx)
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        held.execute("SELECT 1 FROM pg_catalog.pg_class LIMIT 1")  # takes the snapshot
    except psycopg.Error as exc:
        raise StepError(f"cannot hold the target's snapshot at the flip: {exc}") from None
    ctx.flip_snapshot = held
    fields = restore_fields(op.id)
    with transaction.atomic():
        moved = Warehouse.objects.filter(org_id=op.org_id, state="resharding").update(
            state="ready", status_message=COMPLETE_MESSAGE, updated_at=Now(), **fields
        )
        if moved != 1:
            raise StepError("warehouse state mismatch: not resharding at the unblock")
        env.fence.update(target_opened_at=Now(), unblocked_at=Now())
    op.refresh_from_db(fields=["target_opened_at", "unblocked_at"])
    env.log.info(
        "warehouse unblocked on the target: the commit point (the verification and the backup "
        "of the fenced source follow, then its drop)"
    )


# --- after the flip ------------------------------------------------------------------------------
def run_verifying(env: StepEnv) -> None:
    """The whole catalog, row by row: the fenced source against the target as it was at the
    flip (the snapshot held by ``opening``; or, with the backup before the flip, the target
    itself, still blocked). A mismatch before the commit point fails the step (rollback); after
    it, the source is kept (:func:`keep_source_reason`)."""
    op, ctx = env.op, env.ctx
    handle: Any = ctx.release_handle
    held: Any = ctx.flip_snapshot
    if handle is None or handle.released:
        close_flip_snapshot(env)
        _keep_or_fail(env, "the fenced source's snapshot is gone; the comparison cannot run")
        return
    try:
        state = verify.read_state(handle.connection)
        if held is not None:
            result = verify.compare_tables(handle.connection, held)
        else:
            target = connections.target_side(ctx, op)
            with target.connect(ctx) as conn, connections.registered(ctx, conn):
                result = verify.compare_tables(handle.connection, conn)
    except psycopg.Error as exc:
        _keep_or_fail(env, f"the whole-catalog comparison could not run: {exc}")
        return
    finally:
        close_flip_snapshot(env)
    if result.differing:
        _keep_or_fail(env, result.message)
        return
    env.log.info(result.message)
    # What the backup of this fenced source holds: the restore test checks a restore against it.
    env.fence.update(catalog_fingerprint=verify.summary(state).fingerprint())
    backup_catalog.join_background(env)


def _keep_or_fail(env: StepEnv, why: str) -> None:
    if env.op.target_opened_at is None:
        raise StepError(why)
    env.log.error(f"{why}: the source is kept, fenced (its drop is skipped)")
    env.fence.update(source_kept_reason=why)
    env.op.source_kept_reason = why


def close_flip_snapshot(env: StepEnv) -> None:
    held: Any = env.ctx.flip_snapshot
    env.ctx.flip_snapshot = None
    if held is not None:
        with contextlib.suppress(psycopg.Error):
            held.close()


def run_backup_after_unblock(env: StepEnv) -> None:
    """The pre-flip backup of the fenced source, taken after the unblock; a failure keeps the
    source (a backup is what its drop waits for)."""
    env.ctx.backup_attempted = True
    # The capture goes first (a dump must not carry its triggers); its removal needs the write
    # fence's locks released. The source stays fenced: NOLOGIN, its sessions ended.
    release_handle(env)
    remove_capture(env, during_rollback=False)
    # Past the cancel cutoff: a late cancel must not kill the dump the source's drop waits for.
    backup_catalog.run_backup_step(env, cancel_aware=False)
    env.op.refresh_from_db(fields=["backup_s3_uri"])
    if not env.op.backup_s3_uri and not env.op.source_kept_reason:
        _keep_or_fail(env, "no backup of the fenced source was recorded")


def keep_source_reason(env: StepEnv) -> str:
    """'' when the source may be dropped; else why it is kept."""
    op = env.op
    op.refresh_from_db(fields=["source_kept_reason", "backup_s3_uri", "catalog_fingerprint"])
    if op.source_kept_reason:
        return op.source_kept_reason
    if op.catalog_fingerprint is None:
        return "the whole-catalog comparison did not pass in this run"
    if not op.backup_s3_uri:
        return "no backup of the fenced source was recorded"
    return ""
