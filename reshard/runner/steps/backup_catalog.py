"""Step G ``backup_catalog`` (spec §4.4 G, §4.10) and, for →cnpg targets, H1
``preflightCnpgTarget`` (no stamp) at its end.

The direction gate: for cnpg→external a failed backup fails the step ("pre-flip catalog backup
is mandatory …"); other directions log a warning and continue with ``backup_s3_uri`` empty.

``pg_dump`` waits for its table locks at most as long as the step's deadline allows
(``--lock-wait-timeout``, safeguard reshard-67). SIGTERM and fencing kill it (the step ends
:class:`Interrupted`); so does an operator cancel, which every direction honours here (the step
ends :class:`Cancelled`). The bucket is the warehouse's own ``data_bucket``, read fresh.

What the backup needs before ``pg_dump`` can start — the S3 client (about 0.1 to 0.15 s of CPU for
botocore's service models, plus STS AssumeRole with a ``data_role_arn``) and the source's server
version and database size (one short connection) — is prepared by :func:`prepare` in a helper
thread while the block's propagation wait runs (``blocking``), and handed over through
``RunContext.backup_prep``. The step uses the client only for the region and role the warehouse
names when the step runs, and the facts only for exactly the source it dumps (same host, port,
database, login, role, sslmode and password); anything else, or a preparation that failed, is
redone in the step as before, so the step's behaviour and messages never depend on the
preparation. The step never waits for it: one still running is ignored.

**The backup beside the copy** (``DUCKGRES_RESHARD_BACKUP_OVERLAP``, default on; safeguards
reshard-95, reshard-96). The step starts the dump in a thread of its own (:func:`start_background`)
and the run goes on with the cutover, the copy and the verification, which read the same fenced,
read-only source. Invariants:

- it is joined (:func:`join_background`) at the end of ``verifying``, before anything
  irreversible: →cnpg's commit point and source drop, cnpg→external's orphaning and flip;
- the direction gate applies at the join (cnpg→external fails there and rolls back, before its
  cancel cutoff; other directions warn and continue);
- the thread writes only its progress keys (merged under ``RunContext.progress_lock``) and op
  log lines; ``backup_s3_uri``/``backup_bytes`` are written by the main thread at the join, by
  the fenced update every milestone uses;
- any end of the run without the join (rollback, stop, fence, exception) abandons it
  (:func:`abandon`: its own ``pg_dump`` killed and statements cancelled, never the step's), and
  its thread aborts its upload;
- a takeover resuming at ``copying`` with no backup recorded starts one beside the copy
  (:func:`resume_beside_copy`), so the source drop still follows a backup.

With the overlap off, :func:`run_backup_step` runs the backup alone inside the step, as before.

The op log gets the restore line of :func:`reshard.engines.restore.command.restore_line`: it creates
``<source database>_restored_op<id>`` on the source server as the operator's ``PGUSER`` and
restores into it, so it works after the move too (the source database is gone, its tenant role
``NOLOGIN``; safeguard reshard-71).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection

from duckgres_admin.lib import pgadmin
from duckgres_admin.lib.s3 import S3, S3Error, session_name_for_op
from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines import backup, clients
from reshard.runner import connections, waits
from reshard.runner.context import RunContext
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.hooks import BackgroundHooks, StepHooks
from reshard.runner.kind import kind_of
from reshard.runner.steps import preflight


@dataclass(frozen=True)
class PreparedBackup:
    """Made during the propagation wait; each part is None when it could not be made."""

    region: str = ""
    role_arn: str = ""
    s3: S3 | None = None
    source: clients.BackupSource | None = field(default=None, repr=False)
    facts: backup.SourceFacts | None = None


def _submitted_source(ctx: RunContext, op: ReshardOperation) -> clients.BackupSource | None:
    """The source as the op was submitted for it (recordSource has not run yet): what
    :func:`_source` will return when the binding has not drifted. None: not knowable yet."""
    if op.source_kind == "cnpg":
        if not (op.from_shard and op.source_database and op.source_user):
            return None
        prov = connections.provisioner(ctx, op.from_shard)
        return clients.BackupSource(
            host=prov.store.host,
            port=prov.store.port,
            database=op.source_database,
            user=prov.store.provisioner_user,
            sslmode=prov.store.sslmode,
            password=prov.password,
            role=op.source_user,
        )
    password = ctx.source_password
    if not password and op.source_password_secret_ref:
        password = connections.resolve_secret(
            ctx, op.source_password_secret_ref, "the source password"
        )
    if not (op.source_endpoint and op.source_database and op.source_user and password):
        return None
    return clients.BackupSource(
        host=op.source_endpoint,
        port=op.source_port or 5432,
        database=op.source_database,
        user=op.source_user,
        sslmode=op.source_sslmode or pgadmin.DEFAULT_SSLMODE,
        password=password,
    )


def _prepare(ctx: RunContext, op: ReshardOperation) -> PreparedBackup:
    try:
        row = (
            Warehouse.objects.filter(org_id=op.org_id)
            .values_list("data_region", "data_role_arn")
            .first()
        )
        region, role_arn = row if row else ("", "")
        client: S3 | None = None
        if row is not None:
            with contextlib.suppress(S3Error):  # the step builds it again and reports why
                client = S3(
                    region=region, role_arn=role_arn, session_name=session_name_for_op(op.id)
                )
        source: clients.BackupSource | None = None
        facts: backup.SourceFacts | None = None
        try:
            source = _submitted_source(ctx, op)
            facts = backup.read_source_facts(source) if source is not None else None
        except Exception:  # noqa: BLE001 - the step reads them itself and reports any failure
            source, facts = None, None
        return PreparedBackup(region or "", role_arn or "", client, source, facts)
    finally:
        with contextlib.suppress(DatabaseError, InterfaceError):
            connection.close()  # this thread's config-store connection


def prepare(env: StepEnv) -> None:
    """Start preparing the backup in a helper thread (called before the propagation wait)."""
    future: Future[PreparedBackup] = Future()
    ctx, op = env.ctx, env.op

    def work() -> None:
        try:
            future.set_result(_prepare(ctx, op))
        except BaseException as exc:  # noqa: BLE001 - handed to the step, which ignores it
            future.set_exception(exc)

    ctx.backup_prep = future
    threading.Thread(target=work, name="reshard-backup-prepare", daemon=True).start()


def take_prepared(ctx: RunContext) -> PreparedBackup | None:
    """The preparation, once, without waiting (``waits`` is the only place that waits): None
    when there is none, it failed, or it is still running (the step then does the work itself,
    as without a preparation; it normally finished during the propagation wait)."""
    future = ctx.backup_prep
    ctx.backup_prep = None
    if not isinstance(future, Future) or not future.done() or future.exception() is not None:
        return None
    result = future.result()
    return result if isinstance(result, PreparedBackup) else None


def _source(env: StepEnv) -> clients.BackupSource:
    side = connections.source_side(env.ctx, env.op)
    return clients.BackupSource(
        host=side.endpoint.host,
        port=side.endpoint.port,
        database=side.database,
        user=side.user,
        sslmode=side.endpoint.sslmode,
        password=side.password,
        role=side.role,
    )


PROGRESS_KEYS = ("bytes_dumped", "backup_parts")
# How long an abandoned background backup gets to stop (kill pg_dump, abort its upload).
ABANDON_JOIN_SECONDS = 30.0


def overlapped() -> bool:
    """The backup runs beside the cutover, the copy and the verification (module doc)."""
    return bool(settings.DUCKGRES_RESHARD_BACKUP_OVERLAP)


def run(env: StepEnv) -> None:
    env.ctx.backup_attempted = True
    if overlapped():
        start_background(env, "the cutover, the copy and the verification")
    else:
        run_backup_step(env)
    if env.op.target_kind == "cnpg":
        preflight.run(env)


def _mandatory(op: ReshardOperation) -> bool:
    """The kind's gate (the reshard's: cnpg→external; a restore's: always, since its cleanup
    drops the catalog it replaced)."""
    return kind_of(op).backup_mandatory(op)


@dataclass(frozen=True)
class _Dump:
    """What one backup dumps, where to, and with what the preparation already built."""

    source: clients.BackupSource
    destination: backup.BackupDestination
    s3: S3 | None
    facts: backup.SourceFacts | None


def _plan_dump(env: StepEnv, wh: Warehouse, prepared: PreparedBackup | None) -> _Dump:
    """The dump's inputs (``StepError`` when the source cannot be described)."""
    source = _source(env)
    s3, facts = None, None
    if prepared is not None:
        # Only for what the step would have built and read itself.
        if (prepared.region, prepared.role_arn) == (wh.data_region, wh.data_role_arn):
            s3 = prepared.s3
        if prepared.source == source:
            facts = prepared.facts
    destination = backup.BackupDestination(wh.data_bucket, wh.data_region, wh.data_role_arn)
    return _Dump(source, destination, s3, facts)


