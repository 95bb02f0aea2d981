"""Maintenance window of a reshard in both copy modes, side by side (issue 28).

    .venv/bin/python bench/bench_online_window.py [--sizes 2000,1GiB,20000] [--rate 20]

Everything real, on this machine (the services of ``.ci/services.sh``: the config store on 5432,
metadata stores on 5433 → 5434; an S3 server, moto, over HTTP for the backup). For each size:

- two identical synthetic DuckLake catalogs (``make_demo_catalog``'s generator: ``2000`` and
  ``20000`` DuckLake tables as in the other benches), each owned by a tenant role of its own,
  made readable by the real DuckDB DuckLake extension (:data:`READABLE`: the generator's
  deliberately odd names, types, views and tags replaced) and migrated by it to its catalog
  version. The migration fills ``ducklake_schema_versions`` with about tables² / 2 rows, so
  the catalogs are 175 MiB at 2,000 tables and 7.6 GB at 20,000; ``1GiB`` is the size
  between, 7,000 tables (≈ 1 GiB after the migration, the size printed is the measured one);
- a tenant committing one row every ``1/rate`` s through DuckDB, from 5 s before the start
  (the baseline latency) until the block, when the data plane stops writing;
- a real runner process moves the first catalog offline (the baseline of this run) and the
  second online (backup after the unblock, the default).

Printed per size and mode, each ``name: value unit (ratio vs the offline run)``:

- **window outside the propagation wait**: ``blocked_at`` → ``unblocked_at`` minus the
  ``blocking`` step (2 x ``DUCKGRES_CONFIG_POLL_INTERVAL``: 2 s here, 60 s with the production
  default; the total with it is printed too);
- the pre-copy's duration and the tenant's commit latency during it (median, p95) against the
  same tenant's latency before the start;
- the catch-up's duration and the changes it applied, against the change rate;
- per store, the CPU its PostgreSQL spent (the postmaster's and its reaped children's, i.e.
  every backend that exited during the run: the runner's, ``pg_dump``'s and the tenant's) and
  the WAL it wrote, from the start of the runner to its exit.

Then the slope of the online window against catalog size (least squares over the sizes run).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchdb import recreate, setup_django  # noqa: E402

import tests.testenv  # noqa: E402,F401  (the test services' defaults)

CONFIG_DB = "duckgres_bench_online"
SIZES = {"2000": (2000, 16), "1GiB": (7000, 16), "20000": (20000, 16)}
OPTIONS = ", AUTOMATIC_MIGRATION TRUE, OVERRIDE_DATA_PATH TRUE"
READABLE = (
    "DELETE FROM ducklake_view",
    "DELETE FROM ducklake_tag",
    "DELETE FROM ducklake_partition_info",
    "DELETE FROM ducklake_partition_column",
    "UPDATE ducklake_table SET table_name = 't_' || table_id",
    "UPDATE ducklake_column SET column_name = 'c' || column_id, initial_default = NULL, "
    "default_value = NULL, column_type = CASE column_type WHEN 'timestamp with time zone' "
    "THEN 'timestamptz' WHEN 'double' THEN 'float64' WHEN 'struct<a int32, b varchar>' "
    "THEN 'varchar' ELSE column_type END",
)
PRODUCTION_HEARTBEAT = {
    "DUCKGRES_RESHARD_HEARTBEAT_SECONDS": "30",
    "DUCKGRES_RESHARD_STALE_SECONDS": "300",
}
APPLIED = re.compile(r"catch-up applied (\d+) changes")
ROUND = re.compile(r"catch-up round: (\d+) changes applied")


@dataclass
class Store:
    """One metadata store's PostgreSQL: CPU of the postmaster and its reaped children, WAL."""

    cluster: Any
    postmaster: int = 0

    def __post_init__(self) -> None:
        with self.cluster.superuser_conn() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        with open(f"/proc/{int(str(row[0]))}/stat") as f:
            self.postmaster = int(f.read().rsplit(")", 1)[1].split()[1])

    def cpu(self) -> float:
        with open(f"/proc/{self.postmaster}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def wal(self) -> int:
        with self.cluster.superuser_conn() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(str(row[0]))


@dataclass
class Run:
    mode: str
    window: float = 0.0
    blocking: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    before: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    commits: int = 0
    applied: int = 0
    rounds: list[int] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    wal: dict[str, int] = field(default_factory=dict)
    megabytes: float = 0.0

    @property
    def outside(self) -> float:
        return self.window - self.blocking


def _catalog(clusters: Any, tables: int, files: int, extensions: Path, data: Path) -> Any:
    from django.core.management import call_command

    from tests.fixtures.ducklake import attach
    from tests.fixtures.stores import create_tenant_catalog

    catalog = create_tenant_catalog(clusters.source, with_tables=False)
    call_command(
        "make_demo_catalog",
        "--port", str(clusters.source.port), "--dbname", catalog.database,
        "--owner", catalog.role, "--tables", str(tables), "--files-per-table", str(files),
    )  # fmt: skip
    with clusters.source.superuser_conn(catalog.database) as conn:
        for statement in READABLE:
            conn.execute(statement)
    with attach(extensions, clusters.source, catalog, data, options=OPTIONS) as lake:
        lake.sql("CREATE TABLE lake.events (id BIGINT, kind VARCHAR, amount DOUBLE)")
    return catalog


def _move(mode: str, clusters: Any, catalog: Any, rate: float, extensions: Path, data: Path,
          s3: Any) -> Run:  # fmt: skip
    from duckgres_admin.models import ReshardLogEntry, ReshardStepTiming
    from tests.fixtures.ducklake import Writer
    from tests.fixtures.online import OnlineTenant
    from tests.fixtures.rows import new_op, new_store, new_warehouse
    from tests.fixtures.runner import reload, start_runner

    warehouse = new_warehouse(
        store=new_store(clusters.source), catalog=catalog, data_bucket=s3.bucket
    )
    extra: dict[str, Any] = (
        {"copy_mode": "online", "backup_after_unblock": True} if mode == "online" else {}
    )
    op = new_op(warehouse, to_store=new_store(clusters.target), **extra)
    stores = {"source": Store(clusters.source), "target": Store(clusters.target)}
    tenant = OnlineTenant(clusters.source, catalog, data)
    run = Run(mode)
    state = Path(tempfile.mkdtemp(prefix="bench-online-"))
    with Writer(extensions, tenant, pause=1 / rate, options=OPTIONS) as writer:
        time.sleep(5)
        started = time.monotonic()
        cpu = {k: s.cpu() for k, s in stores.items()}
        wal = {k: s.wal() for k, s in stores.items()}
        # The production heartbeat and stale window, not the tests' (1 s and 62 s: a runner
        # self-fences after 2 s without a heartbeat, which a 20,000-table copy on 2 cores hit).
        runner = start_runner(op.id, state, env_extra={**s3.env(), **PRODUCTION_HEARTBEAT})
        while time.monotonic() - started < 3600:
            now = reload(op)
            if now.is_terminal or now.blocked_at is not None:
                break
            time.sleep(0.02)
        writer.stop()
        runner.wait(3600)
    op = reload(op)
    if op.state != "succeeded":
        raise SystemExit(f"{mode} move failed: {op.error}\n{runner.output()}")
    run.cpu = {k: s.cpu() - cpu[k] for k, s in stores.items()}
    run.wal = {k: s.wal() - wal[k] for k, s in stores.items()}
    assert op.unblocked_at is not None
    assert op.blocked_at is not None
    run.window = (op.unblocked_at - op.blocked_at).total_seconds()
    timings: dict[str, float] = {}
    spans: dict[str, tuple[Any, Any]] = {}
    for t in ReshardStepTiming.objects.filter(operation_id=op.id).order_by("id"):
        assert t.ended_at is not None
        timings[t.step] = timings.get(t.step, 0) + (t.ended_at - t.started_at).total_seconds()
        spans[t.step] = (t.started_at, t.ended_at)
    run.steps, run.blocking = timings, timings.get("blocking", 0.0)
    run.commits = len(writer.commits)
    commits = list(zip(writer.commits, writer.latencies, strict=True))
    run.before = [lat for at, lat in commits if at < started]
    if "precopying" in spans:
        # the writer's monotonic clock against the database's (one machine, one wall clock)
        offset = time.time() - time.monotonic()
        begin, end = (t.timestamp() - offset for t in spans["precopying"])
        run.during = [lat for at, lat in commits if begin <= at <= end]
    lines = ReshardLogEntry.objects.filter(operation_id=op.id).values_list("message", flat=True)
    for line in lines:
        if m := APPLIED.search(line):
            run.applied = int(m.group(1))
        if m := ROUND.search(line):
            run.rounds.append(int(m.group(1)))
    with clusters.target.superuser_conn(catalog.database) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    run.megabytes = int(str(row[0])) / 1048576 if row else 0.0
    return run


def _line(name: str, value: float, unit: str, base: float | None = None) -> None:
    ratio = f" ({value / base:.2f}x offline)" if base else ""
    print(f"{name}: {value:.3f} {unit}{ratio}")


def _report_run(size: str, run: Run, base: Run | None) -> None:
    """One move's figures, printed as soon as it is done (ratios against ``base``)."""
    if base is None:
        print(f"--- {size}: catalog {run.megabytes:.0f} MiB on the target")
    _line(f"{size} {run.mode} window outside the propagation wait", run.outside, "s",
          base.outside if base else None)  # fmt: skip
    _line(f"{size} {run.mode} window with the production poll interval (60 s)",
          run.outside + 60, "s", base.outside + 60 if base else None)  # fmt: skip
    for store in ("source", "target"):
        _line(f"{size} {run.mode} {store} PostgreSQL CPU", run.cpu[store], "s",
              base.cpu[store] if base else None)  # fmt: skip
        _line(f"{size} {run.mode} {store} WAL", run.wal[store] / 1048576, "MiB",
              base.wal[store] / 1048576 if base else None)  # fmt: skip
    steps = ", ".join(f"{k} {v:.2f}" for k, v in run.steps.items())
    print(f"{size} {run.mode} steps (s): {steps}", flush=True)


def _report_online(size: str, online: Run) -> None:
    before = statistics.median(online.before)
    if online.during:
        _line(f"{size} online tenant commit latency during the pre-copy, median",
              statistics.median(online.during) * 1000, "ms")  # fmt: skip
        print(f"    baseline before the start: {before * 1000:.1f} ms "
              f"({statistics.median(online.during) / before:.2f}x); "
              f"{len(online.during)} commits during it")  # fmt: skip
    _line(f"{size} online pre-copy", online.steps.get("precopying", 0), "s")
    _line(f"{size} online catch-up", online.steps.get("catching_up", 0), "s")
    print(f"    changes applied in the window: {online.applied} (rounds before the block: "
          f"{online.rounds}); the tenant committed {online.commits} times "
          f"({online.commits / max(online.steps.get('precopying', 1), 1e-9):.0f}/s of "
          "pre-copy)", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,1GiB,20000")
    parser.add_argument("--rate", type=float, default=20.0, help="tenant commits per second")
    parser.add_argument(
        "--modes", default="offline,online",
        help="online alone: no baseline in this run, so no ratios (compare with one that had)",
    )  # fmt: skip
    args = parser.parse_args()
    recreate(CONFIG_DB)
    setup_django(CONFIG_DB)
    import boto3
    from moto.server import ThreadedMotoServer

    from tests.fixtures.ducklake import extension_dir
    from tests.fixtures.runner import RunnerS3
    from tests.fixtures.stores import StoreCluster, StoreClusters, drop_tenant

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = RunnerS3(f"http://{host}:{port}", "bench-online")
    boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing",
                 ).create_bucket(Bucket=s3.bucket)  # fmt: skip
    clusters = StoreClusters(StoreCluster("source", "127.0.0.1", 5433),
                             StoreCluster("target", "127.0.0.1", 5434))  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench-online-"))
    extensions = extension_dir(work / "ext")
    points: list[tuple[float, float]] = []
    for size in args.sizes.split(","):
        tables, files = SIZES[size]
        runs = {}
        for mode in args.modes.split(","):
            data = work / f"{size}-{mode}"
            catalog = _catalog(clusters, tables, files, extensions, data)
            try:
                runs[mode] = _move(mode, clusters, catalog, args.rate, extensions, data, s3)
            finally:  # gigabytes on both stores: never left behind for the next run
                for cluster in clusters:
                    drop_tenant(cluster, catalog.role)
            _report_run(size, runs[mode], runs.get("offline") if mode == "online" else None)
        if "online" not in runs:
            continue
        _report_online(size, runs["online"])
        points.append((runs["online"].megabytes, runs["online"].outside))
    if len(points) > 1:
        mean_x = statistics.fmean(x for x, _ in points)
        mean_y = statistics.fmean(y for _, y in points)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
            (x - mean_x) ** 2 for x, _ in points
        )
        print(f"online window slope against catalog size: {slope * 1024:.3f} s per GiB")
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
