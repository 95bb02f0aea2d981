"""Steps I ``copying`` and J ``verifying`` (spec §4.4 I, J, §4.9; safeguards 7, 17, 18, 44, 54,
reshard-60, reshard-67).

Source and target are built from the op's durable fields (never the binding: after a →cnpg
cutover it names the target). The target is reached logged in as the tenant (``connections``), the
source as the provisioner with ``SET ROLE`` (cnpg) or as the tenant (external); every session is
pinned (``search_path``, ``row_security``, timeouts sized from the step's deadline). Both are
probed; the target identity checks (§4.18) run before any target write, takeovers included;
then the copy. Its release handle (the source ``REPEATABLE READ`` transaction holding the
``SHARE`` locks) lives on the run context until the source is dropped (cleanup) or the rollback
ends. The three ``*_copied`` counters are written only after a successful copy.

Interruptions: every copy connection is registered ``interrupt_on_stop``, so SIGTERM cancels
the running statement (a lock wait, a ``COPY``) and the step ends :class:`Interrupted`; before
the cnpg→external cancel cutoff (``orphaning_source``) an operator cancel does the same and the
step ends :class:`Cancelled`. →cnpg copies are past their cutoff: a cancel is not acted on.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.db.models.functions import Now

from reshard.engines import identity, verify
from reshard.engines.copy import catalog as catalog_copy
from reshard.engines.copy.base import CopyError
from reshard.runner import connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.hooks import StepHooks
from reshard.runner.steps import backup_catalog, preflight


def _probe(env: StepEnv, side: connections.Side) -> None:
    try:
        with side.connect(env.ctx) as conn, connections.registered(env.ctx, conn):
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise StepError(
            f"cannot reach the {side.label} {side.redacted()}: {' '.join(str(exc).split())}"
        ) from None


def _claim_external_target(env: StepEnv, target: connections.Side) -> None:
    """Before the first write to an external target: it must hold nothing (identity check 4),
    so that everything a rollback later drops there is this operation's; recorded once."""
    try:
        with target.connect(env.ctx) as conn, connections.registered(env.ctx, conn):
            contents = identity.database_contents(conn)
    except psycopg.Error as exc:
        raise StepError(f"cannot inspect the {target.label} {target.redacted()}: {exc}") from None
    refusal = identity.contents_message(
        contents,
        database=target.database,
        where=f"{target.endpoint.host}:{target.endpoint.port}",
    )
    if refusal:
        raise StepError(refusal)
    env.fence.update(target_claimed_at=Now())
    env.op.refresh_from_db(fields=["target_claimed_at"])


def run(env: StepEnv) -> None:
    ctx, op = env.ctx, env.op
    backup_catalog.resume_beside_copy(env)
    source = connections.source_side(ctx, op)
    target = connections.target_side(ctx, op)
    _probe(env, source)
    _probe(env, target)
    preflight.check_target_identity(env)
    if op.target_kind == "external" and op.target_claimed_at is None:
        _claim_external_target(env, target)
    release_handle(env)  # a takeover's retry starts from a clean slate
    env.log.info(f"copying the catalog from {source.redacted()} to {target.redacted()}")
    # cnpg→external copies before its cancel cutoff (orphaning_source); →cnpg after it.
    with waits.cancel_watch(ctx, env.log, enabled=op.target_kind == "external") as cancelled:
        hooks = StepHooks(
            env,
            cancelled=cancelled,
            progress_keys=("tables_total", "tables_done", "rows_copied", "bytes_copied"),
        )
        try:
            result = catalog_copy.copy_catalog(
                lambda: source.connect(ctx),
                lambda: target.connect(ctx),
                hooks,
                parallelism=int(settings.DUCKGRES_RESHARD_COPY_PARALLELISM),
            )
        except CopyError as exc:
            if ctx.stop.is_set():
                raise Interrupted() from None
            if cancelled.is_set():
                raise Cancelled() from None
            raise StepError(str(exc)) from None
    ctx.release_handle = result.release
    # Progress writes are throttled to one per 2 s; record the final figures so a fast copy
    # never leaves the admin showing a partial count.
    hooks.progress(
        {
            "tables_total": result.tables_copied,
            "tables_done": result.tables_copied,
            "rows_copied": result.rows_copied,
            "bytes_copied": result.bytes_copied,
        }
    )
    env.fence.update(
        tables_copied=result.tables_copied,
        rows_copied=result.rows_copied,
        bytes_copied=result.bytes_copied,
    )
    op.tables_copied = result.tables_copied
    op.rows_copied = result.rows_copied
    op.bytes_copied = result.bytes_copied
    ctx.progress.copied = result.tables_copied > 0
    env.log.info(
        f"copy complete: {result.tables_copied} tables, {result.rows_copied} rows, "
        f"{result.bytes_copied} bytes"
    )


def release_handle(env: StepEnv) -> None:
    """Release the source write fence (idempotent)."""
    handle: Any = env.ctx.release_handle
    if handle is not None:
        handle.release()
        env.ctx.release_handle = None


def run_verify(env: StepEnv) -> None:
    ctx, op = env.ctx, env.op
    env.log.info(
        f"source and target COPY row counts matched for {op.tables_copied} tables while the "
        "write fence was held"
    )
    handle: Any = ctx.release_handle
    if handle is None or handle.released:
        raise StepError("the copy's source snapshot is gone; cannot verify (re-run the copy)")
    target = connections.target_side(ctx, op)
    try:
        with target.connect(ctx) as conn, connections.registered(ctx, conn):
            result = verify.verify_ducklake(handle.connection, conn)
    except verify.VerifyError as exc:
        raise StepError(str(exc)) from None
    except psycopg.Error as exc:
        raise StepError(f"DuckLake verification could not read the target: {exc}") from None
    env.log.info(result.message)
    # What the backup of this fenced source holds: the restore test checks a restore against it.
    env.fence.update(catalog_fingerprint=result.fingerprint())
    # The backup that ran beside the copy ends before anything irreversible (cleanup's source
    # drop, cnpg→external's orphaning and flip).
    backup_catalog.join_background(env)
