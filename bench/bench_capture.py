"""The online copy's change capture and catch-up (docs/copy.md "Online copy: the engine";
figures in docs/performance.md "Online copy: capture and catch-up").

    .venv/bin/python bench/bench_capture.py [--tables 100] [--commits 300]

In one run, on a DuckLake catalog that the real DuckDB writes on the source cluster (5433,
``--tables`` DuckLake tables, each with inlined rows), as the superuser with
``sslmode=require``:

- **baseline:** the latency of one DuckDB single-row commit without the capture, measured
  before and after the capture run (both printed; their mean is the baseline);
- **with the capture installed:** the same commits; the ratio is the cost to the tenant's
  writes while an online copy's pre-copy runs;
- **pre-copy** of the catalog into an empty database on the target cluster (5434), then the
  **catch-up** of every change those commits made, under the write fence, with the ratio of
  its duration to the pre-copy's and the changes applied per second;
- the same with **one catch-up round before the block** and a tenth of the commits after it:
  the round's and the fenced catch-up's durations, as ratios of the catch-up without a round
  (the part of the window the round removes).

Each line reads ``name: value unit (ratio vs baseline)``. Not a timed test: run by hand.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reshard.engines import capture
from reshard.engines.copy import online
from reshard.engines.copy.introspection import discover_tables
from reshard.engines.verify import verify_ducklake
from tests.fixtures.ducklake import extension_dir
from tests.fixtures.hooks import RecordingHooks

HOST = "127.0.0.1"
SOURCE_PORT, TARGET_PORT = 5433, 5434
DATABASE = "bench_capture"


def connect(port: int, dbname: str = "postgres") -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=HOST, port=port, user="postgres", dbname=dbname, sslmode="require", autocommit=True
    )


def fresh_database(port: int) -> None:
    with connect(port) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(DATABASE)))  # fmt: skip
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))


def duck(extensions: Path, data: Path) -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect(
        config={
            "allow_unsigned_extensions": "true",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        }
    )
    conn.execute(f"LOAD '{extensions / 'postgres_scanner.duckdb_extension'}'")
    conn.execute(f"LOAD '{extensions / 'ducklake.duckdb_extension'}'")
    dsn = f"host={HOST} port={SOURCE_PORT} dbname={DATABASE} user=postgres sslmode=require"
    conn.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS lake (DATA_PATH '{data}/')")
    return conn


def commits(lake: duckdb.DuckDBPyConnection, n: int, start: int) -> list[float]:
    """Latency in seconds of ``n`` single-row commits."""
    took = []
    for i in range(start, start + n):
        begun = time.perf_counter()
        lake.execute("INSERT INTO lake.t0 VALUES (?, 'bench')", [i])
        took.append(time.perf_counter() - begun)
    return took


def p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


def line(name: str, value: float, unit: str, baseline: float | None = None) -> None:
    ratio = f" ({value / baseline:.2f}x baseline)" if baseline else " (baseline)"
    print(f"{name}: {value:.3f} {unit}{ratio}")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    begun = time.perf_counter()
    result = fn()
    return time.perf_counter() - begun, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--commits", type=int, default=300)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    extensions = extension_dir(work / "extensions")
    for port in (SOURCE_PORT, TARGET_PORT):
        fresh_database(port)
    lake = duck(extensions, work / "data")
    for i in range(args.tables):
        lake.execute(f"CREATE TABLE lake.t{i} (id BIGINT, v VARCHAR)")
        lake.execute(f"INSERT INTO lake.t{i} VALUES (1, 'seed'), (2, 'seed')")

    before = commits(lake, args.commits, 1000)
    with connect(SOURCE_PORT, DATABASE) as conn:
        capture.install(conn, discover_tables(conn))
    captured = commits(lake, args.commits, 100_000)
    with connect(SOURCE_PORT, DATABASE) as conn:
        capture.remove(conn)
    after = commits(lake, args.commits, 200_000)
    lake.close()

    baseline = statistics.median(before + after)
    print(f"catalog: {args.tables} DuckLake tables; {args.commits} commits per measurement")
    line("commit latency without capture, before", statistics.median(before) * 1e3, "ms")
    line("commit latency without capture, after", statistics.median(after) * 1e3, "ms")
    line("commit latency with capture (median)", statistics.median(captured) * 1e3, "ms",
         baseline * 1e3)  # fmt: skip
    line("commit latency with capture (p95)", p95(captured) * 1e3, "ms",
         p95(before + after) * 1e3)  # fmt: skip

    hooks = RecordingHooks()

    def source() -> psycopg.Connection[Any]:
        return connect(SOURCE_PORT, DATABASE)

    def target() -> psycopg.Connection[Any]:
        return connect(TARGET_PORT, DATABASE)

    with connect(SOURCE_PORT, DATABASE) as conn:
        capture.install(conn, discover_tables(conn))
    lake = duck(extensions, work / "data")
    precopy_s, pre = timed(lambda: online.precopy_catalog(source, target, hooks))
    commits(lake, args.commits, 300_000)
    lake.close()
    catchup_s, done = timed(lambda: online.catch_up(source, target, hooks, pre))
    try:
        with target() as tgt:
            verify_ducklake(done.release.connection, tgt)
    finally:
        done.release.release()
        with connect(SOURCE_PORT, DATABASE) as conn:
            capture.remove(conn)
    # The same with one round before the block: the fenced catch-up applies only what the
    # tenant committed after the round (a tenth of the commits here).
    fresh_database(TARGET_PORT)
    with connect(SOURCE_PORT, DATABASE) as conn:
        capture.install(conn, discover_tables(conn))
    lake = duck(extensions, work / "data")
    _, pre2 = timed(lambda: online.precopy_catalog(source, target, hooks))
    commits(lake, args.commits, 400_000)
    round_s, rounded = timed(lambda: online.advance(source, target, hooks, pre2))
    commits(lake, max(1, args.commits // 10), 500_000)
    lake.close()
    final_s, last = timed(lambda: online.catch_up(source, target, hooks, rounded))
    last.release.release()
    with connect(SOURCE_PORT, DATABASE) as conn:
        capture.remove(conn)
    print(f"pre-copied catalog tables: {len(pre.tables)}")
    line("pre-copy", precopy_s, "s")
    line("catch-up", catchup_s, "s", precopy_s)
    print(f"catch-up changes: {done.applied.total} ({done.applied.total / args.commits:.1f} per "
          f"commit), {done.applied.total / catchup_s:.0f} changes/s")  # fmt: skip

    line("catch-up round before the block", round_s, "s", catchup_s)
    line("fenced catch-up after the round", final_s, "s", catchup_s)
    print(f"round changes: {rounded.last_round}; fenced catch-up changes: {last.applied.total}")


if __name__ == "__main__":
    main()
