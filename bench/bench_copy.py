"""Catalog copy benchmark (issue 3): our copy against ``pg_dump -Fc | pg_restore``.

Run by hand (figures go into docs/performance.md, "Copy"):

    .venv/bin/python bench/bench_copy.py [--tables 2000] [--runs 3] [--parallelism 1,2,4]

It builds a DuckLake-shaped catalog with the generator behind ``manage.py make_demo_catalog``
on the source cluster (5433), then, in the same run, times (medians of ``--runs``):

- ``pg_dump -Fc > /dev/null`` (information only);
- the baseline ``pg_dump -Fc <source> | pg_restore -d <fresh target database>`` (5433 → 5434);
- a straightforward single-connection psycopg passthrough (``for block in copy_out:
  copy_in.write(block)``; the issue's reference design) through the same DDL and replay;
- ``reshard.engines.copy.catalog.copy_catalog`` with each ``--parallelism`` value.

Every copy goes into a freshly created empty target database (creation is not timed), as the
superuser ``postgres`` with ``sslmode=require``. Each line reads
``name: value unit (ratio vs baseline)``; the target of the issue is copy ≤ 0.7x baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reshard.engines.copy import base as base_mod
from reshard.engines.copy import catalog as catalog_copy
from reshard.engines.copy import pump
from reshard.engines.demo_catalog import build_demo_catalog, create_database

HOST = "127.0.0.1"
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """utime + stime of a process in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class NoHooks:
    def log(self, level: str, message: str) -> None:
        pass

    def progress(self, values: Any) -> None:
        pass

    def before_irreversible(self) -> None:
        pass

    def register_connection(self, conn: Any) -> None:
        pass

    def unregister_connection(self, conn: Any) -> None:
        pass

    def stopped(self) -> bool:
        return False


