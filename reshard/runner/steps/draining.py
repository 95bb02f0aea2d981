"""Step D ``draining`` (spec §4.4 D; safeguard 31).

Each pass is one config-store transaction under the per-org lock: expire dead leases
(``granted`` past ``expires_at``) and dead queued requests (past ``queue_deadline``), then count
active leases and queued requests. Done at zero and zero. Never revokes a lease or kills a query.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from duckgres_admin.models import ConnectionLease
from duckgres_admin.platform import orglock as locks
from reshard.runner import waits
from reshard.runner.env import StepEnv
from reshard.runner.errors import Cancelled, Interrupted, StepError

DEFAULT_DRAIN_SECONDS = 1800


def drain_pass(org: str) -> tuple[int, int, list[str]]:
    with transaction.atomic():
        locks.lock_org(org)
        ConnectionLease.objects.filter(org_id=org, state="granted", expires_at__lte=Now()).update(
            state="expired"
        )
        ConnectionLease.objects.filter(
            org_id=org, state="queued", queue_deadline__lte=Now()
        ).update(state="expired")
        active = ConnectionLease.objects.filter(org_id=org, state="granted")
        queued = ConnectionLease.objects.filter(org_id=org, state="queued").count()
        holders = list(active.order_by("id").values_list("holder", flat=True)[:5])
        return active.count(), queued, holders


def run(env: StepEnv) -> None:
    ctx, op = env.ctx, env.op
    timeout = op.drain_timeout_seconds if op.drain_timeout_seconds > 0 else DEFAULT_DRAIN_SECONDS
    poll = float(settings.DUCKGRES_RESHARD_POLL_SECONDS)
    deadline = time.monotonic() + timeout
    env.log.info(f"draining connection leases (deadline in {timeout} s); leases are never revoked")
    next_log = time.monotonic() + waits.OBSERVATION_INTERVAL
    while True:
        if ctx.stop.is_set():
            raise Interrupted()
        if waits.cancel_requested(op.id):
            raise Cancelled()
        try:
            active, queued, holders = drain_pass(op.org_id)
        except Exception as exc:  # noqa: BLE001 - a store error fails the step (spec §4.4 D)
            raise StepError(f"drain failed reading the leases: {exc}") from None
        if active == 0 and queued == 0:
            env.log.info("drained: 0 active leases, 0 queued requests")
            return
        if time.monotonic() >= deadline:
            raise StepError(
                f"drain timed out after {timeout} s ({active} active leases, {queued} queued "
                "requests)"
            )
        if time.monotonic() >= next_log:
            env.log.info(
                f"still draining: {active} active leases, {queued} queued requests"
                + (f" (holders: {', '.join(holders)})" if holders else "")
                + f"; {deadline - time.monotonic():.0f} s left"
            )
            next_log = time.monotonic() + waits.OBSERVATION_INTERVAL
        ctx.stop.wait(min(poll, max(0.0, deadline - time.monotonic())))