def _dump(env: StepEnv, plan: _Dump, hooks: StepHooks) -> backup.BackupResult:
    """The streamed ``pg_dump`` to S3 (``BackupError`` on failure)."""
    return backup.run_backup(
        env.op.id,
        plan.source,
        plan.destination,
        hooks,
        mandatory=_mandatory(env.op),
        # The logged restore command (safeguard reshard-71): a new database on the
        # source server, as the operator's login (the default restore target).
        lock_wait_seconds=env.ctx.statement_seconds(),
        s3=plan.s3,
        facts=plan.facts,
    )


def _gate(env: StepEnv, exc: Exception, *, cancelled: bool) -> None:
    """A failed backup: ``Interrupted`` on a stop, ``Cancelled`` on an acted-on cancel, then
    the direction gate (cnpg→external: the step fails; else a warning, and the run goes on)."""
    if env.ctx.stop.is_set():
        raise Interrupted() from None
    if cancelled:
        raise Cancelled() from None
    mandatory = _mandatory(env.op)
    text = kind_of(env.op).backup_failure(str(exc), mandatory=mandatory)
    if mandatory:
        raise StepError(text) from None
    env.log.warn(text)


def _record(env: StepEnv, hooks: StepHooks, result: backup.BackupResult) -> None:
    """The backup's milestones (a fenced write of the main thread) and its log lines."""
    op = env.op
    # The final figures (progress writes are throttled to one per 2 s).
    hooks.progress({"bytes_dumped": result.bytes, "backup_parts": result.parts})
    # The object's identity, recorded with its URI: only a recorded object is a backup
    # (listing, restores, restore tests, retention; docs/backup.md "Authenticated backups").
    env.fence.update(
        backup_s3_uri=result.uri,
        backup_bytes=result.bytes,
        backup_sha256=result.sha256,
        backup_etag=result.etag,
        backup_version_id=result.version_id,
    )
    op.backup_s3_uri, op.backup_bytes = result.uri, result.bytes
    op.backup_sha256, op.backup_etag = result.sha256, result.etag
    op.backup_version_id = result.version_id
    for line in result.log_lines():
        env.log.info(line)


