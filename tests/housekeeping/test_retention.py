"""Retention of the config store's growing tables (safeguard reshard-134), on the real store.

Tens of thousands of old rows per table — where a table nobody prunes would show — next to the
rows that must stay: recent ones, an active operation's log, a log waiting for a recovery,
outbox rows still to deliver, granted leases, live sessions. One run deletes exactly the old
ended ones in bounded batches; a run whose budget is spent says so and the next one finishes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.db import connection

from duckgres_admin.housekeeping import policy
from duckgres_admin.housekeeping.policy import RetentionDays
from duckgres_admin.housekeeping.prune import TARGETS, prune
from duckgres_admin.platform.config import EnvReader
from tests.fixtures.rows import new_op, new_store, new_warehouse

pytestmark = [pytest.mark.django_db, pytest.mark.safeguard("reshard-134")]

OLD = 50_000  # old rows per table
DAYS = RetentionDays(
    op_logs=30, audit=30, notifications=30, leases=7, batch=5000, budget_seconds=300
)


def _sql(statement: str, params: dict[str, Any] | None = None) -> None:
    with connection.cursor() as cur:
        cur.execute(statement, params or {})


def _count(statement: str) -> int:
    with connection.cursor() as cur:
        cur.execute(statement)
        return int(cur.fetchone()[0])


def _op(state: str, ended_days_ago: int | None, **extra: Any) -> int:
    wh = new_warehouse(
        store=new_store(),
        metadata_store_database="cat",
        metadata_store_user="tenant",
        metadata_store_password_ref="env:X",
    )
    op = new_op(wh, to_store=new_store(), state=state, **extra)
    if ended_days_ago is not None:
        _sql(
            "UPDATE duckgres_reshard_operations SET finished_at = now() - make_interval("
            "days => %(d)s) WHERE id = %(id)s",
            {"d": ended_days_ago, "id": op.id},
        )
    return op.id


def _log_rows(op_id: int, n: int) -> None:
    _sql(
        "INSERT INTO duckgres_reshard_operation_log (operation_id, ts, level, message, source) "
        "SELECT %(op)s, now(), 'info', 'line ' || g, 'runner' FROM generate_series(1, %(n)s) g",
        {"op": op_id, "n": n},
    )
    _sql(
        "INSERT INTO duckgres_reshard_operation_steps (operation_id, step, runner_epoch, "
        "started_at, outcome) SELECT %(op)s, 'copying', 1, now(), 'ok' "
        "FROM generate_series(1, 3)",
        {"op": op_id},
    )


@pytest.fixture
def world() -> dict[str, int]:
    ids = {
        "old_ended": _op("succeeded", 40),
        "recent_ended": _op("failed", 2),
        "active": _op("running", None),
        "recovery": _op("failed", 40, recovery_required=True),
    }
    _log_rows(ids["old_ended"], OLD)
    for key in ("recent_ended", "active", "recovery"):
        _log_rows(ids[key], 10)
    audit = (
        "INSERT INTO duckgres_audit_log (at, actor, role, source, method, path, org_id, status, "
        "client_ip, action, detail) SELECT now() - make_interval(days => %(d)s), 'a', '', "
        "'session', 'POST', '/x', '', 200, '', '', '' FROM generate_series(1, %(n)s)"
    )
    _sql(audit, {"d": 40, "n": OLD})
    _sql(audit, {"d": 1, "n": 10})
    outbox = (
        "INSERT INTO duckgres_notifications (kind, subject_id, event, payload, state, attempts, "
        "last_error, created_at, next_attempt_at) SELECT 'reshard', g, %(s)s || %(d)s, '{}', "
        "%(s)s, 1, '', now() - make_interval(days => %(d)s), now() "
        "FROM generate_series(1, %(n)s) g"
    )
    _sql(outbox, {"s": "delivered", "d": 40, "n": OLD})
    _sql(outbox, {"s": "failed", "d": 40, "n": 5})
    _sql(outbox, {"s": "pending", "d": 40, "n": 5})  # still to deliver: kept whatever its age
    _sql(outbox, {"s": "delivered", "d": 1, "n": 5})
    leases = (
        "INSERT INTO duckgres_connection_leases (org_id, holder, purpose, state, requested_at, "
        "released_at) SELECT 'org', 'h', 'query', %(s)s, now() - make_interval(days => %(d)s), "
        "now() - make_interval(days => %(d)s) FROM generate_series(1, %(n)s)"
    )
    _sql(leases, {"s": "released", "d": 10, "n": OLD})
    _sql(leases, {"s": "granted", "d": 10, "n": 5})
    _sql(leases, {"s": "released", "d": 1, "n": 5})
    sessions = (
        "INSERT INTO django_session (session_key, session_data, expire_date) "
        "SELECT md5(%(tag)s || g), 'x', now() + make_interval(days => %(d)s) "
        "FROM generate_series(1, %(n)s) g"
    )
    _sql(sessions, {"tag": "old", "d": -1, "n": OLD})
    _sql(sessions, {"tag": "live", "d": 7, "n": 5})
    return ids


def test_one_run_deletes_exactly_the_old_ended_rows_in_batches(world) -> None:
    report = prune(DAYS)
    assert report.unfinished == []
    assert report.deleted == {
        "sessions": OLD,
        "op_log": OLD,
        "op_steps": 3,
        "audit": OLD,
        "notifications": OLD + 5,
        "leases": OLD,
    }
    logs = {
        key: _count(
            f"SELECT count(*) FROM duckgres_reshard_operation_log WHERE operation_id = {op_id}"
        )
        for key, op_id in world.items()
    }
    assert logs == {"old_ended": 0, "recent_ended": 10, "active": 10, "recovery": 10}
    assert _count("SELECT count(*) FROM duckgres_reshard_operations") == 4  # ops stay
    assert _count("SELECT count(*) FROM duckgres_audit_log") == 10
    assert _count("SELECT count(*) FROM duckgres_notifications") == 10  # pending + recent
    assert _count("SELECT count(*) FROM duckgres_notifications WHERE state = 'pending'") == 5
    assert _count("SELECT count(*) FROM duckgres_connection_leases") == 10
    assert _count("SELECT count(*) FROM django_session") == 5
    assert prune(DAYS).deleted == dict.fromkeys(report.deleted, 0)  # nothing left to do


def test_a_spent_budget_leaves_the_rest_to_the_next_run(world) -> None:
    ticks = iter(range(1000))
    first = prune(replace(DAYS, budget_seconds=10), clock=lambda: float(next(ticks)))
    assert first.unfinished, first  # each batch costs a "second": the budget runs out
    assert sum(first.deleted.values()) < 4 * OLD
    second = prune(DAYS, clock=lambda: 0.0)  # a budget that never runs out (no wall clock)
    assert second.unfinished == []
    assert _count("SELECT count(*) FROM duckgres_audit_log") == 10
    assert _count("SELECT count(*) FROM django_session") == 5


def test_zero_days_keeps_a_table_for_ever(world) -> None:
    report = prune(replace(DAYS, audit=0))
    assert "audit" not in report.deleted
    assert _count("SELECT count(*) FROM duckgres_audit_log") == OLD + 10


def test_outbox_rows_must_outlive_the_webhook_look_back() -> None:
    env = EnvReader({"DUCKGRES_RETENTION_NOTIFICATION_DAYS": "1"})
    policy.from_env(env, webhook_lookback_seconds=2 * 86400)
    assert any("DUCKGRES_RETENTION_NOTIFICATION_DAYS" in e and "LOOKBACK" in e
               for e in env.errors), env.errors  # fmt: skip
    env = EnvReader({"DUCKGRES_RETENTION_NOTIFICATION_DAYS": "1"})
    days = policy.from_env(env, webhook_lookback_seconds=86400 // 2)
    assert env.errors == []
    assert days.notifications == 1


def test_every_batch_is_collected_once_and_deleted_by_key_whatever_the_statistics(world) -> None:
    """The world's tables were just filled and never analyzed: the planner believes them
    nearly empty. An ``IN (SELECT … LIMIT …)`` batch then became a semi join that re-ran its
    subquery for every row (over 40 s per batch in CI); the array form is planned once."""
    with connection.cursor() as cur:
        for target in TARGETS:
            cur.execute("EXPLAIN " + target.sql, {"days": 30, "batch": 5000})
            plan = "\n".join(str(row[0]) for row in cur.fetchall())
            assert "Semi Join" not in plan, (target.name, plan)
            assert "InitPlan" in plan, (target.name, plan)
