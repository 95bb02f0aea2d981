"""A restore's ``copying`` and ``verifying`` (docs/restore.md): the backup object instead of the
live source.

A restore operation (``kind`` ``restore``) walks the same steps as a reshard to a cnpg store:
the block, the drain, the fence, the backup of the catalog it is about to replace (mandatory
here), the cutover that renders the tenant's role and an empty database on the target store
and points the binding there, then — in place of the copy — this module, then the cleanup
(the replaced catalog's drop, after its backup) and the unblock. Keeping the step names keeps
every rule that reads them (cancel cutoff, rollback, takeover, recovery) exactly the reshard's.

Invariants:

- **Only the org's own backup, exactly as recorded.** The key was checked at the start against
  the warehouse's listing (``reshard.backups.inventory.belonging``: only objects their operation
  wrote and recorded), and its bucket, ETag, SHA-256, size and VersionId copied onto the operation;
  here it is read from that bucket only while it is still the warehouse's ``data_bucket``,
  that version only, only while its ETag is the recorded one (``IfMatch``), and its digest and
  size are checked while it streams, the archive's last chunk held back until they match
  (``reshard.engines.restore.stream.Expected``): an object replaced since is refused, naming both
  digests.
- **Into the target the cutover made, as the tenant.** ``pg_restore`` logs in as the tenant role
  on the target store (``connections.target_side``), with ``--no-owner --no-acl``: every object
  belongs to the tenant, and nothing outside its own database is touched. The copy's one-writer
  advisory lock on the target is held for the whole restore.
- **Idempotent.** ``--clean --if-exists`` drops what an interrupted attempt left before it
  creates anything, so a takeover simply restores again — after it ended any ``pg_restore``
  session an earlier runner left on the target (a killed runner's child runs its current
  statement on, in the local launcher), so two restores never interleave.
- **Interruptible.** A stop kills ``pg_restore`` (a registered child) and the step ends
  :class:`Interrupted`; the step's deadline bounds it. The runner's death closes the pipe, and
  ``pg_restore`` ends on the truncated archive.
- **Where it writes is the kind's** (:class:`RestoreTarget`, bound by ``reshard.kinds``):
  onto another store, :data:`OTHER_STORE`; in place, ``inplace.RESTORE_TARGET`` — the sibling
  database, reached as the operation's login role with ``SET ROLE`` tenant (the tenant role
  itself stays NOLOGIN), and a cancel kills ``pg_restore``. This module never asks which.
- **Verified before anything irreversible.** ``verifying`` compares the restored DuckLake state
  with the fingerprint the backup's operation recorded; without one, the three DuckLake tables
  must be present. The fenced source's own state is recorded as this operation's
  ``catalog_fingerprint``: it is what this operation's backup holds.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import psycopg

from duckgres_admin.lib.s3 import S3, S3Error, session_name_for_op
from duckgres_admin.models import Warehouse
from duckgres_admin.platform.lockkeys import COPY_TARGET_LOCK_KEY
from reshard.engines import testhooks, verify
from reshard.engines.clients import BackupSource, server_major
from reshard.engines.restore.stream import (
    APPLICATION_NAME,
    Expected,
    Restored,
    RestoreError,
    stream_restore,
)
from reshard.runner import connections, waits
from reshard.runner.env import StepEnv, StepFn
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.hooks import StepHooks
from reshard.runner.steps import backup_catalog, preflight

PROGRESS_INTERVAL_SECONDS = 2.0


END_EARLIER_SECONDS = 30.0
_EARLIER = (
    "SELECT pid FROM pg_catalog.pg_stat_activity WHERE datname = pg_catalog.current_database() "
    "AND application_name = %s AND pid <> pg_catalog.pg_backend_pid()"
)


def _bucket(env: StepEnv) -> Warehouse:
    op = env.op
    wh = Warehouse.objects.filter(org_id=op.org_id).first()
    if wh is None or not wh.data_bucket:
        raise StepError("the warehouse has no data bucket: the backup cannot be read")
    if op.restore_backup_bucket and wh.data_bucket != op.restore_backup_bucket:
        raise StepError(
            f"the warehouse's data bucket changed since the restore started (now "
            f"{wh.data_bucket}, the backup is in {op.restore_backup_bucket}): cancel and start "
            "it again"
        )
    return wh


def _end_earlier_restores(env: StepEnv, conn: connections.PgConn) -> None:
    """End the ``pg_restore`` sessions an earlier runner of this op left on the target (the
    writer may signal its own role's backends), and see them gone within a bound."""
    connections.end_sessions(
        conn,
        _EARLIER,
        (APPLICATION_NAME,),
        what="earlier pg_restore session(s) on the target",
        warn=env.log.warn,
        seconds=END_EARLIER_SECONDS,
    )


@dataclasses.dataclass(frozen=True)
class RestoreTarget:
    """Where a restore kind writes: ``side(env, fresh)`` is the target it logs in to (``fresh``:
    before a write, when a kind's login must be voided first); ``before_write`` runs on the
    writer's locked session before ``pg_restore``, ``after_write`` right after it."""

    side: Callable[[StepEnv, bool], connections.Side]
    before_write: Callable[[StepEnv, connections.PgConn], None]
    after_write: Callable[[StepEnv, connections.PgConn], None]


def _nothing(env: StepEnv, conn: connections.PgConn) -> None:
    return None


# Onto another store: the tenant rendered by the cutover; the pg_restore sessions an earlier
# runner of this op left on the target are ended before this one writes.
OTHER_STORE = RestoreTarget(
    side=lambda env, fresh: connections.target_side(env.ctx, env.op),
    before_write=lambda env, conn: _end_earlier_restores(env, conn),
    after_write=_nothing,
)


def step_functions(target: RestoreTarget) -> dict[str, StepFn]:
    """A restore kind's ``copying`` and ``verifying``, writing to and reading ``target``."""

    def copying(env: StepEnv) -> None:
        run(env, target)

    def verifying(env: StepEnv) -> None:
        run_verify(env, target)

    return {"copying": copying, "verifying": verifying}


def run(env: StepEnv, where: RestoreTarget) -> None:
    """Stream the backup object into the target database."""
    ctx, op = env.ctx, env.op
    backup_catalog.resume_beside_copy(env)
    wh = _bucket(env)
    preflight.check_target_identity(env)  # before any write to the target, takeovers included
    target = where.side(env, True)
    uri = f"s3://{wh.data_bucket}/{op.restore_backup_key}"
    try:
        s3 = S3(
            region=wh.data_region,
            role_arn=wh.data_role_arn,
            session_name=session_name_for_op(op.id),
        )
    except S3Error as exc:
        raise StepError(f"cannot reach the backup {uri}: {exc}") from None
    hooks = StepHooks(env, progress_keys=("restore_bytes_total", "restore_bytes_done"))
    # Nothing of a restore is irreversible before the cleanup (its cancel cutoff, in place or
    # onto another store): a cancel kills pg_restore and the operation rolls back.
    with waits.cancel_watch(ctx, env.log, enabled=True) as cancelled:
        restored = _restore(env, wh, s3, (where, target), uri, hooks, cancelled)
    hooks.progress(
        {"restore_bytes_total": restored.object_bytes, "restore_bytes_done": restored.object_bytes}
    )
    env.fence.update(bytes_copied=restored.object_bytes)
    op.bytes_copied = restored.object_bytes
    ctx.progress.copied = True
    env.log.info(
        f"restore complete: {restored.object_bytes} bytes in {restored.seconds:.1f} s "
        f"(pg_restore {restored.client_major})"
    )


def _restore(
    env: StepEnv,
    wh: Warehouse,
    s3: S3,
    writing: tuple[RestoreTarget, connections.Side],
    uri: str,
    hooks: StepHooks,
    cancelled: threading.Event,
) -> Restored:
    """The locked, watched ``pg_restore`` of the object into ``target``."""
    ctx, op = env.ctx, env.op
    where, target = writing
    # Logged in as the writer itself (in place: the login role, without its SET ROLE); for a
    # reshard's target it ends the pg_restore sessions an earlier runner left.
    locker = dataclasses.replace(target, role="")
    try:
        with locker.connect(ctx) as lock_conn, connections.registered(ctx, lock_conn):
            row = lock_conn.execute(
                "SELECT pg_try_advisory_lock(%s), current_setting('server_version_num')::int",
                (COPY_TARGET_LOCK_KEY,),
            ).fetchone()
            if not row or row[0] is not True:
                raise StepError(
                    "target catalog is locked by another copier — refusing to interleave"
                )
            major = server_major(int(str(row[1])))
            where.before_write(env, lock_conn)
            env.log.info(f"restoring {uri} into {target.redacted()} with stock pg_restore")
            last = [0.0]

            def progress(done: int) -> None:
                testhooks.kill_point("restore_chunk_written")
                now = time.monotonic()
                if now - last[0] >= PROGRESS_INTERVAL_SECONDS:
                    last[0] = now
                    hooks.progress({"restore_bytes_done": done})

            restored = stream_restore(
                s3,
                wh.data_bucket,
                op.restore_backup_key,
                BackupSource(
                    target.endpoint.host,
                    target.endpoint.port,
                    target.database,
                    target.user,
                    target.endpoint.sslmode,
                    target.password,
                    role=target.role,
                ),
                server_major=major,
                timeout_seconds=ctx.statement_seconds(),
                if_match=op.restore_backup_etag,
                expected=(
                    Expected(
                        op.restore_backup_sha256,
                        op.restore_backup_size,
                        op.restore_backup_version_id,
                    )
                    if op.restore_backup_sha256
                    else None
                ),
                should_stop=lambda: ctx.stop.is_set() or cancelled.is_set(),
                register=ctx.register_process,
                unregister=ctx.unregister_process,
                after_chunk=progress,
            )
            where.after_write(env, lock_conn)
    except (RestoreError, Interrupted, psycopg.Error) as exc:
        if ctx.stop.is_set():
            raise Interrupted() from None
        if cancelled.is_set():
            raise Cancelled() from None
        if isinstance(exc, Interrupted):
            raise
        if isinstance(exc, RestoreError):
            raise StepError(f"the restore of {uri} failed: {exc}") from None
        raise StepError(f"cannot reach the target {target.redacted()}: {exc}") from None
    return restored


def _read(env: StepEnv, side: connections.Side) -> verify.DuckLakeState:
    try:
        with side.connect(env.ctx) as conn, connections.registered(env.ctx, conn):
            return verify.read_state(conn)
    except psycopg.Error as exc:
        raise StepError(f"DuckLake verification could not read the {side.label}: {exc}") from None


def run_verify(env: StepEnv, where: RestoreTarget) -> None:
    """The restored catalog against its backup's fingerprint; the replaced one's recorded."""
    ctx, op = env.ctx, env.op
    restored = _read(env, where.side(env, False))
    try:
        result = verify.check_restore(restored, op.restore_fingerprint)
    except verify.VerifyError as exc:
        raise StepError(str(exc)) from None
    if result is not None:
        env.log.info(result.restore_line("backup's"))
    else:
        env.log.warn(
            "the backup's operation recorded no DuckLake fingerprint: only the presence of the "
            "DuckLake tables was verified (snapshot "
            f"{'none' if restored.snapshot_id is None else restored.snapshot_id}, "
            f"{restored.data_files} data files)"
        )
    source = _read(env, connections.source_side(ctx, op))
    try:
        env.fence.update(catalog_fingerprint=verify.compare(source, source).fingerprint())
    except verify.VerifyError:
        # A catalog being replaced may well be broken: that is what restores are for.
        env.log.warn(
            f"the catalog being replaced lacks {', '.join(source.missing)}: no fingerprint is "
            "recorded for its backup (its restore test will check the tables' presence only)"
        )
    backup_catalog.join_background(env)
