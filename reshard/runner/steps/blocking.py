"""Step A ``blocking`` (spec reshard §4.4 A; safeguards 20, 42, 47).

The runner has stamped ``blocking`` before this runs. One config-store transaction: the per-org
advisory lock (the lease grant path and warehouse PATCH take the same lock), the Trino re-check,
the warehouse CAS ``ready → resharding`` (or the no-op ``resharding → resharding`` probe of a
takeover redoing the steps, accepted only when the op row shows this very op blocked it:
``blocked_at`` set and ``unblocked_at`` empty, read inside the transaction under the per-org
lock; safeguard reshard-73), and the fenced op update
``blocked_at = COALESCE(blocked_at, now())``. A fenced update matching zero rows rolls the whole
transaction back, so a fenced-away runner's block never lands. Then the cancel-aware
propagation wait (during which the backup step's S3 client and source facts are prepared in a
helper thread: ``backup_catalog.prepare``), then ``recordSource`` (B).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Coalesce, Now

from duckgres_admin.models import ReshardOperation, Warehouse
from duckgres_admin.platform import orglock as locks
from reshard.runner import waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError
from reshard.runner.steps import backup_catalog, record_source

BLOCK_MESSAGE = "metadata-store reshard in progress"
DEFAULT_WAIT_WHEN_UNSET = 10.0


def run(env: StepEnv) -> None:
    block_warehouse(env)
    # The backup's S3 client and source facts, in a helper thread while the wait runs.
    backup_catalog.prepare(env)
    wait_for_propagation(env)
    record_source.run(env)


def _trino_enabled(org_id: str) -> bool:
    """The Trino re-check; until the Trino warehouse table exists no org is Trino-enabled."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('duckgres_managed_warehouse_trino') IS NOT NULL")
        row = cursor.fetchone()
        if not row or not row[0]:
            return False
        cursor.execute(
            "SELECT enabled FROM duckgres_managed_warehouse_trino WHERE org_id = %s", [org_id]
        )
        found = cursor.fetchone()
    return bool(found and found[0])


def block_warehouse(env: StepEnv) -> None:
    """The block transaction; raises ``Fenced`` (nothing blocked) or ``StepError``."""
    org = env.op.org_id
    already = False
    with transaction.atomic():
        locks.lock_org(org)
        if _trino_enabled(org):
            raise StepError(
                "Trino was enabled for this warehouse after the operation was submitted; "
                "disable it and re-run"
            )
        moved = Warehouse.objects.filter(org_id=org, state="ready").update(
            state="resharding", status_message=BLOCK_MESSAGE, updated_at=Now()
        )
        if moved == 0:
            # Ours only: the block and ``blocked_at`` commit together, so a resharding
            # warehouse with this op's ``blocked_at`` set (and never unblocked) is our block.
            mine = ReshardOperation.objects.filter(
                id=env.op.id, blocked_at__isnull=False, unblocked_at__isnull=True
            ).exists()
            already = (
                mine
                and Warehouse.objects.filter(org_id=org, state="resharding").update(
                    state="resharding"
                )
                == 1
            )
            if not already:
                raise StepError("warehouse is not ready (another lifecycle operation in flight?)")
        env.fence.update(blocked_at=Coalesce("blocked_at", Now()))
    env.ctx.progress.blocked = True
    if already:
        env.log.info("already in resharding state (takeover or restart) — continuing")
    else:
        env.log.info(
            "warehouse blocked: ready → resharding; new connection leases are refused until "
            "the operation ends"
        )


def propagation_seconds() -> float:
    interval = float(settings.DUCKGRES_CONFIG_POLL_INTERVAL)
    return 2 * interval if interval > 0 else DEFAULT_WAIT_WHEN_UNSET


def wait_for_propagation(env: StepEnv) -> None:
    waits.hold(
        env.ctx,
        env.log,
        propagation_seconds(),
        purpose="for data-plane replicas to observe the block (2 x DUCKGRES_CONFIG_POLL_INTERVAL)",
    )
