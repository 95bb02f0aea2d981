"""The shared-pool operator: terms and one tick (spec trino-pools §4.3, §4.4).

One ``Operator`` lives in the trino worker process (Celery queue ``duckgres.trino``, solo pool).
Beat calls ``trino.pool_tick`` every 5 s; the task calls ``operator().tick()``. Each pool's tick
hands its steps a ``PoolContext`` carrying this operator's ``ensure_leading``, never the operator.

Invariants:

1. **Leadership decides who executes, fences decide what commits.** A tick runs only while this
   process holds the ``trino`` lease (renewed at the start of the tick and again before each
   pool's effects; past the renew deadline the tick stops and every term ends). Correctness
   comes from the per-pool authority epoch (``authority``), the Gateway's ``controllerEpoch`` +
   ``ownerIdentity`` fence and the catalog store's ``writer_epoch``.
2. **Terms.** A pool's term starts on the first tick at which this process leads and has no
   live term for it: the previous authority is forgotten, the catalog writer released, the
   metrics term begun, then the authority acquired (epoch + 1) and the catalog writer taken
   over (its revision checkpointed). A term ends when the lease is lost (all at once), on
   worker shutdown, or on a fence refusal. A fenced term does not come back: no new term for
   that pool starts until one full lease duration has passed.
3. **Bounded, isolated work.** Pools run in registry order, each in its own ``try``: a failing
   pool is counted and logged, and the next pool still runs. Within a pool: at most one
   instance step, one lifecycle action (create or drain) and one external tenant step per
   tick; only a lost fence stops the pool's tick.
4. **Missing configuration is never desired zero.** Unreadable, vanished or stale desired
   configuration freezes the pool (fenced write) and stops its tick before any create, drain
   or delete.
5. **Metrics come from durable rows** and are written only with the live term's token; the
   snapshot is taken after a successful instance listing and before any effect of the tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from duckgres_admin.lib.gateway import GatewayClient
from duckgres_admin.models.trino import TrinoPool
from trino_pools import authority, catalog_writer, config, lease, term_metrics
from trino_pools.authority import PoolConflict
from trino_pools.desired import read_desired
from trino_pools.operator import admission, instances
from trino_pools.operator.context import PoolContext, PoolTerm
from trino_pools.operator.errors import LeadershipLost, StaleGeneration
from trino_pools.operator.pool import (
    configure_gateway_pool,
    freeze,
    list_instances,
    record_snapshot,
    seed_pool,
    thaw,
    upsert_spec,
)
from trino_pools.registry import Cell

_log = logging.getLogger("duckgres.trino.operator")


RENEW_MIN_INTERVAL_SECONDS = 1.0


GatewayFactory = Callable[[config.TrinoSettings], GatewayClient]


def read_token(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return text[:-1] if text.endswith("\n") else text


def default_gateway(settings: config.TrinoSettings) -> GatewayClient:
    return GatewayClient(
        settings.gateway_url,
        read_token(settings.rollout_token_file),
        server_name=settings.gateway_server_name,
    )


@dataclass
class TickReport:
    leader: bool = False
    pools: dict[str, str] = field(default_factory=dict)  # public id -> outcome


class Operator:
    """This process's pool operator (one per process; the trino worker is solo)."""

    def __init__(
        self,
        *,
        gateway_factory: GatewayFactory = default_gateway,
        leader_lease: lease.TrinoLease | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway_factory = gateway_factory
        self._lease = leader_lease
        self._clock = clock
        self._lock = threading.RLock()
        self.terms: dict[str, PoolTerm] = {}
        self.fenced_until: dict[str, float] = {}
        self._gateway: GatewayClient | None = None
        self._lease_epoch: int | None = None  # the lease epoch the live terms started under

    # --- leadership -------------------------------------------------------------------------------
    @property
    def lease(self) -> lease.TrinoLease:
        return self._lease if self._lease is not None else lease.lease()

    def ensure_leading(self) -> None:
        """Renew before an effect; raise ``LeadershipLost`` once acting is no longer allowed.

        A renewal younger than ``RENEW_MIN_INTERVAL_SECONDS`` is not repeated (the tick calls
        this before every pool and effect; the renew deadline still bounds acting).
        """
        lease = self.lease
        fresh = lease.renew_deadline_seconds() - RENEW_MIN_INTERVAL_SECONDS
        if lease.acting_allowed() and lease.seconds_left() > fresh:
            return
        if not lease.ensure():
            raise LeadershipLost("the trino lease was lost or its renew deadline passed")

    # --- terms ------------------------------------------------------------------------------------
    def end_term(self, pool_id: str, *, fenced: bool = False, reason: str = "") -> None:
        with self._lock:
            term = self.terms.pop(pool_id, None)
            if fenced:
                # Also when the refusal came while a term was starting (acquire or the writer
                # takeover): a fenced pool is never re-acquired before one lease duration.
                self.fenced_until[pool_id] = self._clock() + self.lease.duration_seconds()
        if term is None:
            if fenced:
                _log.warning(
                    "Trino pool term not started (fenced): %s", reason, extra={"pool_id": pool_id}
                )
            return
        authority.HOLDER.clear(pool_id, term.auth)
        catalog_writer.uninstall(pool_id)
        term_metrics.end_term(term.auth.public_id, term.metrics_token)
        if term.validator is not None:
            term.validator.clear()
        _log.warning(
            "Trino pool term ended%s: %s",
            " (fenced)" if fenced else "",
            reason or "leadership ended",
            extra={"pool_id": pool_id, "epoch": term.auth.epoch, "fenced": fenced},
        )

    def end_all_terms(self, reason: str) -> None:
        for pool_id in list(self.terms):
            self.end_term(pool_id, reason=reason)

    def _begin_term(self, settings: config.TrinoSettings, cell: Cell) -> PoolTerm | None:
        pool_id = cell.stored_id
        until = self.fenced_until.get(pool_id)
        if until is not None and self._clock() < until:
            _log.info(
                "Trino pool term not started: fenced %.0f s ago, waiting one lease duration",
                self.lease.duration_seconds() - (until - self._clock()),
                extra={"pool_id": pool_id},
            )
            return None
        self.fenced_until.pop(pool_id, None)
        authority.HOLDER.clear(pool_id)
        catalog_writer.uninstall(pool_id)
        token = term_metrics.begin_term(cell.id)
        auth = authority.acquire(pool_id, self.lease.holder)
        term = PoolTerm(pool_id=pool_id, auth=auth, metrics_token=token, started_mono=self._clock())
        authority.HOLDER.install(auth)
        try:
            if settings.catalog_writer_enabled:
                catalog_writer.claim(auth, settings)  # takeover, watermark, install
        except Exception:
            authority.HOLDER.clear(pool_id, auth)
            term_metrics.end_term(cell.id, token)
            raise
        with self._lock:
            self.terms[pool_id] = term
        _log.info(
            "Trino pool term started",
            extra={"pool_id": pool_id, "epoch": auth.epoch, "owner": auth.owner},
        )
        return term

    # --- the tick ---------------------------------------------------------------------------------
    def tick(self, settings: config.TrinoSettings | None = None) -> TickReport:
        settings = settings or config.current()
        report = TickReport()
        if not settings.wired or not settings.operator_enabled:
            return report  # read-only operator: no seed, no authority, no calls (§4.15)
        if not self.lease.acquire():
            self.end_all_terms("the trino lease is not held by this process")
            return report
        if self._lease_epoch is not None and self.lease.epoch != self._lease_epoch:
            # The lease was lost and taken again (perhaps by another task of this process):
            # a term never spans a leadership gap.
            self.end_all_terms("the trino lease was lost and re-taken since the last tick")
        self._lease_epoch = self.lease.epoch
        report.leader = True
        for cell in settings.cells:
            try:
                self.ensure_leading()
            except LeadershipLost as exc:
                self.end_all_terms(str(exc))
                report.pools[cell.id] = "leadership lost"
                break
            report.pools[cell.id] = self._pool_tick_isolated(settings, cell)
        return report

    def _pool_tick_isolated(self, settings: config.TrinoSettings, cell: Cell) -> str:
        errors: list[BaseException] = []
        try:
            return self.pool_tick(settings, cell, errors)
        except LeadershipLost as exc:
            self.end_all_terms(str(exc))
            return "leadership lost"
        except (PoolConflict, catalog_writer.WriterFenced) as exc:
            errors.append(exc)
            self.end_term(cell.stored_id, fenced=True, reason=str(exc))
            return f"fenced: {exc}"
        except Exception as exc:  # noqa: BLE001 - isolation: one pool never stops the others
            errors.append(exc)
            _log.exception("Trino pool tick failed: %s", exc, extra={"pool_id": cell.stored_id})
            return f"failed: {exc}"
        finally:
            reason = term_metrics.failure_reason(errors)
            if reason is not None:
                term_metrics.count_failure(cell.id, reason)

    def gateway(self, settings: config.TrinoSettings) -> GatewayClient:
        if self._gateway is None:
            self._gateway = self._gateway_factory(settings)
        return self._gateway

    def pool_tick(
        self, settings: config.TrinoSettings, cell: Cell, errors: list[BaseException]
    ) -> str:
        desired = read_desired(settings, cell)  # 1. one read of the pool's own ConfigMap
        seed_pool(cell)  # 2. the only unfenced write
        term = self.terms.get(cell.stored_id) or self._begin_term(settings, cell)  # 3.
        if term is None:
            return "waiting: fenced recently"
        auth = term.auth
        if desired.frozen_reason:  # 4.
            freeze(auth, desired.frozen_reason)
            return f"frozen: {desired.frozen_reason}"
        try:
            upsert_spec(auth, desired)  # 5.
        except StaleGeneration as exc:
            freeze(auth, str(exc))
            return f"frozen: {exc}"
        thaw(auth)  # 6.
        pool = TrinoPool.objects.get(pool_id=cell.stored_id)
        ctx = PoolContext(
            self.ensure_leading, settings, desired.cell, desired, term, self.gateway(settings), pool
        )
        self.ensure_leading()
        configure_gateway_pool(ctx)  # 7.
        try:
            admission.run(ctx)  # 8. failures are counted, never stop instance work
        except (PoolConflict, catalog_writer.WriterFenced, LeadershipLost):
            raise
        except Exception as exc:  # noqa: BLE001 - tenant isolation (invariant 8)
            errors.append(exc)
            _log.warning("Trino tenant admission failed: %s", exc, extra=ctx.log_extra())
        rows = list_instances(cell.stored_id)  # 9. a failed read changes no metric sample
        record_snapshot(ctx, rows)
        self.ensure_leading()
        if instances.progress(ctx, rows, errors):  # 10.
            return "progressed"
        return instances.apply_plan(ctx, rows)  # 11.


# --- process-wide operator -----------------------------------------------------------------------

_operator_lock = threading.Lock()
_operator: Operator | None = None


def operator() -> Operator:
    global _operator
    with _operator_lock:
        if _operator is None:
            _operator = Operator()
        return _operator


@contextmanager
def installed(op: Operator) -> Iterator[Operator]:
    """Use ``op`` as the process operator (tests)."""
    global _operator
    with _operator_lock:
        previous, _operator = _operator, op
    try:
        yield op
    finally:
        with _operator_lock:
            _operator = previous


def shutdown() -> None:
    """``worker_shutdown``: end every term (metrics removed, writer released)."""
    with _operator_lock:
        op = _operator
    if op is not None:
        op.end_all_terms("worker shutdown")
