"""Delete what the config store no longer needs, in bounded batches (docs/operations.md
"Retention").

Each target is one ``DELETE … WHERE <key> = ANY(ARRAY(SELECT <key> … LIMIT batch))`` repeated
until a batch comes back short or the run's time budget is spent; every statement runs in its own
transaction under a ``statement_timeout`` and a ``lock_timeout``, so a run never holds a long
lock and a failed statement loses only its own batch. Deleting is idempotent: two runs at once
only share the work, and an interrupted run is finished by the next one.

What goes (never anything else):

- expired Django sessions (what ``clearsessions`` does);
- the log and step-timing rows of operations that ended (succeeded, failed or cancelled, and
  not waiting for a recovery) more than ``op_logs`` days ago — the operation rows stay;
- audit rows older than ``audit`` days;
- delivered or given-up outbox rows older than ``notifications`` days;
- released, expired and refused connection-lease rows that ended more than ``leases`` days ago.

A target whose days are 0 is kept for ever.

The batch is collected once, as an array (an InitPlan), and deleted by key through the key's
index. The ``IN (SELECT … LIMIT …)`` form it replaced let the planner, with statistics that
did not yet know a freshly filled table, choose a semi join that re-ran the whole subquery for
every row of the table: one 5,000-row batch of 50,000 sessions took over 40 s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from duckgres_admin.housekeeping.policy import RetentionDays

_log = logging.getLogger("duckgres.housekeeping")

STATEMENT_TIMEOUT = "60s"
LOCK_TIMEOUT = "5s"

_ENDED_OPS = (
    "SELECT o.id FROM duckgres_reshard_operations o "
    "WHERE o.state IN ('succeeded', 'failed', 'cancelled') AND NOT o.recovery_required "
    "AND o.finished_at < now() - make_interval(days => %(days)s)"
)


@dataclass(frozen=True)
class Target:
    name: str
    days: Callable[[RetentionDays], int | None]  # None: always (no age setting)
    sql: str  # %(days)s and %(batch)s


TARGETS: tuple[Target, ...] = (
    Target(
        "sessions",
        lambda d: None,
        "DELETE FROM django_session WHERE session_key = ANY(ARRAY(SELECT session_key FROM "
        "django_session WHERE expire_date < now() LIMIT %(batch)s))",
    ),
    Target(
        "op_log",
        lambda d: d.op_logs,
        "DELETE FROM duckgres_reshard_operation_log WHERE id = ANY(ARRAY(SELECT id FROM "
        f"duckgres_reshard_operation_log WHERE operation_id IN ({_ENDED_OPS}) "
        "ORDER BY id LIMIT %(batch)s))",
    ),
    Target(
        "op_steps",
        lambda d: d.op_logs,
        "DELETE FROM duckgres_reshard_operation_steps WHERE id = ANY(ARRAY(SELECT id FROM "
        f"duckgres_reshard_operation_steps WHERE operation_id IN ({_ENDED_OPS}) "
        "ORDER BY id LIMIT %(batch)s))",
    ),
    Target(
        "audit",
        lambda d: d.audit,
        "DELETE FROM duckgres_audit_log WHERE id = ANY(ARRAY(SELECT id FROM duckgres_audit_log "
        "WHERE at < now() - make_interval(days => %(days)s) ORDER BY id LIMIT %(batch)s))",
    ),
    Target(
        "notifications",
        lambda d: d.notifications,
        "DELETE FROM duckgres_notifications WHERE id = ANY(ARRAY(SELECT id FROM "
        "duckgres_notifications WHERE state IN ('delivered', 'failed') "
        "AND created_at < now() - make_interval(days => %(days)s) ORDER BY id LIMIT %(batch)s))",
    ),
    Target(
        "leases",
        lambda d: d.leases,
        "DELETE FROM duckgres_connection_leases WHERE id = ANY(ARRAY(SELECT id FROM "
        "duckgres_connection_leases WHERE state IN ('released', 'expired', 'refused') "
        "AND coalesce(released_at, expires_at, requested_at) "
        "< now() - make_interval(days => %(days)s) ORDER BY id LIMIT %(batch)s))",
    ),
)


@dataclass
class PruneReport:
    deleted: dict[str, int] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)  # budget spent or a statement failed


def _batch(target: Target, days: int | None, batch: int) -> int:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute(target.sql, {"days": days or 0, "batch": batch})
        return int(cur.rowcount)


def prune(
    days: RetentionDays | None = None, *, clock: Callable[[], float] = time.monotonic
) -> PruneReport:
    """One run over every target (module docstring)."""
    days = days or settings.DUCKGRES_RETENTION
    deadline = clock() + days.budget_seconds
    report = PruneReport()
    for target in TARGETS:
        age = target.days(days)
        if age == 0:
            continue  # kept for ever
        total = 0
        while True:
            if clock() >= deadline:
                report.unfinished.append(target.name)
                _log.warning(
                    "retention: the run's budget of %d s is spent; %s resumes next run "
                    "(%d deleted so far)", days.budget_seconds, target.name, total,
                )  # fmt: skip
                break
            try:
                deleted = _batch(target, age, days.batch)
            except DatabaseError as exc:
                report.unfinished.append(target.name)
                _log.warning("retention: deleting from %s failed, next run retries: %s",
                             target.name, exc)  # fmt: skip
                break
            total += deleted
            if deleted < days.batch:
                break
        report.deleted[target.name] = total
    if any(report.deleted.values()):
        _log.info(
            "retention: deleted %s",
            ", ".join(f"{n} {name}" for name, n in report.deleted.items() if n),
        )
    return report
