"""Step G ``backup_catalog`` (spec §4.4 G, §4.10) and, for →cnpg targets, H1
``preflightCnpgTarget`` (no stamp) at its end.

The direction gate: for cnpg→external a failed backup fails the step ("pre-flip catalog backup
is mandatory …"); other directions log a warning and continue with ``backup_s3_uri`` empty.

``pg_dump`` waits for its table locks at most as long as the step's deadline allows
(``--lock-wait-timeout``, safeguard reshard-67). SIGTERM and fencing kill it (the step ends
:class:`Interrupted`); so does an operator cancel, which every direction honours here (the step
ends :class:`Cancelled`). The bucket is the warehouse's own ``data_bucket``, read fresh.

The op log gets the restore line of :func:`reshard.backup.restore_line`: it creates
``<source database>_restored_op<id>`` on the source server as the operator's ``PGUSER`` and
restores into it, so it works after the move too (the source database is gone, its tenant role
``NOLOGIN``; safeguard reshard-71).
"""

from __future__ import annotations

from duckgres_admin.models import Warehouse
from reshard import backup
from reshard.runner import stores, waits
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.steps import preflight
from reshard.runner.steps.base import StepEnv
from reshard.runner.steps.copying import StepHooks


def _source(env: StepEnv) -> backup.BackupSource:
    side = stores.source_side(env.ctx, env.op)
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
    # backup_catalog precedes every direction's cancel cutoff.
    with waits.cancel_watch(ctx, env.log, enabled=True) as cancelled:
        hooks = StepHooks(env, cancelled=cancelled, progress_keys=("bytes_dumped", "backup_parts"))
        try:
            source = _source(env)
            result = backup.run_backup(
                op.id,
                source,
                backup.BackupDestination(wh.data_bucket, wh.data_region, wh.data_role_arn),
                hooks,
                mandatory=mandatory,
                # The logged restore command (safeguard reshard-71): a new database on the
                # source server, as the operator's login (the default restore target).
                lock_wait_seconds=ctx.statement_seconds(),
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
