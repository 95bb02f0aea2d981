"""Janitor at fleet scale (issue: under load and at fleet scale): one reconcile tick over
100,000 finished and 1,000 active operations, with its baselines from the same run.

    .venv/bin/python scripts/with_test_env.py bench/bench_janitor.py [--finished N] [--active N]

Needs PostgreSQL on 5432 (``.ci/services.sh``). It creates its own config-store database
``duckgres_bench_janitor`` and runs the real ``Janitor.reconcile`` with an in-memory launcher (the
launcher's own calls are the Kubernetes API's cost, measured by the pods suite, not here):

- the fleet: ``--finished`` succeeded operations (observed, finished two days ago) and
  ``--active`` active ones: 90 % running with a live heartbeat, 5 % pending within the grace,
  5 % running with a stale heartbeat (the first tick relaunches those: its interventions), plus
  one exited runner per 1,000 finished operations for the reap;
- **baseline**: the same ticks over a tenth of the fleet, and one ``SELECT 1`` round trip;
- measured: the first tick (relaunches and reaps) and the median of 10 steady ticks after it,
  with the number of config-store queries of each.

Prints ``name: value unit (ratio vs baseline)`` lines. The target: a steady tick <= 200 ms at
full size, and the same number of queries at both sizes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from benchdb import recreate, setup_django

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DB = "duckgres_bench_janitor"


def seed(finished: int, active: int, prefix: str, launcher: Any) -> None:
    from datetime import UTC, datetime

    from django.db import connection

    from reshard.launchers.base import RunnerStatus
    from tests.fixtures.janitor import new_op
    from tests.reshard.scale_support import clone

    template = new_op("succeeded")
    clone(template, "finished", finished, prefix)
    clone(template, "fresh", active * 90 // 100, prefix)
    clone(template, "pending", active * 5 // 100, prefix)
    stale = active - active * 90 // 100 - active * 5 // 100
    clone(template, "fresh", stale, f"{prefix}-stale")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_reshard_operations SET heartbeat_at = now() - interval '10 minutes', "
            "created_at = now() - interval '20 minutes' WHERE org_id LIKE %s",
            [f"{prefix}-stale-%"],
        )
        cursor.execute(
            "SELECT id FROM duckgres_reshard_operations WHERE org_id LIKE %s ORDER BY id LIMIT %s",
            [f"{prefix}-finished-%", max(1, finished // 1000)],
        )
        to_reap = [int(row[0]) for row in cursor.fetchall()]
    for op_id in to_reap:
        launcher.runners[op_id] = RunnerStatus(phase="Succeeded", spawned_at=datetime.now(UTC))


def measure(finished: int, active: int, prefix: str) -> tuple[float, int, float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.fixtures.janitor import FakeLauncher, make_janitor, reset_leases

    reset_leases()
    launcher = FakeLauncher()
    seed(finished, active, prefix, launcher)
    janitor = make_janitor(launcher, holder=f"bench-{prefix}.1.aaaaaaaa")

    def tick() -> tuple[float, int]:
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            report = janitor.reconcile()
            elapsed = time.perf_counter() - started
        if not (report.leader and report.completed):
            raise RuntimeError(f"the tick did not complete: {report}")
        return elapsed, len(captured.captured_queries)

    first, first_queries = tick()
    steady = [tick() for _ in range(10)]
    return (
        first,
        first_queries,
        statistics.median(t for t, _ in steady),
        max(q for _, q in steady),
    )


def clear() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE duckgres_reshard_operations CASCADE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--active", type=int, default=1_000)
    args = parser.parse_args()
    recreate(CONFIG_DB)
    setup_django(CONFIG_DB)
    from django.conf import settings
    from django.db import connection

    settings.DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS = 0
    started = time.perf_counter()
    for _ in range(50):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    select1 = (time.perf_counter() - started) / 50

    base = measure(args.finished // 10, args.active // 10, "base")
    clear()
    full = measure(args.finished, args.active, "full")

    print(f"SELECT 1 round trip: {select1 * 1000:.2f} ms")
    print(
        f"baseline ({args.finished // 10} finished + {args.active // 10} active): first tick "
        f"{base[0] * 1000:.0f} ms ({base[1]} queries), steady tick {base[2] * 1000:.1f} ms "
        f"({base[3]} queries)"
    )
    print(
        f"full ({args.finished} finished + {args.active} active): first tick "
        f"{full[0] * 1000:.0f} ms ({full[1]} queries), steady tick {full[2] * 1000:.1f} ms "
        f"({full[3]} queries; {full[2] / base[2]:.2f}x the baseline's, "
        f"{full[2] / select1:.0f}x a SELECT 1)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
