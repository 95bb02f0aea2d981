"""Benchmark of the streamed catalog backup (issue 3, design §5).

    source /tmp/testenv.sh && .venv/bin/python bench/bench_backup.py [--tables 2000]
        [--large-mib 1024,3072] [--runs 3] [--port 5433]

Prints ``name: value unit (ratio vs baseline)`` lines:
- throughput of ``run_backup`` (pg_dump → S3 multipart into a moto server in ANOTHER process,
  or with ``--s3 rgw`` into the Ceph RADOS Gateway of ``.ci/rgw.sh``, a C++ S3 server)
  against ``pg_dump -Fc > /dev/null`` with the same flags on the same catalog in the same run
  (medians of ``--runs``; ratio = baseline time / backup time, target ≥ 0.9);
- this process's RSS while backing up catalogs whose dumps are ~1 GiB and ~3 GiB
  (incompressible inlined ``bytea`` data): idle RSS, and the growth of the peak over the
  RSS just before the backup, against the bound 3 x part size + 16 MiB (flat with size).

Needs the source cluster on 127.0.0.1:5433 (``postgres`` trusted on loopback, TLS).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tests.testenv  # noqa: F401  (test defaults for the settings Django needs)

MIB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class RssSampler:
    """Samples VmRSS every 20 ms in a thread; ``peak`` in bytes."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_kib("VmRSS") * 1024)
            self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self.peak = status_kib("VmRSS") * 1024
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_kib("VmRSS") * 1024)


IDLE_RSS = status_kib("VmRSS") * 1024  # interpreter only, before any import of the product

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from duckgres_admin.lib.s3 import S3  # noqa: E402
from reshard.engines import backup as backup_mod  # noqa: E402
from reshard.engines.backup import (  # noqa: E402
    BackupDestination,
    SourceFacts,
    pg_dump_argv,
    read_source_facts,
    run_backup,
)
from reshard.engines.clients import (  # noqa: E402
    BackupSource,
    choose_client,
    pg_dump_env,
)

RUNNER_IDLE_RSS = status_kib("VmRSS") * 1024  # after importing what the backup step needs


class Hooks:
    def log(self, level: str, message: str) -> None:
        pass

    def progress(self, values: dict[str, int]) -> None:
        pass

    def register_process(self, proc: Any) -> None:
        pass

    def unregister_process(self, proc: Any) -> None:
        pass

    def stopped(self) -> bool:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto in its own process: its stored objects must not count in our RSS or CPU."""
    port = free_port()
    code = (
        "import logging, time; logging.disable(logging.CRITICAL)\n"
        "from moto.server import ThreadedMotoServer\n"
        f"s = ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False)\n"
        "s.start()\n"
        "while True: time.sleep(3600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


def rgw_server() -> tuple[Any, str]:
    """The RADOS Gateway ``.ci/rgw.sh`` runs (started here when it is not answering); the
    process whose CPU is counted is ``radosgw``."""
    subprocess.run([os.path.join(ROOT, ".ci", "rgw.sh"), "start"], check=True)
    pid = subprocess.run(["pgrep", "-o", "radosgw"], capture_output=True, text=True, check=True)

    class Running:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def kill(self) -> None:  # left running for the next run, as .ci/rgw.sh leaves it
            return None

        def wait(self) -> None:
            return None

    return Running(int(pid.stdout.split()[0])), "http://127.0.0.1:7480"


@dataclass
class Db:
    port: int
    name: str

    def conn(self, dbname: str | None = None) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=dbname or self.name,
            sslmode="require",
            autocommit=True,
        )

    def source(self) -> BackupSource:
        # A SCRAM login: the product's own connections (the facts read) require it.
        return BackupSource("127.0.0.1", self.port, self.name, DUMP_USER, "require", DUMP_PASSWORD)

    def size(self) -> int:
        with self.conn() as c:
            row = c.execute("SELECT pg_database_size(current_database())").fetchone()
        assert row is not None
        return int(row[0])


DUMP_USER = "bench_backup_dump"
DUMP_PASSWORD = "bench-backup-dump-password-0123456789"


def create_db(port: int, name: str) -> Db:
    db = Db(port, name)
    with db.conn("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (DUMP_USER,)).fetchone():
            c.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(DUMP_USER), sql.Literal(DUMP_PASSWORD)
                )
            )
            c.execute(sql.SQL("GRANT pg_read_all_data TO {}").format(sql.Identifier(DUMP_USER)))
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return db


def drop_db(db: Db) -> None:
    with db.conn("postgres") as c:
        c.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db.name))
        )


def baseline_seconds(db: Db) -> float:
    """``pg_dump -Fc > /dev/null`` with exactly the backup's flags and client."""
    client = choose_client(15)
    started = time.monotonic()
    with open(os.devnull, "wb") as devnull:
        subprocess.run(
            pg_dump_argv(client, db.source()),
            stdout=devnull,
            env=pg_dump_env(db.source()),
            check=True,
        )
    return time.monotonic() - started


