"""The lease path under load (issue 15 item 1): the API exactly as deployed (gunicorn with the
shipped ``duckgres_admin.gunicorn_conf``: 1 process, 16 threads, TLS-free loopback, the config
store over TLS) driven by ``wrk`` with ``bench/leases.lua``, beside its baselines from the same
run.

    .venv/bin/python scripts/with_test_env.py bench/bench_leases.py [--orgs 1000] [--clients 8]
        [--duration 20] [--storm]

Prerequisites: PostgreSQL on 5432 (``.ci/services.sh``) and ``wrk`` (Debian package ``wrk``;
this bench runs ``apt-get install -y --no-install-recommends wrk`` when it is missing). It
creates its own config-store database ``duckgres_bench_leases`` and ``--orgs`` warehouses
``org-0000`` … with caps (90 % cap 4, 10 % cap 1, so some grants meet ``429``).

Measured, each with ``--clients`` concurrent wrk clients for ``--duration`` seconds:

- **baselines**: ``GET /livez`` on the same process (the framework floor), one ``SELECT 1``
  round trip on an open TLS connection to the config store, and a new TLS connection + ``SELECT
  1`` (what every request paid with ``CONN_MAX_AGE`` 0);
- ``grant_release`` (grant, then release it) and ``mix`` (grant, renew, release), closed loop;
  then ``grant_release`` at about 70 % of its maximum rate (a think time per client, corrected
  by two short calibration runs) for p99;
- one client, ``grant_release`` (latency per request without queueing);
- config-store queries per grant / renew / release (Django's ``CaptureQueriesContext`` around
  the same requests in this process), and, from ``pg_stat_database`` over the wrk runs,
  transactions and **sessions opened per request** (connection reuse).

``--storm``: the same mix over the other orgs while a busy org (``org-busy``, cap 50) takes its
own clients' grants and releases; the runner's block transaction (per-org lock, CAS ``ready →
resharding``, stamped with ``clock_timestamp()`` under the lock), its drain passes
(``reshard.runner.steps.draining.drain_pass``) until zero, a hold, then the unblock. Reports the
grants to the busy org between the block's commit and the unblock (counted from the database),
the drain time, and the other orgs' p99 during the window beside the same clients before it.
The full reshard (runner process, copy, finalize) in the middle of a storm is the suite's
``tests/reshard/test_lease_storm.py``.

Prints ``name: value unit (ratio vs baseline)`` lines.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchdb import recreate, setup_django

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DB = "duckgres_bench_leases"
LUA = Path(__file__).resolve().parent / "leases.lua"
BUSY_ORG = "org-busy"


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("installing wrk (apt-get install -y --no-install-recommends wrk)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "wrk"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return shutil.which("wrk") or "wrk"


def seed(orgs: int) -> None:
    from duckgres_admin.models import MetadataStore, Warehouse

    store = MetadataStore.objects.create(
        name="bench-store",
        kind="cnpg",
        host="direct.example",
        port=5432,
        sslmode="require",
        pooler_host="pool.example",
        pooler_port=6432,
        provisioner_user="provisioner",
        provisioner_password_ref="env:DUCKGRES_TEST_PROVISIONER_PASSWORD",
    )

    def row(org: str, cap: int | None) -> Warehouse:
        return Warehouse(
            org_id=org,
            state="ready",
            metadata_store_kind="cnpg",
            metadata_store=store,
            database_name=org.replace("-", "_"),
            metadata_store_database=org.replace("-", "_"),
            metadata_store_user=org.replace("-", "_"),
            metadata_store_password_ref="env:TENANT_PW",
            max_connection_leases=cap,
        )

    rows = [row(f"org-{i:04d}", 1 if i % 10 == 0 else 4) for i in range(orgs)]
    rows.append(row(BUSY_ORG, 50))
    Warehouse.objects.bulk_create(rows, batch_size=500)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def gunicorn(log_path: Path) -> Iterator[int]:
    """The API as shipped: ``gunicorn -c python:duckgres_admin.gunicorn_conf``."""
    port = free_port()
    env = {
        **os.environ,
        "DUCKGRES_HTTP_BIND": f"127.0.0.1:{port}",
        "DUCKGRES_API_METRICS_PORT": "0",
        "PYTHONPATH": str(ROOT),
    }
    exe = Path(sys.executable).parent / "gunicorn"
    cmd = [str(exe), "-c", "python:duckgres_admin.gunicorn_conf", "duckgres_admin.wsgi:application"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        import http.client

        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/livez")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not answer /livez")
            time.sleep(0.2)
        yield port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@dataclass
class WrkResult:
    rps: float
    requests: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    stats: dict[str, int] = field(default_factory=dict)
    socket_errors: int = 0

    def status_count(self, prefix: str) -> int:
        return sum(n for key, n in self.stats.items() if key.split()[1].startswith(prefix))

    def describe(self) -> str:
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(self.stats.items()))
        return (
            f"{self.requests} requests, p50 {self.p50_ms:.1f} ms, p90 {self.p90_ms:.1f} ms, "
            f"p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms; {kinds}; "
            f"socket errors {self.socket_errors}"
        )


def run_wrk(
    wrk: str,
    port: int,
    *,
    mode: str,
    clients: int,
    duration: float,
    orgs: int,
    think_ms: float = 0.0,
    prefix: str = "org-",
    busy_share: int = 0,
) -> WrkResult:
    secret = os.environ["DUCKGRES_DATAPLANE_SECRET"]
    cmd = [
        wrk, "-t", str(clients), "-c", str(clients), "-d", f"{max(1, round(duration))}s",
        "--timeout", "10s", "--latency", "-s", str(LUA), f"http://127.0.0.1:{port}", "--",
        secret, str(orgs), mode, f"{think_ms:.3f}", prefix, BUSY_ORG, str(busy_share),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed: {done.stdout}\n{done.stderr}")
    out = done.stdout
    stats = {
        f"{m.group(1)} {m.group(2)}": int(m.group(3))
        for m in re.finditer(r"^STAT (\S+) (\d+) (\d+)$", out, re.M)
    }
    lat = {m.group(1): int(m.group(2)) / 1000 for m in re.finditer(r"^LAT (\S+) (\d+)$", out, re.M)}
    summary = re.search(r"^SUMMARY requests (\d+) duration_us (\d+) (.*)$", out, re.M)
    assert summary, out
    requests, duration_us = int(summary.group(1)), int(summary.group(2))
    errors = sum(int(n) for n in re.findall(r"errors_(?:connect|read|write|timeout) (\d+)", out))
    return WrkResult(
        rps=requests / (duration_us / 1e6),
        requests=requests,
        p50_ms=lat["p50"],
        p90_ms=lat["p90"],
        p99_ms=lat["p99"],
        max_ms=lat["max"],
        mean_ms=lat["mean"],
        stats=stats,
        socket_errors=errors,
    )


def db_counters() -> tuple[int, int]:
    """(transactions committed + rolled back, sessions opened) of the bench database."""
    import psycopg

    dsn = os.environ["DUCKGRES_CONFIG_STORE"].replace(f"/{CONFIG_DB}", "/postgres")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database WHERE datname = %s",
            [CONFIG_DB],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def select1_baselines() -> tuple[float, float]:
    """(median SELECT 1 round trip on an open TLS connection, median new TLS connection +
    SELECT 1), in ms."""
    import psycopg

    dsn = os.environ["DUCKGRES_CONFIG_STORE"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        tls = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert tls is not None, "no pg_stat_ssl row"
        assert tls[0], "the config-store connection is not TLS"
        rtts = []
        for _ in range(300):
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            rtts.append((time.perf_counter() - started) * 1000)
    connects = []
    for _ in range(30):
        started = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT 1").fetchone()
        connects.append((time.perf_counter() - started) * 1000)
    return statistics.median(rtts), statistics.median(connects)


def queries_per_request() -> dict[str, int]:
    """Config-store queries of one grant, renew and release (the views, in this process)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_X_DUCKGRES_DATAPLANE_SECRET=os.environ["DUCKGRES_DATAPLANE_SECRET"])
    base = "/api/v1/warehouses/org-0001/leases"
    body = {"holder": "count", "purpose": "query", "ttl_seconds": 60}
    out: dict[str, int] = {}
    with CaptureQueriesContext(connection) as grant:
        resp = client.post(base, body, content_type="application/json")
    assert resp.status_code == 201, resp.content
    lease_id = resp.json()["lease_id"]
    out["grant"] = len(grant)
    out["grant_tx"] = sum(q["sql"] in ("BEGIN", "COMMIT") for q in grant.captured_queries)
    with CaptureQueriesContext(connection) as renew:
        resp = client.post(f"{base}/{lease_id}/renew", {}, content_type="application/json")
    assert resp.status_code == 200, resp.content
    out["renew"] = len(renew)
    with CaptureQueriesContext(connection) as release:
        resp = client.delete(f"{base}/{lease_id}")
    assert resp.status_code == 204, resp.content
    out["release"] = len(release)
    connection.close()
    return out


