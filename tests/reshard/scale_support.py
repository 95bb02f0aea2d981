"""Bulk rows for fleet-scale janitor checks (the test and ``bench/bench_janitor.py``).

Rows are cloned from one operation made by the ordinary fixtures, in one ``INSERT … SELECT``
over ``generate_series`` per kind, so 100,000 finished operations take seconds, not minutes.
"""

from __future__ import annotations

from django.db import connection

from duckgres_admin.models import ReshardOperation

# Overrides per kind: SQL expressions over the template row and the series value ``g``.
KINDS: dict[str, dict[str, str]] = {
    "finished": {
        "state": "'succeeded'",
        "finished_at": "now() - interval '2 days'",
        "metrics_observed_at": "now() - interval '2 days'",
        "heartbeat_at": "NULL",
    },
    "fresh": {  # running with a live heartbeat: the janitor must not touch them
        "state": "'running'",
        "runner_epoch": "1",
        "step": "'copying'",
        "started_at": "now()",
        "heartbeat_at": "now()",
        "blocked_at": "now()",
    },
    "pending": {  # pending within the grace: nothing to do either
        "state": "'pending'",
        "created_at": "now()",
    },
}


def _columns() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND column_name <> 'id' ORDER BY ordinal_position",
            [ReshardOperation._meta.db_table],
        )
        return [str(row[0]) for row in cursor.fetchall()]


def clone(template: ReshardOperation, kind: str, count: int, prefix: str) -> None:
    """``count`` copies of ``template`` as ``kind`` rows, org ids ``<prefix>-<kind>-<n>``."""
    if count <= 0:
        return
    overrides = {**KINDS[kind], "org_id": f"'{prefix}-{kind}-' || g"}
    columns = _columns()
    select = ", ".join(overrides.get(name, f't."{name}"') for name in columns)
    names = ", ".join(f'"{name}"' for name in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {ReshardOperation._meta.db_table} ({names}) "
            f"SELECT {select} FROM {ReshardOperation._meta.db_table} t "
            "CROSS JOIN generate_series(1, %s) AS g WHERE t.id = %s",
            [count, template.id],
        )
        cursor.execute(f"ANALYZE {ReshardOperation._meta.db_table}")
