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

The op log gets the restore line of :func:`reshard.backup.restore_line`: it creates
``<source database>_restored_op<id>`` on the source server as the operator's ``PGUSER`` and
restores into it, so it works after the move too (the source database is gone, its tenant role
``NOLOGIN``; safeguard reshard-71).
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, connection

from duckgres_admin.lib import pgadmin
from duckgres_admin.lib.s3 import S3, S3Error, session_name_for_op
from duckgres_admin.models import ReshardOperation, Warehouse
from reshard import backup
from reshard.runner import connections, waits
from reshard.runner.context import RunContext
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.steps import preflight
from reshard.runner.steps.copying import StepHooks


@dataclass(frozen=True)
class PreparedBackup:
    """Made during the propagation wait; each part is None when it could not be made."""

    region: str = ""
    role_arn: str = ""
    s3: S3 | None = None
    source: backup.BackupSource | None = field(default=None, repr=False)
    facts: backup.SourceFacts | None = None


def _submitted_source(ctx: RunContext, op: ReshardOperation) -> backup.BackupSource | None:
    """The source as the op was submitted for it (recordSource has not run yet): what
    :func:`_source` will return when the binding has not drifted. None: not knowable yet."""
    if op.source_kind == "cnpg":
        if not (op.from_shard and op.source_database and op.source_user):
            return None
        prov = connections.provisioner(ctx, op.from_shard)
        return backup.BackupSource(
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
    return backup.BackupSource(
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
        source: backup.BackupSource | None = None
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


def _source(env: StepEnv) -> backup.BackupSource:
    side = connections.source_side(env.ctx, env.op)
    return backup.BackupSource(
        host=side.endpoint.host,
        port=side.endpoint.port,
        database=side.database,
        user=side.user,
        sslmode=side.endpoint.sslmode,
        password=side.password,
        role=side.role,
    )


def run(env: StepEnv) -> None:
    run_backup_step(env)
    if env.op.target_kind == "cnpg":
        preflight.run(env)


def run_backup_step(env: StepEnv) -> None:
    op, ctx = env.op, env.ctx
    mandatory = op.source_kind == "cnpg" and op.target_kind == "external"
    wh = Warehouse.objects.get(org_id=op.org_id)
    prepared = take_prepared(ctx)
    # backup_catalog precedes every direction's cancel cutoff.
    with waits.cancel_watch(ctx, env.log, enabled=True) as cancelled:
        hooks = StepHooks(env, cancelled=cancelled, progress_keys=("bytes_dumped", "backup_parts"))
        try:
            source = _source(env)
            s3, facts = None, None
            if prepared is not None:
                # Only for what the step would have built and read itself.
                if (prepared.region, prepared.role_arn) == (wh.data_region, wh.data_role_arn):
                    s3 = prepared.s3
                if prepared.source == source:
                    facts = prepared.facts
            result = backup.run_backup(
                op.id,
                source,
                backup.BackupDestination(wh.data_bucket, wh.data_region, wh.data_role_arn),
                hooks,
                mandatory=mandatory,
                # The logged restore command (safeguard reshard-71): a new database on the
                # source server, as the operator's login (the default restore target).
                lock_wait_seconds=ctx.statement_seconds(),
                s3=s3,
                facts=facts,
            )
        except (backup.BackupError, StepError) as exc:
            if ctx.stop.is_set():
                raise Interrupted() from None
            if cancelled.is_set():
                raise Cancelled() from None
            text = backup.gated_failure(str(exc), mandatory=mandatory)
            if mandatory:
                raise StepError(text) from None
            env.log.warn(text)
            return
    # The final figures (progress writes are throttled to one per 2 s).
    hooks.progress({"bytes_dumped": result.bytes, "backup_parts": result.parts})
    env.fence.update(backup_s3_uri=result.uri, backup_bytes=result.bytes)
    op.backup_s3_uri, op.backup_bytes = result.uri, result.bytes
    for line in result.log_lines():
        env.log.info(line)