def dump_bytes(db: Db) -> int:
    client = choose_client(15)
    proc = subprocess.Popen(
        pg_dump_argv(client, db.source()), stdout=subprocess.PIPE, env=pg_dump_env(db.source())
    )
    assert proc.stdout is not None
    total = 0
    while chunk := proc.stdout.read(4 * MIB):
        total += len(chunk)
    proc.wait()
    return total


def cpu_seconds(pid: str) -> float:
    """user + system CPU of a process (``self`` or a pid) from /proc, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def point_settings_at(endpoint: str) -> None:
    """What a runner's environment would say (DUCKGRES_S3_ENDPOINT_URL etc.)."""
    from django.conf import settings

    settings.DUCKGRES_S3_ENDPOINT_URL = endpoint
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"


def backup_once(
    db: Db,
    s3: S3,
    bucket: str,
    op_id: int,
    *,
    prebuilt: bool = False,
    facts: SourceFacts | None = None,
) -> tuple[float, Any]:
    """``prebuilt``: the caller passes an S3 client it built earlier (``s3=``); else the client
    is built inside ``run_backup`` from the settings (its ~0.1 s of CPU counts). ``facts``: the
    server version and size read earlier (the runner reads both, with the client, during the
    block's propagation wait: ``steps.backup_catalog.prepare``)."""
    started = time.monotonic()
    result = run_backup(
        op_id,
        db.source(),
        BackupDestination(bucket),
        Hooks(),
        s3=s3 if prebuilt else None,
        facts=facts,
    )
    elapsed = time.monotonic() - started
    s3.delete_object(bucket, result.key)
    return elapsed, result


def prepared_backup(db: Db, bucket: str, op_id: int) -> tuple[float, float]:
    """What the runner's step does: client and facts prepared during the propagation wait (both
    made before the clock starts, as the wait made them). Returns the backup's start
    (``time.monotonic()``) and its seconds."""
    prepared_s3 = S3(region="us-east-1", session_name=f"duckgres-reshard-op-{op_id}")
    facts = read_source_facts(db.source())
    started = time.monotonic()
    return started, backup_once(db, prepared_s3, bucket, op_id, prebuilt=True, facts=facts)[0]


def memory_child(args: argparse.Namespace) -> None:
    idle = status_kib("VmRSS") * 1024
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    point_settings_at(args.endpoint)
    db = Db(args.port, args.memory_child)
    cpu0 = cpu_seconds("self")
    with RssSampler() as sampler:
        started = time.monotonic()
        result = run_backup(3000, db.source(), BackupDestination(args.bucket), Hooks())
        elapsed = time.monotonic() - started
    cpu = cpu_seconds("self") - cpu0
    after = status_kib("VmRSS") * 1024
    S3(region="us-east-1", endpoint_url=args.endpoint, addressing_style="path").delete_object(
        args.bucket, result.key
    )
    print(
        json.dumps(
            {
                "idle": idle,
                "peak": sampler.peak,
                "after": after,
                "seconds": elapsed,
                "bytes": result.bytes,
                "part_size": result.part_size,
                "parts": result.parts,
                "peak_buffered": result.peak_buffered_bytes,
                "cpu": cpu,
            }
        )
    )


