"""Benchmark of the backup's compression levels and of the real restore (issue 15 item 4).

    .venv/bin/python bench/bench_restore.py [--catalogs 2000,20000,1024mib] [--levels ...]
        [--build-only] [--drop]

For each catalog (a DuckLake catalog of N tables built with ``reshard.engines.demo_catalog``, or
``<M>mib``: M MiB of incompressible random ``bytea`` inlined data, as in bench_backup.py) on the
source cluster (5433, TLS) and each compression level (the values of
``DUCKGRES_RESHARD_BACKUP_COMPRESSION``, plus ``stock``: ``pg_dump -Fc`` with no ``--compress``,
the baseline every ratio is against, measured in the same run), it:

- dumps with the backup's exact argv (``reshard.engines.backup.pg_dump_argv``: client, flags,
  environment; only ``--compress`` differs) into a file: wall time, dump size, pg_dump's CPU;
- restores that file with stock ``pg_restore --no-owner --no-acl --clean --if-exists
  --exit-on-error --format=custom`` (the logged restore command's flags) into a fresh, empty
  database on the target cluster (5434): wall time; the restored row count is checked.

The catalogs are kept between runs (``bench_restore_<name>`` databases on 5433: the 20,000-table
and 1 GiB ones take minutes to build; ``--drop`` removes them at the end).
Prints ``name: value unit (ratio vs baseline)`` lines, then a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import django

import tests.testenv  # noqa: F401  (test defaults for the settings Django needs)

django.setup()

from reshard.engines.backup import pg_dump_argv  # noqa: E402
from reshard.engines.clients import (  # noqa: E402
    BackupSource,
    choose_client,
    pg_dump_env,
)
from reshard.engines.demo_catalog import build_demo_catalog  # noqa: E402

MIB = 1 << 20
HOST = "127.0.0.1"
DEFAULT_LEVELS = "stock,none,gzip:1,gzip:3,gzip:6,gzip:9"


def conn(port: int, dbname: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(
        host=HOST, port=port, user="postgres", dbname=dbname, sslmode="require", autocommit=True
    )


def exists(port: int, name: str) -> bool:
    with conn(port, "postgres") as c:
        return (
            c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            is not None
        )


def recreate(port: int, name: str) -> None:
    with conn(port, "postgres") as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop(port: int, name: str) -> None:
    with conn(port, "postgres") as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def build(port: int, spec: str) -> str:
    """The catalog database for ``spec`` (``2000`` tables or ``1024mib``), built once."""
    name = f"bench_restore_{spec}"
    marker = "bench_restore_complete"
    if exists(port, name):
        with conn(port, name) as c:
            done = c.execute("SELECT to_regclass(%s) IS NOT NULL", (marker,)).fetchone()
        if done and done[0]:
            return name
    recreate(port, name)
    started = time.monotonic()
    with conn(port, name) as c:
        if spec.endswith("mib"):
            mib = int(spec[:-3])
            c.execute("CREATE TABLE ducklake_inlined_data_blob (id int PRIMARY KEY, data bytea)")
            c.execute("ALTER TABLE ducklake_inlined_data_blob ALTER data SET STORAGE EXTERNAL")
            with c.cursor() as cur, cur.copy("COPY ducklake_inlined_data_blob FROM STDIN") as cp:
                for i in range(mib):
                    cp.write_row((i, os.urandom(MIB)))
        else:
            build_demo_catalog(c, tables=int(spec))
        # Outside schema public: not in the dump (pg_dump --schema=public).
        c.execute(sql.SQL("CREATE TABLE {} ()").format(sql.Identifier(marker)))
        c.execute("VACUUM ANALYZE")
    print(f"# built {name} in {time.monotonic() - started:.1f} s", flush=True)
    return name


def exact_rows(port: int, dbname: str) -> int:
    total = 0
    with conn(port, dbname) as c:
        tables = c.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
        for (table,) in tables:
            row = c.execute(
                sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(table))
            ).fetchone()
            total += int(row[0]) if row else 0
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Figure:
    catalog: str
    level: str
    dump_s: float
    dump_cpu_s: float
    size: int
    restore_s: float


def argv_for(source: BackupSource, level: str) -> list[str]:
    client = choose_client(15)
    if level == "stock":  # pg_dump -Fc's own default: no --compress
        return [a for a in pg_dump_argv(client, source) if not a.startswith("--compress")]
    return pg_dump_argv(client, source, compression=level)


def measure(args: argparse.Namespace, catalog: str, dbname: str, level: str, want: int) -> Figure:
    source = BackupSource(HOST, args.source_port, dbname, "postgres", "require", "")
    with tempfile.NamedTemporaryFile(dir=args.tmp, suffix=".dump") as out:
        cpu0 = children_cpu()
        started = time.monotonic()
        subprocess.run(argv_for(source, level), stdout=out, env=pg_dump_env(source), check=True)
        dump_s = time.monotonic() - started
        dump_cpu = children_cpu() - cpu0
        size = os.fstat(out.fileno()).st_size
        target = f"bench_restored_{os.getpid()}"
        recreate(args.target_port, target)
        try:
            client = choose_client(15)
            started = time.monotonic()
            subprocess.run(
                [
                    client.pg_restore, "--no-owner", "--no-acl", "--clean", "--if-exists",
                    "--exit-on-error", "--format=custom",
                    f"--dbname=host={HOST} port={args.target_port} user=postgres "
                    f"dbname={target} sslmode=require",
                    out.name,
                ],
                check=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )  # fmt: skip
            restore_s = time.monotonic() - started
            got = exact_rows(args.target_port, target)
            if got != want:
                raise SystemExit(f"{catalog} {level}: restored {got} rows, source has {want}")
        finally:
            drop(args.target_port, target)
    return Figure(catalog, level, dump_s, dump_cpu, size, restore_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-port", type=int, default=5433)
    parser.add_argument("--target-port", type=int, default=5434)
    parser.add_argument("--catalogs", default="2000,20000,1024mib")
    parser.add_argument("--levels", default=DEFAULT_LEVELS)
    parser.add_argument(
        "--levels-large", default="stock,none,gzip:1,gzip:3",
        help="levels for the <M>mib catalogs (zlib at 10 MB/s: each default-level dump of 1 GiB "
        "takes ~100 s)",
    )  # fmt: skip
    parser.add_argument("--tmp", default=tempfile.gettempdir())
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--drop", action="store_true")
    args = parser.parse_args()

    specs = [s.strip() for s in args.catalogs.split(",") if s.strip()]
    print(f"# restore benchmark, {os.cpu_count()} cores, pg_dump {choose_client(15).version}")
    names = {spec: build(args.source_port, spec) for spec in specs}
    if args.build_only:
        return
    figures: list[Figure] = []
    try:
        for spec in specs:
            dbname = names[spec]
            want = exact_rows(args.source_port, dbname)
            # Warm the page cache: the first level must not pay for the others' cache.
            source = BackupSource(HOST, args.source_port, dbname, "postgres", "require", "")
            with open(os.devnull, "wb") as devnull:
                subprocess.run(
                    argv_for(source, "none"), stdout=devnull, env=pg_dump_env(source), check=True
                )
            levels = args.levels_large if spec.endswith("mib") else args.levels
            base: Figure | None = None
            for level in [x.strip() for x in levels.split(",") if x.strip()]:
                fig = measure(args, spec, dbname, level, want)
                figures.append(fig)
                base = base or fig
                print(
                    f"dump_{spec}_{level}: {fig.dump_s:.3f} s ({base.dump_s / fig.dump_s:.2f}x "
                    f"throughput vs stock; pg_dump CPU {fig.dump_cpu_s:.2f} s)\n"
                    f"size_{spec}_{level}: {fig.size / MIB:.2f} MiB "
                    f"({fig.size / base.size:.2f}x of stock)\n"
                    f"restore_{spec}_{level}: {fig.restore_s:.3f} s "
                    f"({fig.restore_s / base.restore_s:.2f}x of stock)",
                    flush=True,
                )
    finally:
        if args.drop:
            for dbname in names.values():
                drop(args.source_port, dbname)
    print("\n| catalog | level | dump wall | pg_dump CPU | size | restore wall | dump+restore |")
    print("|---|---|---|---|---|---|---|")
    for f in figures:
        print(
            f"| {f.catalog} | `{f.level}` | {f.dump_s:.2f} s | {f.dump_cpu_s:.2f} s | "
            f"{f.size / MIB:.2f} MiB | {f.restore_s:.2f} s | {f.dump_s + f.restore_s:.2f} s |"
        )


if __name__ == "__main__":
    main()
