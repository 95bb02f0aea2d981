"""Maintenance-window benchmark (issue 3): blocked → unblocked against backup + copy.

Run after a real reshard, e.g. ``make demo`` (which moves a 2,000-table DuckLake catalog):

    .venv/bin/python bench/bench_window.py [--dsn <config-store DSN>] [--op ID]

(the DSN defaults to the demo's config store).

It reads the operation row and its step timings from the config store (every figure is the
database clock's), and prints, per operation, ``name: value unit (ratio vs baseline)`` lines:
the baseline is backup + copy of the same run; the issue's target is window <= 1.3 x baseline
+ 5 s. The post-block propagation wait (2 x DUCKGRES_CONFIG_POLL_INTERVAL: 60 s with the
production default of 30 s, 4 s in the demo) is inside the window by design and is reported on
its own line so the figure can be read either way.
"""

from __future__ import annotations

import argparse

import psycopg

QUERY = """
SELECT o.id, extract(epoch FROM o.unblocked_at - o.blocked_at),
       coalesce(sum(extract(epoch FROM s.ended_at - s.started_at))
                FILTER (WHERE s.step = 'backup_catalog'), 0),
       coalesce(sum(extract(epoch FROM s.ended_at - s.started_at))
                FILTER (WHERE s.step = 'copying'), 0),
       coalesce(sum(extract(epoch FROM s.ended_at - s.started_at))
                FILTER (WHERE s.step = 'blocking'), 0)
  FROM duckgres_reshard_operations o
  JOIN duckgres_reshard_operation_steps s ON s.operation_id = o.id
 WHERE o.state = 'succeeded' AND o.blocked_at IS NOT NULL AND o.unblocked_at IS NOT NULL
   AND (%(op)s::bigint IS NULL OR o.id = %(op)s::bigint)
 GROUP BY o.id ORDER BY o.id
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/duckgres_demo")
    parser.add_argument("--op", type=int, default=None)
    args = parser.parse_args()
    with psycopg.connect(args.dsn) as conn:
        rows = conn.execute(QUERY, {"op": args.op}).fetchall()
    if not rows:
        print("no succeeded operation with a maintenance window found")
        return 1
    for op_id, window, backup, copy, blocking in rows:
        window, backup, copy, blocking = (float(v) for v in (window, backup, copy, blocking))
        baseline = backup + copy
        target = 1.3 * baseline + 5
        print(f"op {op_id} backup + copy (baseline): {baseline:.2f} s (1.00x)")
        print(
            f"op {op_id} maintenance window: {window:.2f} s ({window / baseline:.2f}x vs baseline)"
        )
        print(f"op {op_id} of which blocking (propagation wait): {blocking:.2f} s")
        verdict = "meets" if window <= target else "misses"
        print(f"op {op_id} target 1.3x + 5 s = {target:.2f} s: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