def calibrate_think(
    wrk: str, port: int, target: float, loaded_p50_ms: float, common: dict[str, Any]
) -> float:
    """The think time per client that offers about ``target`` requests/s: a first guess from
    the closed-loop latency, then two short runs (a quarter of ``--duration`` each, at least
    2 s) that correct it by the cycle time they measure (latency drops as the load does, so the
    first guess overshoots the rate)."""
    clients = int(common["clients"])
    think = max(0.0, clients * 1000 / target - loaded_p50_ms * 0.6)
    short = {**common, "duration": max(2.0, common["duration"] / 4)}
    for _ in range(2):
        probe = run_wrk(wrk, port, mode="grant_release", think_ms=think, **short)
        if not probe.rps:
            break
        think = max(0.0, think + clients * 1000 / target - clients * 1000 / probe.rps)
    return think


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


def storm(wrk: str, port: int, args: argparse.Namespace) -> None:
    """Block / drain / unblock of the busy org in the middle of a storm over the others."""
    from django.db import connection, transaction

    from duckgres_admin.models import ConnectionLease, Warehouse
    from duckgres_admin.platform.orglock import lock_org
    from reshard.runner.steps.draining import drain_pass

    busy_clients = max(2, args.clients // 2)
    window = float(args.window)
    total = window * 2 + 20
    busy: dict[str, WrkResult] = {}

    def busy_load() -> None:
        busy["all"] = run_wrk(
            wrk, port, mode="mix", clients=busy_clients, duration=total, orgs=1, busy_share=100
        )

    background = threading.Thread(target=busy_load)
    background.start()
    time.sleep(2)
    before = run_wrk(wrk, port, mode="mix", clients=args.clients, duration=window, orgs=args.orgs)
    during: dict[str, WrkResult] = {}

    def others_during() -> None:
        during["all"] = run_wrk(
            wrk, port, mode="mix", clients=args.clients, duration=window, orgs=args.orgs
        )

    measured = threading.Thread(target=others_during)
    measured.start()
    started = time.monotonic()
    with transaction.atomic():
        lock_org(BUSY_ORG)
        moved = Warehouse.objects.filter(org_id=BUSY_ORG, state="ready").update(
            state="resharding", status_message="metadata-store reshard in progress"
        )
        assert moved == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            blocked_at = cursor.fetchone()[0]
    passes = 0
    while True:
        active, queued, _ = drain_pass(BUSY_ORG)
        passes += 1
        if active == 0 and queued == 0:
            break
        time.sleep(0.05)
    drained = time.monotonic() - started
    time.sleep(max(0.0, window - (time.monotonic() - started) - 0.5))
    with transaction.atomic():
        lock_org(BUSY_ORG)
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            unblocked_at = cursor.fetchone()[0]
        Warehouse.objects.filter(org_id=BUSY_ORG, state="resharding").update(state="ready")
    measured.join()
    background.join()
    granted_in_window = ConnectionLease.objects.filter(
        org_id=BUSY_ORG, granted_at__gte=blocked_at, granted_at__lte=unblocked_at
    ).count()
    granted_total = ConnectionLease.objects.filter(
        org_id=BUSY_ORG, granted_at__isnull=False
    ).count()
    after = during["all"]
    print(f"storm: busy org {BUSY_ORG} ({busy_clients} clients): {busy['all'].describe()}")
    print(f"storm: other orgs before the block ({args.clients} clients): {before.describe()}")
    print(f"storm: other orgs during the window: {after.describe()}")
    print(f"storm: grants to {BUSY_ORG} between the block's commit and the unblock: "
          f"{granted_in_window} (of {granted_total} granted in the run)")  # fmt: skip
    print(f"storm: drain completed: {drained * 1000:.0f} ms after the block ({passes} passes)")
    print(f"storm: other orgs p99 during / before: {after.p99_ms:.1f} / {before.p99_ms:.1f} ms "
          f"({ratio(after.p99_ms, before.p99_ms)}, target <= 1.25x)")  # fmt: skip
    fives = sum(r.status_count("5") for r in (before, after))
    busy_5xx = {k: n for k, n in busy["all"].stats.items() if k.split()[1].startswith("5")}
    print(f"storm: 5xx to other orgs: {fives}; busy org 5xx by route: {busy_5xx} "
          "(503 warehouse_resharding is the refusal)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orgs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--storm", action="store_true")
    parser.add_argument("--window", type=float, default=10.0, help="storm: block → unblock, s")
    args = parser.parse_args()

    wrk = ensure_wrk()
    recreate(CONFIG_DB)
    setup_django(CONFIG_DB)
    from django.conf import settings

    seed(args.orgs)
    print(
        f"config store: CONN_MAX_AGE {settings.DATABASES['default']['CONN_MAX_AGE']}, "
        f"CONN_HEALTH_CHECKS {settings.DATABASES['default'].get('CONN_HEALTH_CHECKS', False)}; "
        f"{args.orgs} orgs; {args.clients} clients; {args.duration:g} s per run; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    counts = queries_per_request()
    rtt, connect = select1_baselines()
    print(f"baseline: SELECT 1 round trip (open TLS connection): {rtt:.3f} ms")
    print(f"baseline: new TLS connection + SELECT 1: {connect:.2f} ms")
    print(
        f"queries per request: grant {counts['grant']} (of which BEGIN/COMMIT "
        f"{counts['grant_tx']}), renew {counts['renew']}, release {counts['release']}; plus, "
        "with persistent connections, the health check's SELECT 1 per request (not logged)"
    )
    with tempfile.TemporaryDirectory() as tmp, gunicorn(Path(tmp) / "gunicorn.log") as port:
        common: dict[str, Any] = {
            "clients": args.clients,
            "duration": args.duration,
            "orgs": args.orgs,
        }
        livez = run_wrk(wrk, port, mode="livez", **common)
        print(f"baseline: /livez: {livez.rps:.0f} requests/s; {livez.describe()}")
        xacts0, sessions0 = db_counters()
        grant = run_wrk(wrk, port, mode="grant_release", **common)
        xacts1, sessions1 = db_counters()
        print(
            f"grant+release: {grant.rps:.0f} requests/s ({ratio(grant.rps, livez.rps)} of "
            f"/livez); {grant.describe()}"
        )
        print(
            f"grant+release: config-store transactions per request "
            f"{(xacts1 - xacts0) / grant.requests:.2f}, sessions opened per request "
            f"{(sessions1 - sessions0) / grant.requests:.4f} ({sessions1 - sessions0} in total)"
        )
        mix = run_wrk(wrk, port, mode="mix", **common)
        print(f"mix (grant, renew, release): {mix.rps:.0f} requests/s "
              f"({ratio(mix.rps, livez.rps)} of /livez); {mix.describe()}")  # fmt: skip
        think = calibrate_think(wrk, port, 0.7 * grant.rps, grant.p50_ms, common)
        paced = run_wrk(wrk, port, mode="grant_release", think_ms=think, **common)
        print(f"grant+release at ~70 % of the maximum rate (think {think:.1f} ms per client): "
              f"{paced.rps:.0f} requests/s ({ratio(paced.rps, grant.rps)} of the maximum); "
              f"{paced.describe()}")  # fmt: skip
        one = run_wrk(wrk, port, mode="grant_release", clients=1, duration=args.duration / 2,
                      orgs=args.orgs)  # fmt: skip
        print(f"grant+release, one client: {one.rps:.0f} requests/s; {one.describe()}")
        for result in (livez, grant, mix, paced, one):
            if result.status_count("5") or result.socket_errors:
                print("WARNING: 5xx or socket errors in a run above")
        if args.storm:
            storm(wrk, port, args)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (2 cores, shared machine)")


if __name__ == "__main__":
    main()
