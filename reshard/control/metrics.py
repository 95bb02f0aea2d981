"""Reshard metrics (spec reshard §7), exported by the control worker only.

Only the janitor leader updates them. Gauges are set on every leader tick; non-leaders keep
stale or zero values, so dashboards take the max of a gauge across replicas. The liveness gauge
``duckgres_janitor_last_reconcile_timestamp_seconds`` is set (to this process's wall clock)
only at the end of a tick that a leader *completed*: a non-leader tick, a tick stopped for lack
of leadership and a tick skipped because the active operations could not be listed leave it
unchanged, so ``time() - max(...)`` is the age of the fleet's last completed reconcile (0 until
the process completes one: a dead beat or a disabled schedule makes it age). Counters and
histograms are incremented/observed by exactly one process per event: a respawn by the leader
that performed it, and a terminal op's histograms only by the process that won the CAS on
``metrics_observed_at``. Sum them across replicas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db.models import Max, Q
from django.db.models.functions import Now
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

from duckgres_admin.models import (
    BackupVerification,
    ReshardOperation,
    ReshardStepTiming,
    VerificationResult,
)
from duckgres_admin.models.reshard import TERMINAL_STATES

_log = logging.getLogger("duckgres.reshard.metrics")

STEP_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)
WINDOW_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
STEP_OUTCOMES = ("ok", "failed", "cancelled", "superseded")
RESPAWN_OUTCOMES = ("spawned", "failed")

ACTIVE_OPERATIONS = Gauge(
    "duckgres_reshard_active_operations", "Reshard operations pending or running."
)
STALE_OPERATIONS = Gauge(
    "duckgres_reshard_stale_operations", "Active reshard operations that currently need a runner."
)
RECOVERY_REQUIRED_OPERATIONS = Gauge(
    "duckgres_reshard_recovery_required_operations",
    "Failed reshard operations with recovery_required (awaiting reshard_recover).",
)
RUNNER_RESPAWNS = Counter(
    "duckgres_reshard_runner_respawns_total",
    "Runner relaunches by the janitor, by outcome (spawned, failed).",
    ["outcome"],
)
# Both outcomes exist at zero from process start, so increase() sees the first failure.
for _outcome in RESPAWN_OUTCOMES:
    RUNNER_RESPAWNS.labels(outcome=_outcome)
STEP_DURATION = Histogram(
    "duckgres_reshard_step_duration_seconds",
    "Duration of each reshard step of terminal operations.",
    ["step", "direction", "outcome"],
    buckets=STEP_BUCKETS,
)
MAINTENANCE_WINDOW = Histogram(
    "duckgres_reshard_maintenance_window_seconds",
    "Client-visible downtime (unblocked_at - blocked_at) of terminal operations.",
    ["direction", "outcome"],
    buckets=WINDOW_BUCKETS,
)
JANITOR_IS_LEADER = Gauge(
    "duckgres_janitor_is_leader", "1 while this process holds the janitor lease."
)
JANITOR_LEASE_EPOCH = Gauge(
    "duckgres_janitor_lease_epoch", "Epoch of the janitor lease this process last held."
)
JANITOR_LAST_RECONCILE = Gauge(
    "duckgres_janitor_last_reconcile_timestamp_seconds",
    "Unix time of the last reconcile tick this process completed as janitor leader (0 = none yet).",
)
BACKUP_VERIFIED_AGE = Gauge(
    "duckgres_backup_newest_verified_age_seconds",
    "Age of the newest backup that passed a restore test, per warehouse that has had one "
    "(+Inf: tested, none passed).",
    ["org_id"],
)
BACKUP_NEWEST_TESTED_FAILED = Gauge(
    "duckgres_backup_newest_tested_failed",
    "1 when the newest backup of the warehouse that had a restore test failed it, else 0.",
    ["org_id"],
)
BACKUPS_NEVER_TESTED = Gauge(
    "duckgres_backup_never_tested_warehouses",
    "Warehouses with at least one recorded backup and no restore-test result at all (the "
    "restore test is off, or has not reached them).",
)
# Warehouses exported at most (a bounded label set; the oldest ages win a cut).
MAX_BACKUP_AGE_SERIES = 5000

# Terminal ops observed per tick at most: the first tick after a deploy must not stall.
OBSERVE_BATCH = 200


def set_leadership(is_leader: bool, epoch: int | None) -> None:
    JANITOR_IS_LEADER.set(1 if is_leader else 0)
    if is_leader and epoch is not None:
        JANITOR_LEASE_EPOCH.set(epoch)


def mark_reconcile_completed() -> None:
    """A leader tick ran to its end: set the liveness gauge to now (unix seconds)."""
    JANITOR_LAST_RECONCILE.set_to_current_time()


def set_gauges(*, active: int, stale: int, recovery_required: int) -> None:
    ACTIVE_OPERATIONS.set(active)
    STALE_OPERATIONS.set(stale)
    RECOVERY_REQUIRED_OPERATIONS.set(recovery_required)


def _age(now: datetime, at: datetime | None) -> float:
    return math.inf if at is None else max(0.0, (now - at).total_seconds())


def set_backup_verified_ages(now: datetime) -> int:
    """Two queries. First, per tested warehouse, the age of its newest backup (the object's
    ``LastModified``) that passed a restore test, and whether its newest tested backup failed;
    replaces every series (a warehouse whose rows are gone disappears). Then the number of
    warehouses with a backup that no restore test has covered. Returns the number of warehouses
    exported in the first."""
    rows = list(
        BackupVerification.objects.values("org_id")
        .annotate(
            passed=Max("object_modified", filter=Q(result=VerificationResult.PASSED)),
            tested=Max("object_modified"),
        )
        .values_list("org_id", "passed", "tested")
    )
    ages = sorted(
        ((org, _age(now, passed), passed != tested) for org, passed, tested in rows),
        key=lambda item: item[1],
        reverse=True,
    )[:MAX_BACKUP_AGE_SERIES]
    BACKUP_VERIFIED_AGE.clear()
    BACKUP_NEWEST_TESTED_FAILED.clear()
    for org, age, failed in ages:
        BACKUP_VERIFIED_AGE.labels(org_id=org).set(age)
        BACKUP_NEWEST_TESTED_FAILED.labels(org_id=org).set(1 if failed else 0)
    BACKUPS_NEVER_TESTED.set(_never_tested())
    return len(ages)


def _never_tested() -> int:
    """One query: warehouses whose operations recorded a backup (its digest) while no restore
    test ever wrote a result for them."""
    return (
        ReshardOperation.objects.exclude(backup_sha256="")
        .exclude(org_id__in=BackupVerification.objects.values("org_id"))
        .values("org_id")
        .distinct()
        .count()
    )


def count_respawn(outcome: str) -> None:
    RUNNER_RESPAWNS.labels(outcome=outcome).inc()


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def observe_operation(op: ReshardOperation, steps: Iterable[ReshardStepTiming]) -> int:
    """Observe the histograms of one terminal op (call only after winning the CAS)."""
    observed = 0
    for timing in steps:
        duration = _seconds(timing.started_at, timing.ended_at)
        if duration is None or timing.outcome not in STEP_OUTCOMES:
            continue
        STEP_DURATION.labels(
            step=timing.step, direction=op.direction, outcome=timing.outcome
        ).observe(duration)
        observed += 1
    window = _seconds(op.blocked_at, op.unblocked_at)
    if window is not None:
        MAINTENANCE_WINDOW.labels(direction=op.direction, outcome=op.state).observe(window)
        observed += 1
    return observed


def observe_terminal_operations(limit: int = OBSERVE_BATCH) -> int:
    """Observe histograms for terminal ops not yet observed; returns how many ops were won.

    Each op is claimed first by ``UPDATE … SET metrics_observed_at = now() WHERE id = :id AND
    metrics_observed_at IS NULL``; only the process whose update matched observes it, so two
    leaders in a row (or a leader that lost its lease mid-tick) never double-count.
    """
    candidates = list(
        ReshardOperation.objects.filter(state__in=TERMINAL_STATES, metrics_observed_at__isnull=True)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    won = 0
    for op_id in candidates:
        claimed = ReshardOperation.objects.filter(
            id=op_id, state__in=TERMINAL_STATES, metrics_observed_at__isnull=True
        ).update(metrics_observed_at=Now())
        if claimed != 1:
            continue
        op = ReshardOperation.objects.get(id=op_id)
        steps = ReshardStepTiming.objects.filter(operation_id=op_id).order_by("id")
        observe_operation(op, steps)
        won += 1
    return won


_server_started = False


def start_exporter(port: int | None = None) -> bool:
    """Start the Prometheus HTTP exporter once per process; port 0 disables it."""
    global _server_started
    port = settings.DUCKGRES_CONTROL_METRICS_PORT if port is None else port
    if port == 0 or _server_started:
        return False
    start_http_server(port, registry=REGISTRY)
    _server_started = True
    _log.info("control worker metrics exporter listening on :%d", port)
    return True