def run_backup_step(env: StepEnv, *, cancel_aware: bool = True) -> None:
    """The backup alone, inside the step (``DUCKGRES_RESHARD_BACKUP_OVERLAP`` false; and the
    online mode's backup after the unblock, past its cancel cutoff: ``cancel_aware`` false)."""
    op, ctx = env.op, env.ctx
    wh = Warehouse.objects.get(org_id=op.org_id)
    prepared = take_prepared(ctx)
    # backup_catalog precedes every offline direction's cancel cutoff.
    with waits.cancel_watch(ctx, env.log, enabled=cancel_aware) as cancelled:
        hooks = StepHooks(env, cancelled=cancelled, progress_keys=PROGRESS_KEYS)
        try:
            result = _dump(env, _plan_dump(env, wh, prepared), hooks)
        except (backup.BackupError, StepError) as exc:
            _gate(env, exc, cancelled=cancelled.is_set())
            return
    _record(env, hooks, result)


# --- the backup beside the steps ----------------------------------------------------------------
@dataclass
class BackgroundBackup:
    """A backup running in its own thread beside the steps (``RunContext.background_backup``)."""

    future: Future[backup.BackupResult]
    hooks: BackgroundHooks
    thread: threading.Thread
    started: float


def start_background(env: StepEnv, beside: str) -> None:
    """Start the backup in a helper thread; :func:`join_background` records it."""
    op, ctx = env.op, env.ctx
    wh = Warehouse.objects.get(org_id=op.org_id)
    prepared = take_prepared(ctx)
    try:
        plan = _plan_dump(env, wh, prepared)
    except StepError as exc:
        _gate(env, exc, cancelled=False)
        return
    hooks = BackgroundHooks(env, progress_keys=PROGRESS_KEYS)
    future: Future[backup.BackupResult] = Future()

    def work() -> None:
        try:
            future.set_result(_dump(env, plan, hooks))
        except BaseException as exc:  # noqa: BLE001 - handed to the join, which decides
            future.set_exception(exc)
        finally:
            with contextlib.suppress(DatabaseError, InterfaceError):
                connection.close()  # this thread's config-store connection

    thread = threading.Thread(target=work, name="reshard-backup", daemon=True)
    ctx.background_backup = BackgroundBackup(future, hooks, thread, time.monotonic())
    env.log.info(
        f"catalog backup started beside {beside}; it reads the same fenced source and is "
        "joined at the end of verifying, before anything irreversible"
    )
    thread.start()


