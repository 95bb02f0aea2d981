"""Rollback (spec reshard §4.6) and post-commit roll-forward (§4.7).

Interface for the recovery command (§4.16) — the same code runs under another guard:

- Build ``StepEnv(ctx=RunContext(op_id, runner_id=<you>, scrubber), op=<the row>,
  fence=<writer>, log=OpLogWriter(op_id, scrubber, source="recovery"))`` and set
  ``ctx.progress = reshard.runner.execute.reconstruct(op)``.
- ``<writer>`` is a :class:`reshard.runner.fencing.Fencer` subclass overriding ``_guarded()``
  (e.g. ``ReshardOperation.objects.filter(id=…, state='failed', recovery_owner=<you>)``) and
  ``_touch()`` (``{"recovery_claimed_at": Now()}``). Everything here uses only
  ``env.fence.update(**fields)`` (a guarded update, zero rows → ``Fenced``, rolling back the
  enclosing transaction with the warehouse write in it) and
  ``env.fence.pre_statement_heartbeat()`` (before every irreversible statement: binding switch,
  ``DROP TABLE``, ``DROP DATABASE``); warehouse writes always share a ``transaction.atomic``
  block with such an update (``reshard.runner.binding.switch``, :func:`unblock`).
- ``rollback(env) -> RollbackOutcome(recovered, left_blocked, reason)``; the caller writes its
  own terminal/recovery fields (the runner: the terminal write with ``recovery_required`` when
  ``left_blocked``).
- ``roll_forward(env, finish)``: redo the source drop when needed, then ``finish(env)`` — the
  runner passes the atomic finalize; recovery passes :func:`unblock_completed` (warehouse
  ``ready`` with ``metadata-store reshard complete``, op stays ``failed``).

Rollback runs with ``stop`` ignored; its waits are capped by the SIGTERM budget
(``waits.rollback_deadline``). It always releases the source write fence at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import transaction
from django.db.models.functions import Now
from psycopg import sql

from duckgres_admin.lib import pgadmin
from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from duckgres_admin.platform import orglock as locks
from reshard.engines import identity, uploads
from reshard.engines.copy import catalog as catalog_copy
from reshard.engines.copy.base import CopyError
from reshard.operation import sequences
from reshard.runner import binding, connections, waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import Fenced, StepError
from reshard.runner.hooks import RunnerHooks
from reshard.runner.kind import kind_of
from reshard.runner.steps import online
from reshard.runner.steps.finalize import COMPLETE_MESSAGE, prior_to_flag

ROLLED_BACK_MESSAGE = "metadata-store reshard rolled back"
DROP_LOCK_TIMEOUT_MS = 5000  # the longest a rollback's DROP TABLE waits for another's lock


@dataclass(frozen=True)
class RollbackOutcome:
    recovered: bool
    left_blocked: bool
    reason: str = ""
    capture_left: bool = False  # the online mode's capture could not be removed

    @property
    def recovery_required(self) -> bool:
        """``reshard_recover`` must run again: the warehouse is left blocked, or the capture
        is left on the source (even of a warehouse never blocked)."""
        return self.left_blocked or self.capture_left


def _source_repointable(op: ReshardOperation) -> str:
    """'' when a flip-back binding would be usable by the data plane, else why not."""
    if op.source_kind == "cnpg":
        store = MetadataStore.objects.filter(name=op.from_shard).first() if op.from_shard else None
        if store is None or store.kind != "cnpg":
            return f"source store {op.from_shard or '<empty>'} is not a registered cnpg store"
        if not (op.source_database and op.source_user and op.source_password_secret_ref):
            return "the durable source database/user/password reference is incomplete"
        return ""
    if not (
        op.source_endpoint
        and op.source_port
        and op.source_database
        and op.source_user
        and op.source_password_secret_ref
    ):
        return "the durable external source host/port/database/user/reference is incomplete"
    return ""


def rollback(env: StepEnv) -> RollbackOutcome:
    op, ctx, log = env.op, env.ctx, env.log
    op.refresh_from_db()
    progress = ctx.progress
    recovered = True
    capture_left = False
    reasons: list[str] = []
    try:
        # 1-2. flip back (only to a binding the data plane can use, and never past a commit
        # point: the source may already be dropped, §1 inv. 8 — recovery rolls forward instead)
        if progress.flipped:
            why = _source_repointable(op)
            if op.source_drop_committed_at is not None or op.external_verified_at is not None:
                why = "a commit point was passed (the source may already be dropped)"
            if why:
                recovered = False
                reasons.append(f"cannot re-point the binding at the source: {why}")
                log.error(
                    f"rollback: not re-pointing the binding ({why}); the target is left as is "
                    "for forensics — fix the source fields/store row and run reshard_recover"
                )
            else:
                try:
                    binding.switch(env, binding.source_binding(op), what="flip-back")
                    log.info("rollback: binding flipped back to the source")
                except Fenced:
                    raise
                except Exception as exc:  # noqa: BLE001 - reported; never unblock then
                    recovered = False
                    where = binding.describe(op.org_id)
                    reasons.append(f"binding still points at {where}; fix manually")
                    log.error(
                        f"rollback: flip-back failed ({exc}); binding still points at {where}"
                    )
        # 3. partial target
        if not _drop_partial_target(env):
            recovered = False
            reasons.append("the in-place restore's sibling database or login role is left")
        # 3b. the online mode's change capture, before the tenant may log in again (the write
        # fence released first: its locks would hold the capture's removal back)
        _release(env)
        online.close_flip_snapshot(env)
        if not online.remove_capture(env, during_rollback=True):
            recovered = False
            capture_left = True
            reasons.append("the online copy's change capture is left on the source")
        # 4. un-fence / source access
        if not _restore_source_access(env):
            recovered = False
            reasons.append("source tenant access recovery failed")
    finally:
        _release(env)
    uploads.abort_for_op(op, log.append)
    blocked = progress.blocked or op.blocked_at is not None
    reason = "; ".join(reasons)
    if not blocked:
        log.info("rollback: the warehouse was never blocked; nothing to unblock")
        return RollbackOutcome(
            recovered=recovered, left_blocked=False, reason=reason, capture_left=capture_left
        )
    if recovered:
        unblock(env)
        return RollbackOutcome(recovered=True, left_blocked=False)
    restore_compaction_only(env)
    log.error(
        f"warehouse intentionally left in the resharding state: {reason}; run reshard_recover "
        f"{op.id} after fixing it"
    )
    return RollbackOutcome(
        recovered=False, left_blocked=True, reason=reason, capture_left=capture_left
    )


def _release(env: StepEnv) -> None:
    handle: Any = env.ctx.release_handle
    if handle is not None:
        handle.release()
        env.ctx.release_handle = None


def target_known(op: ReshardOperation) -> bool:
    if op.target_kind == "cnpg":
        return bool(op.to_shard and op.target_database and op.target_user)
    return bool(op.target_endpoint and op.target_database and op.target_user)


def _drop_partial_target(env: StepEnv) -> bool:
    """§4.6 step 3, decided from what exists on the target (re-read as the op's target tenant),
    never from ``tables_copied``: a copy killed part-way never set that counter, yet left tables.
    Every outcome is logged exactly: what was dropped, that nothing was there, or what is kept
    and why. False only when an in-place restore's sibling or login role is left (the warehouse
    then stays blocked): a reshard's target is another store's, its leftovers are cruft."""
    op, ctx, log = env.op, env.ctx, env.log
    if not target_known(op):
        log.info("rollback: no target database was recorded; nothing to drop on a target")
        return True
    own = kind_of(op).rollback_target(env)
    if own is not None:
        return own
    where = target_where(op)
    if op.target_kind == "cnpg" and op.target_rendered_at is None:
        log.info(f"rollback: the target {where} was never rendered; nothing to drop on it")
        return True
    if ctx.progress.flipped and not binding.names_source(op):
        log.error("rollback: binding may still point at the target — its tables are kept")
        return True
    written = sequences.at_or_past(
        op.step or "",
        sequences.first_target_write(op.copy_variant),
        op.target_kind,
        op.copy_variant,
    )
    if written and op.target_claimed_at is None:
        # Never drop in a database this operation did not create or adopt empty: whatever is
        # there may be a stranger's (identity check 4).
        log.info(
            f"rollback: the target {where} was not created or adopted empty by this operation; "
            "nothing in it is dropped"
        )
        left = "as it was found (this operation never claimed it)"
    elif written:
        left = _drop_target_tables(env, where)
    else:  # the copy step is stamped before its first write: nothing was written
        log.info(f"rollback: the copy never started (step {op.step}); nothing to drop on {where}")
        left = "empty (the copy never started), as cruft"
    if op.target_kind == "cnpg":
        try:
            prov = connections.provisioner(ctx, op.to_shard)
            with connections.provisioner_conn(ctx, prov) as conn:
                refusal = identity.op_role_refusal(conn, op, "target", prov.store)
                if refusal:
                    raise StepError(f"{refusal}; not setting it NOLOGIN")
                env.fence.pre_statement_heartbeat()
                conn.execute(
                    sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(op.target_user))
                )
            log.info(
                f"rollback: target tenant role {op.target_user} set NOLOGIN on store "
                f"{op.to_shard}; the target database {op.target_database} is left in place "
                f"{left}"
            )
        except Fenced:
            raise
        except (psycopg.Error, StepError) as exc:
            log.error(f"rollback: could not set the target tenant role NOLOGIN: {exc}")
    return True


def target_where(op: ReshardOperation) -> str:
    if op.target_kind == "cnpg":
        return f"database {op.target_database} on store {op.to_shard}"
    return f"database {op.target_database} on {op.target_endpoint}:{op.target_port or 5432}"


def _drop_target_tables(env: StepEnv, where: str) -> str:
    """Drop every ``ducklake_*`` table the target holds now; returns how the database is left
    (for the cnpg NOLOGIN line)."""
    op, ctx, log = env.op, env.ctx, env.log
    if op.target_kind == "external" and not ctx.target_password and op.target_password_secret_ref:
        # A relaunched runner cannot pull the password again (the stash hands it out once);
        # the op's durable reference names the same password (the start API checked that).
        try:
            ctx.set_target_password(
                connections.resolve_secret(
                    ctx, op.target_password_secret_ref,
                    f"the external target password {op.target_password_secret_ref}",
                )
            )  # fmt: skip
        except StepError as exc:
            log.warn(f"rollback: {exc}")
    if op.target_kind == "external" and not ctx.target_password:
        log.warn(
            f"rollback: the tables on the external target {where} were left in place (password "
            "unavailable to this runner); drop them by hand: a new operation refuses a target "
            "database that holds anything"
        )
        return "with whatever tables it holds (not read: password unavailable)"
    try:
        side = connections.target_side(ctx, op)
        with side.connect(ctx) as conn, connections.registered(ctx, conn):
            # A table another session holds locked must not hold the rollback (and the blocked
            # warehouse) for the step's whole deadline: give up on it after a few seconds.
            conn.execute(
                "SELECT pg_catalog.set_config('lock_timeout', %s, false)",
                [f"{DROP_LOCK_TIMEOUT_MS}ms"],
            )
            dropped = catalog_copy.drop_ducklake_tables(conn, RunnerHooks(env))
            remaining = identity.database_contents(conn)
    except Fenced:
        raise
    except (psycopg.Error, StepError, CopyError) as exc:
        log.error(
            f"rollback: dropping the partial target's tables on {where} failed: {exc}; they "
            "are kept — drop them by hand or run reshard_recover"
        )
        return "with the tables the failed drop kept"
    holds = "nothing" if remaining.empty else remaining.summary()
    if dropped:
        log.info(
            f"rollback: dropped {len(dropped)} partial target table(s) on {where}; it now "
            f"holds {holds}"
        )
        return f"holding {holds} ({len(dropped)} table(s) dropped), as cruft"
    log.info(f"rollback: the target {where} holds no ducklake_* table; nothing to drop")
    return f"holding {holds} (no ducklake_* table was there), as cruft"


def _tenant_probe(
    env: StepEnv, endpoint: pgadmin.Endpoint, password: str, *, where: str, success: str
) -> tuple[bool, str]:
    """A tenant-credential ``SELECT 1`` on the source; failures are classified (§4.11)."""
    op = env.op
    try:
        connections.tenant_probe(
            env.ctx,
            endpoint,
            database=op.source_database,
            user=op.source_user,
            password=password,
        )
    except psycopg.Error as exc:
        return False, connections.classify(
            exc, role=op.source_user, ref=op.source_password_secret_ref, where=where
        )
    return True, success


def _restore_source_access(env: StepEnv) -> bool:
    """§4.6 step 4; True when the source is positively usable again (or never touched)."""
    op, ctx, log = env.op, env.ctx, env.log
    fenced_source = op.source_kind == "cnpg" and (
        op.source_fence_requested_at is not None or ctx.progress.fence_requested
    )
    if op.source_kind == "cnpg" and not fenced_source:
        return True
    if not kind_of(op).may_give_source_login(env):
        _log_binding_not_source(env)
        return False
    if op.source_kind == "external" and not ctx.progress.flipped:
        if binding.names_source(op):
            return True
        _log_binding_not_source(env)
        return False
    timeout = waits.full_source_timeout()
    try:
        source_password = connections.resolve_secret(
            ctx, op.source_password_secret_ref, "the source tenant password"
        )
    except StepError as exc:
        log.error(f"source tenant access recovery failed: {exc}; warehouse remains blocked")
        return False
    observe: Callable[[], tuple[bool, str]]
    if op.source_kind == "cnpg":
        prov = _send_source_login(env)
        if prov is None:
            return False
        observe = _cnpg_source_observer(env, prov, source_password)
        where = f"on source store {op.from_shard}"
    else:
        endpoint = pgadmin.Endpoint(
            op.source_endpoint, op.source_port or 5432, op.source_sslmode or pgadmin.DEFAULT_SSLMODE
        )
        observe = _external_source_observer(env, endpoint, source_password)
        where = f"on external source {op.source_endpoint}:{op.source_port}"
    if not binding.names_source(op):
        # A login that works against the target is never source recovery: no point waiting.
        _log_binding_not_source(env)
        return False
    return _await_source_access(env, timeout, observe, where)


def _log_binding_not_source(env: StepEnv) -> None:
    """Log that source access recovery failed because the binding does not name the source."""
    env.log.error(
        "source tenant access recovery failed: the binding names "
        f"{binding.describe(env.op.org_id)}, not the source; warehouse remains blocked"
    )


def _send_source_login(env: StepEnv) -> connections.Provisioner | None:
    """Un-fence the cnpg source (``ALTER ROLE … LOGIN``); its provisioner, or None (logged)."""
    op, ctx, log = env.op, env.ctx, env.log
    try:
        prov = connections.provisioner(ctx, op.from_shard)
        with connections.provisioner_conn(ctx, prov) as conn:
            refusal = identity.op_role_refusal(conn, op, "source", prov.store)
            if refusal:
                raise StepError(f"{refusal}; not sending ALTER ROLE … LOGIN")
            env.fence.pre_statement_heartbeat()  # a fenced-away runner never un-fences
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(op.source_user)))
        log.info(f"rollback: ALTER ROLE {op.source_user} LOGIN sent on store {op.from_shard}")
    except (psycopg.Error, StepError) as exc:
        log.error(
            f"source tenant access recovery failed: ALTER ROLE {op.source_user} LOGIN on "
            f"store {op.from_shard}: {exc}; warehouse remains blocked"
        )
        return None
    return prov


def _cnpg_source_observer(
    env: StepEnv, prov: connections.Provisioner, source_password: str
) -> Callable[[], tuple[bool, str]]:
    """The poll observation for a cnpg source: binding, role LOGIN, database, tenant probe."""
    op, ctx = env.op, env.ctx

    def observe() -> tuple[bool, str]:
        """One observation: (source usable, what was seen)."""
        if not binding.names_source(op):
            return False, f"binding names {binding.describe(op.org_id)}, not the source"
        try:
            with connections.provisioner_conn(ctx, prov, connect_timeout=8) as conn:
                login = connections.role_state(conn, op.source_user)
                present = connections.database_exists(conn, op.source_database)
        except psycopg.Error as exc:
            return False, connections.classify(
                exc,
                role=prov.store.provisioner_user,
                ref=prov.store.provisioner_password_ref,
                where=f"store {prov.store.name}",
            )
        if login is not True or not present:
            return False, (
                f"source role {op.source_user} "
                + {None: "missing", True: "LOGIN", False: "NOLOGIN"}[login]
                + f", database {op.source_database} {'present' if present else 'missing'}"
            )
        return _tenant_probe(
            env,
            prov.tenant_endpoint,
            source_password,
            where=f"source store {prov.store.name} tenant endpoint",
            success="source role LOGIN, database present, tenant SELECT 1 succeeded",
        )

    return observe


def _external_source_observer(
    env: StepEnv, endpoint: pgadmin.Endpoint, source_password: str
) -> Callable[[], tuple[bool, str]]:
    """The poll observation for an external source: the binding, then a tenant probe."""
    op = env.op

    def observe() -> tuple[bool, str]:
        """One observation: (source usable, what was seen)."""
        if not binding.names_source(op):
            return False, f"binding names {binding.describe(op.org_id)}, not the source"
        return _tenant_probe(
            env,
            endpoint,
            source_password,
            where=f"external source {endpoint.host}:{endpoint.port}",
            success="binding names the source and tenant SELECT 1 succeeded",
        )

    return observe


def _await_source_access(
    env: StepEnv, timeout: float, observe: Callable[[], tuple[bool, str]], where: str
) -> bool:
    """Poll ``observe`` until source tenant access is seen ``where``; False (logged) if not."""
    log = env.log
    try:
        waits.poll_until(
            env.ctx,
            log,
            timeout,
            observe,
            purpose=f"for source tenant access {where}",
            timeout_message=f"source tenant access {where} not observed within {timeout:g} s",
            cancel_aware=False,
            rollback=True,
        )
    except StepError as exc:
        log.error(f"source tenant access recovery failed: {exc}; warehouse remains blocked")
        return False
    log.info(f"rollback: source tenant access verified {where}")
    return True


def unblock(env: StepEnv) -> bool:
    """§4.6 step 5; True when the warehouse moved ``resharding → ready``."""
    return _unblock(env, ROLLED_BACK_MESSAGE)


def unblock_completed(env: StepEnv) -> bool:
    """Roll-forward finish for the recovery command: ``ready`` with the completion message."""
    return _unblock(env, COMPLETE_MESSAGE)


def _unblock(env: StepEnv, message: str) -> bool:
    org = env.op.org_id
    with transaction.atomic():
        locks.lock_org(org)
        prior = (
            ReshardOperation.objects.filter(id=env.op.id)
            .values_list("compaction_prior", flat=True)
            .first()
        )
        restore, value = prior_to_flag(prior)
        fields: dict[str, Any] = {"state": "ready", "status_message": message, "updated_at": Now()}
        if restore:
            fields["compaction_enabled"] = value
        moved = Warehouse.objects.filter(org_id=org, state="resharding").update(**fields)
        if moved == 0:
            found = Warehouse.objects.filter(org_id=org).values_list("state", flat=True).first()
            env.log.warn(
                f"rollback: warehouse is not in the resharding state (found {found or 'no row'});"
                " nothing to unblock"
            )
            return False
        env.fence.update(unblocked_at=Now())
    env.log.info(
        f"warehouse unblocked: resharding → ready ({message})"
        + (f"; compaction_enabled restored to {value}" if restore else "")
    )
    return True


def restore_compaction_only(env: StepEnv) -> None:
    with transaction.atomic():
        prior = (
            ReshardOperation.objects.filter(id=env.op.id)
            .values_list("compaction_prior", flat=True)
            .first()
        )
        restore, value = prior_to_flag(prior)
        if not restore:
            return
        Warehouse.objects.filter(org_id=env.op.org_id, state="resharding").update(
            compaction_enabled=value, updated_at=Now()
        )
        env.fence.update()
    env.log.info(f"compaction_enabled restored to {value}")


def roll_forward(env: StepEnv, finish: Callable[[StepEnv], Any]) -> None:
    """§4.7: never re-point at the source; redo the source drop if unconfirmed (unless the kind
    keeps the source, ``Kind.keep_source``); ``finish``."""
    from reshard.runner.steps.cleanup import drop_source, keep_source

    op = env.op
    op.refresh_from_db()
    _release(env)
    online.close_flip_snapshot(env)
    if not online.remove_capture(env, during_rollback=True):
        env.log.error("roll-forward: the change capture is left on the source (see above)")
    if keep_source(env):
        finish(env)
        return
    if op.source_kind == "cnpg" and op.source_dropped_at is None:
        env.log.info(f"roll-forward: re-running the source drop on store {op.from_shard}")
        drop_source(env)
    kind_of(op).after_source_drop(env)
    finish(env)