class Timeline:
    """Where one backup's wall time goes after ``pg_dump`` exits: the start and end
    (``time.monotonic()``) of the last call of each S3 method and of the pump (stdout read to
    EOF), so ``span("upload_part")`` is the last part's upload even in a multi-part dump.
    Instrumentation only: the calls run unchanged against the real server."""

    WRAPPED = (
        (S3, "upload_part"),
        (S3, "complete_multipart_upload"),
        (S3, "head"),
        (backup_mod._Backup, "_pump"),
    )

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Timeline:
        for owner, name in self.WRAPPED:
            original = getattr(owner, name)
            self.saved.append((owner, name, original))
            setattr(owner, name, self._timed(name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)

    def _timed(self, name: str, original: Any) -> Any:
        marks = self.marks

        def timed(*args: Any, **kwargs: Any) -> Any:
            marks[f"{name}.start"] = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                marks[f"{name}.end"] = time.monotonic()

        return timed

    def span(self, name: str) -> float:
        return (self.marks[f"{name}.end"] - self.marks[f"{name}.start"]) * 1000


def tail_breakdown(db: Db, s3: S3, bucket: str, runs: int) -> None:
    """The runner's path (client and facts prepared), timed call by call, beside the server's
    own latency for a bodiless write (``CreateMultipartUpload`` + abort) and a ``HEAD``: the
    serial tail after ``pg_dump`` exits is one upload of the last part, the completion and the
    size check, so ``baseline / (baseline + tail)`` is the ceiling this server allows (the tail
    is the median over runs of ``pg_dump``'s EOF → the backup's return, not a sum of medians;
    the baseline is timed before each run, so both sides share the machine's state). Small
    writes (``CreateMultipartUpload``, an empty ``PutObject``) far slower than a ``HEAD`` show
    a server whose HTTP frontend stalls on Nagle's algorithm: a warning says so."""
    to_eof: list[float] = []
    last_part: list[float] = []
    complete: list[float] = []
    head: list[float] = []
    tails: list[float] = []  # per run: the three calls after EOF together
    baselines: list[float] = []  # interleaved, so EOF and the ceiling compare like with like
    for i in range(runs):
        baselines.append(baseline_seconds(db))
        with Timeline() as tl:
            started, elapsed = prepared_backup(db, bucket, 2500 + i)
        to_eof.append(tl.marks["_pump.end"] - started)
        last_part.append(tl.span("upload_part"))
        complete.append(tl.span("complete_multipart_upload"))
        head.append(tl.span("head"))
        tails.append((started + elapsed - tl.marks["_pump.end"]) * 1000)
    create_abort: list[float] = []
    empty_put: list[float] = []
    bare_head: list[float] = []
    for i in range(runs):
        key = f"latency-probe-{i}"
        started = time.monotonic()
        upload_id = s3.create_multipart_upload(bucket, key)
        create_abort.append((time.monotonic() - started) * 1000)
        s3.abort_multipart_upload(bucket, key, upload_id)
        started = time.monotonic()
        s3.client.put_object(Bucket=bucket, Key=key, Body=b"")  # its answer has no body
        empty_put.append((time.monotonic() - started) * 1000)
        s3.delete_object(bucket, key)
        started = time.monotonic()
        s3.head_size(bucket, f"{key}-missing")
        bare_head.append((time.monotonic() - started) * 1000)
    eof = statistics.median(to_eof)
    tail = statistics.median(tails)
    baseline = statistics.median(baselines)
    line("breakdown_backup_start_to_pg_dump_eof", eof, "s", f"{baseline / eof:.2f}x of baseline")
    line("breakdown_last_part_upload", statistics.median(last_part), "ms")
    line("breakdown_complete_multipart_upload", statistics.median(complete), "ms")
    line("breakdown_head_size_check", statistics.median(head), "ms")
    line("breakdown_tail_after_pg_dump_eof", tail, "ms", "median over runs of EOF -> backup done")
    create_ms, head_ms = statistics.median(create_abort), statistics.median(bare_head)
    line("server_bodiless_write_create_multipart_upload", create_ms, "ms")
    line("server_head_of_a_missing_key", head_ms, "ms")
    line("server_put_of_an_empty_object", statistics.median(empty_put), "ms")
    stall = create_ms - head_ms
    if stall > 20:  # a small write ~40 ms slower than a HEAD: Nagle + the client's delayed ACK
        print(
            f"# WARNING: this server answers a small write {stall:.0f} ms later than a HEAD "
            "(CreateMultipartUpload vs HEAD): its HTTP frontend waits on Nagle's algorithm "
            "(for Ceph RGW: beast ... tcp_nodelay=1); every figure here carries that stall"
        )
    line(
        "ceiling_with_this_servers_serial_tail",
        baseline / (baseline + tail / 1000),
        "x",
        f"interleaved baseline {baseline:.3f} s / (baseline + {tail:.0f} ms of tail)",
    )


def line(name: str, value: float, unit: str, ratio: str = "") -> None:
    print(f"{name}: {value:.3f} {unit}" + (f" ({ratio})" if ratio else ""), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=5433)
    parser.add_argument("--tables", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--large-mib", default="1024,3072", help="comma list; empty: skip")
    parser.add_argument(
        "--large-baseline", action="store_true", help="also time pg_dump on the large dumps"
    )
    parser.add_argument(
        "--s3",
        choices=("moto", "rgw"),
        default="moto",
        help="the S3 server: moto (Python, its own process) or the RGW of .ci/rgw.sh (7480)",
    )
    parser.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--bucket", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args)
        return

    from reshard.engines.demo_catalog import build_demo_catalog

    if args.s3 == "rgw":
        moto, endpoint = rgw_server()
    else:
        moto, endpoint = start_moto()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    point_settings_at(endpoint)
    s3 = S3(region="us-east-1", endpoint_url=endpoint, addressing_style="path")
    bucket = f"bench-backup-{os.getpid()}"
    s3.client.create_bucket(Bucket=bucket)
    tag = os.getpid()
    dbs: list[Db] = []
    try:
        print(f"# backup benchmark, {os.cpu_count()} cores, {args.s3} at {endpoint} (own process)")
        line("idle_rss_interpreter", IDLE_RSS / MIB, "MiB")
        line("idle_rss_runner_imports", RUNNER_IDLE_RSS / MIB, "MiB")
        kube_loaded = "kubernetes" in sys.modules
        print(f"# kubernetes client imported by the backup path: {kube_loaded}")

        # --- throughput on the DuckLake catalog ----------------------------------------------
        db = create_db(args.port, f"bench_backup_{tag}")
        dbs.append(db)
        started = time.monotonic()
        with db.conn() as c:
            summary = build_demo_catalog(c, tables=args.tables)
        print(
            f"# catalog: {summary.ducklake_tables} DuckLake tables, {summary.physical_tables} "
            f"ducklake_* tables, {summary.rows} rows, {summary.database_bytes / MIB:.1f} MiB "
            f"database, dump {dump_bytes(db) / MIB:.2f} MiB (built in "
            f"{time.monotonic() - started:.1f} s)"
        )
        base: list[float] = []
        ours: list[float] = []
        ours_prebuilt: list[float] = []
        ours_prepared: list[float] = []
        cpu_self: list[float] = []
        cpu_moto: list[float] = []
        baseline_seconds(db)  # warm the cache for both
        for i in range(args.runs):
            base.append(baseline_seconds(db))
            self0, moto0 = cpu_seconds("self"), cpu_seconds(str(moto.pid))
            ours.append(backup_once(db, s3, bucket, 1000 + i)[0])
            cpu_self.append(cpu_seconds("self") - self0)
            cpu_moto.append(cpu_seconds(str(moto.pid)) - moto0)
            ours_prebuilt.append(backup_once(db, s3, bucket, 1500 + i, prebuilt=True)[0])
            ours_prepared.append(prepared_backup(db, bucket, 2000 + i)[1])
        b, o = statistics.median(base), statistics.median(ours)
        p = statistics.median(ours_prebuilt)
        q = statistics.median(ours_prepared)
        print(
            f"# runs (s): baseline {fmt(base)}; backup {fmt(ours)}; "
            f"backup with a prebuilt client {fmt(ours_prebuilt)}; "
            f"backup with client and facts prepared (the runner) {fmt(ours_prepared)}"
        )
        line(f"pg_dump_devnull_{args.tables}_tables", b, "s")
        line(f"backup_to_s3_{args.tables}_tables", o, "s", f"{b / o:.2f}x throughput vs baseline")
        line(
            f"backup_to_s3_prebuilt_client_{args.tables}_tables",
            p,
            "s",
            f"{b / p:.2f}x throughput vs baseline",
        )
        line(
            f"backup_to_s3_prepared_client_and_facts_{args.tables}_tables",
            q,
            "s",
            f"{b / q:.2f}x throughput vs baseline",
        )
        line(f"backup_cpu_runner_{args.tables}_tables", statistics.median(cpu_self), "s")
        line(f"backup_cpu_{args.s3}_{args.tables}_tables", statistics.median(cpu_moto), "s")
        tail_breakdown(db, s3, bucket, args.runs)

        # --- memory on large incompressible dumps ---------------------------------------------
        for mib in [int(x) for x in args.large_mib.split(",") if x.strip()]:
            big = create_db(args.port, f"bench_backup_big_{mib}_{tag}")
            dbs.append(big)
            started = time.monotonic()
            with big.conn() as c:
                c.execute(
                    "CREATE TABLE ducklake_inlined_data_blob (id int PRIMARY KEY, data bytea)"
                )
                c.execute("ALTER TABLE ducklake_inlined_data_blob ALTER data SET STORAGE EXTERNAL")
                chunk = 1 * MIB
                with (
                    c.cursor() as cur,
                    cur.copy("COPY ducklake_inlined_data_blob FROM STDIN") as cp,
                ):
                    for i in range(mib):
                        cp.write_row((i, os.urandom(chunk)))
            size = big.size()
            print(
                f"# large catalog: {size / MIB:.0f} MiB database of random bytea "
                f"(built in {time.monotonic() - started:.1f} s)"
            )
            t0 = baseline_seconds(big) if args.large_baseline else 0.0
            # A fresh process per backup, as a runner is: idle RSS after the imports the
            # backup step needs, then the peak while backing up.
            out = subprocess.run(
                [
                    sys.executable, os.path.abspath(__file__), "--memory-child", big.name,
                    "--endpoint", endpoint, "--bucket", bucket, "--port", str(args.port),
                ],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            m = json.loads(out.stdout.strip().splitlines()[-1])
            growth = m["peak"] - m["idle"]
            bound = 3 * m["part_size"] + 16 * MIB
            label = f"{m['bytes'] / MIB:.0f}MiB_dump"
            if t0:
                line(f"pg_dump_devnull_{label}", t0, "s")
            line(
                f"backup_to_s3_{label}",
                m["seconds"],
                "s",
                f"{t0 / m['seconds']:.2f}x throughput vs baseline" if t0 else "",
            )
            line(f"backup_rss_idle_{label}", m["idle"] / MIB, "MiB")
            line(
                f"backup_rss_growth_over_idle_{label}",
                growth / MIB,
                "MiB",
                f"{growth / bound:.2f}x of bound 3 x {m['part_size'] // MIB} MiB + 16 MiB "
                f"= {bound / MIB:.0f} MiB",
            )
            line(f"backup_rss_after_{label}", m["after"] / MIB, "MiB")
            line(
                f"backup_peak_buffered_{label}",
                m["peak_buffered"] / MIB,
                "MiB",
                f"{m['peak_buffered'] / (3 * m['part_size']):.2f}x of 3 x part size",
            )
            line(f"backup_parts_{label}", m["parts"], "parts")
            line(f"backup_cpu_runner_{label}", m["cpu"], "s")
            drop_db(big)
            dbs.remove(big)
        line("vm_hwm_process", status_kib("VmHWM") / 1024, "MiB")
    finally:
        for db in dbs:
            drop_db(db)
        moto.kill()
        moto.wait()


if __name__ == "__main__":
    main()