def resume_beside_copy(env: StepEnv) -> None:
    """A takeover that resumes at ``copying`` without a backup starts one beside the copy
    (the runner that died may have been dumping beside it)."""
    ctx, op = env.ctx, env.op
    if not overlapped() or ctx.backup_attempted or op.backup_s3_uri:
        return
    ctx.backup_attempted = True
    env.log.info("no catalog backup was recorded before this takeover: starting one")
    start_background(env, "the copy and the verification")


def join_background(env: StepEnv) -> None:
    """Wait for the backup started beside the steps; record it, or apply the direction gate.

    Cancel-aware only before the direction's cancel cutoff (cnpg→external: its ``verifying``
    precedes ``orphaning_source``; →cnpg is past its cutoff here)."""
    ctx, op = env.ctx, env.op
    task: BackgroundBackup | None = ctx.background_backup
    if task is None:
        return
    try:
        waited = waits.await_done(
            ctx,
            env.log,
            waits.full_source_timeout(),
            task.future,
            purpose="for the catalog backup running beside the copy",
            timeout_message="the catalog backup did not finish in time",
            cancel_aware=op.target_kind == "external",
        )
    except StepError as exc:
        abandon(env, "it did not finish in time")
        _gate(env, backup.BackupError(str(exc)), cancelled=False)
        return
    ctx.background_backup = None
    error = task.future.exception()
    if isinstance(error, backup.BackupError | StepError):
        _gate(env, error, cancelled=False)
        return
    if error is not None:
        raise error
    took = time.monotonic() - task.started
    env.log.info(
        f"catalog backup finished {took:.1f} s after it started; the steps waited {waited:.1f} s "
        "for it after the verification"
    )
    _record(env, task.hooks, task.future.result())


def abandon(env: StepEnv, why: str) -> None:
    """Stop a backup still running beside the steps (the run ends without joining it: a
    rollback, a stop, a fence). Its thread kills ``pg_dump`` and aborts its upload."""
    ctx = env.ctx
    task: BackgroundBackup | None = ctx.background_backup
    if task is None:
        return
    ctx.background_backup = None
    if task.future.done():
        error = task.future.exception()
        if error is not None:
            env.log.warn(f"catalog backup failed: {error} (the run ends without it: {why})")
        return
    env.log.warn(f"stopping the catalog backup running beside the steps: {why}")
    task.hooks.abandon()
    if not waits.join_bounded(task.thread, ABANDON_JOIN_SECONDS):
        env.log.warn(
            f"the catalog backup did not stop within {ABANDON_JOIN_SECONDS:g} s; its open "
            "upload, if any, is aborted by the janitor's upload sweep"
        )