class CpuHooks(NoHooks):
    """Adds up the CPU time of every server backend the copy used, read just before each
    connection is closed (the copy unregisters a connection right before closing it)."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}
        self.backend_cpu = 0.0

    def register_connection(self, conn: Any) -> None:
        self.pids[id(conn)] = conn.info.backend_pid

    def unregister_connection(self, conn: Any) -> None:
        pid = self.pids.pop(id(conn), None)
        if pid is not None:
            self.backend_cpu += proc_cpu(pid)


class BackendSampler:
    """Samples the CPU time of the pg_dump / pg_restore backends while they run."""

    def __init__(self, ports: tuple[int, int]) -> None:
        self.ports = ports
        self.seen: dict[tuple[int, int], float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        conns = [admin(p) for p in self.ports]
        try:
            while not self.stop.is_set():
                for port, conn in zip(self.ports, conns, strict=True):
                    for (pid,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE application_name IN ('pg_dump', 'pg_restore')"
                    ).fetchall():
                        cpu = proc_cpu(int(str(pid)))
                        key = (port, int(str(pid)))
                        self.seen[key] = max(self.seen.get(key, 0.0), cpu)
                time.sleep(0.02)
        finally:
            for conn in conns:
                conn.close()

    def __enter__(self) -> BackendSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def total(self) -> float:
        return sum(self.seen.values())


def conninfo(port: int, db: str) -> str:
    return f"host={HOST} port={port} user=postgres dbname={db} sslmode=require"


def admin(port: int) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(conninfo(port, "postgres"), autocommit=True)


def fresh_db(port: int, name: str) -> None:
    with admin(port) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        create_database(conn, name, None)


def drop_db(port: int, name: str) -> None:
    with admin(port) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def factory(port: int, db: str) -> Callable[[], psycopg.Connection[Any]]:
    return lambda: psycopg.connect(
        conninfo(port, db), autocommit=True, application_name="duckgres-bench-copy"
    )


def naive_stream(
    src: psycopg.Connection[Any],
    tgt: psycopg.Connection[Any],
    table: str,
    on_block: Callable[[int], None] | None = None,
) -> base_mod.TableCopy:
    """The straightforward passthrough: one Python iteration per COPY message (row)."""
    ident = sql.Identifier(table)
    total = 0
    with src.cursor() as scur, tgt.cursor() as tcur:
        with (
            scur.copy(sql.SQL("COPY {} TO STDOUT (FORMAT binary)").format(ident)) as out,
            tcur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(ident)) as inp,
        ):
            for block in out:
                inp.write(block)
                total += len(block)
        rows = tcur.rowcount
    return base_mod.TableCopy(table, rows, total)


@contextmanager
def patched_stream(fn: Any) -> Iterator[None]:
    real = pump.stream_table
    pump.stream_table = fn
    try:
        yield
    finally:
        pump.stream_table = real


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parallelism", default="1,2,4")
    parser.add_argument("--source-port", type=int, default=5433)
    parser.add_argument("--target-port", type=int, default=5434)
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()
    sport, tport = args.source_port, args.target_port
    src_db = f"bench_copy_src_{args.tables}"
    tgt_db = "bench_copy_tgt"
    levels = [int(x) for x in args.parallelism.split(",")]

    fresh_db(sport, src_db)
    t0 = time.perf_counter()
    with psycopg.connect(conninfo(sport, src_db), autocommit=True) as conn:
        summary = build_demo_catalog(conn, tables=args.tables)
        conn.execute("VACUUM ANALYZE")
    print(
        f"# catalog: {summary.ducklake_tables} DuckLake tables, {summary.physical_tables} "
        f"ducklake_* tables, {summary.rows} rows, {summary.database_bytes / 1048576:.1f} MiB "
        f"(built in {time.perf_counter() - t0:.1f} s); load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    dump_size = subprocess.run(
        f"pg_dump -Fc '{conninfo(sport, src_db)}' | wc -c",
        shell=True, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    print(f"# custom-format dump: {int(dump_size) / 1048576:.1f} MiB", flush=True)

    results: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def record(name: str, seconds: float, cpu_seconds: float | None = None) -> None:
        results.setdefault(name, []).append(seconds)
        extra = ""
        if cpu_seconds is not None:
            cpu.setdefault(name, []).append(cpu_seconds)
            extra = f", {cpu_seconds:.2f} CPU-s (client + server backends)"
        print(f"#   {name} run {len(results[name])}: {seconds:.2f} s{extra}", flush=True)

    def ours(n: int) -> tuple[float, float]:
        hooks = CpuHooks()
        before = own_cpu(resource.RUSAGE_SELF)
        wall = timed(
            lambda: catalog_copy.copy_catalog(
                factory(sport, src_db), factory(tport, tgt_db), hooks, parallelism=n
            ).release.release()
        )
        return wall, own_cpu(resource.RUSAGE_SELF) - before + hooks.backend_cpu

    def baseline() -> tuple[float, float]:
        before = own_cpu(resource.RUSAGE_CHILDREN)
        with BackendSampler((sport, tport)) as sampler:
            wall = timed(lambda: subprocess.run(
                f"pg_dump -Fc '{conninfo(sport, src_db)}' | "
                f"pg_restore --exit-on-error -d '{conninfo(tport, tgt_db)}'",
                shell=True, check=True,
            ))  # fmt: skip
        return wall, own_cpu(resource.RUSAGE_CHILDREN) - before + sampler.total

    for _ in range(args.runs):
        record(
            "pg_dump -Fc > /dev/null",
            timed(lambda: subprocess.run(
                f"pg_dump -Fc '{conninfo(sport, src_db)}' > /dev/null", shell=True, check=True
            )),
        )  # fmt: skip
        fresh_db(tport, tgt_db)
        record("pg_dump -Fc | pg_restore", *baseline())
        if not args.skip_naive:
            fresh_db(tport, tgt_db)
            with patched_stream(naive_stream):
                record(
                    "naive psycopg passthrough (1 connection pair)",
                    timed(lambda: catalog_copy.copy_catalog(
                        factory(sport, src_db), factory(tport, tgt_db), NoHooks(), parallelism=1
                    ).release.release()),
                )  # fmt: skip
        for n in levels:
            fresh_db(tport, tgt_db)
            record(f"copy_catalog parallelism={n}", *ours(n))

    base = statistics.median(results["pg_dump -Fc | pg_restore"])
    print(f"# medians of {args.runs} runs; baseline = pg_dump -Fc | pg_restore {sport} → {tport}")
    best_base = min(results["pg_dump -Fc | pg_restore"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name}: {median:.2f} s ({median / base:.2f}x baseline)")
    # The machine is shared: the best run of each is the least disturbed one.
    for name, values in results.items():
        best = min(values)
        print(f"{name} (best run): {best:.2f} s ({best / best_base:.2f}x baseline best run)")
    base_cpu = statistics.median(cpu["pg_dump -Fc | pg_restore"])
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"{name} CPU: {median:.2f} CPU-s ({median / base_cpu:.2f}x baseline)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"benchmark process peak RSS: {peak:.0f} MiB (all variants, one process)")
    drop_db(tport, tgt_db)
    drop_db(sport, src_db)


if __name__ == "__main__":
    main()
