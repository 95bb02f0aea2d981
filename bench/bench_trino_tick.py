"""Operator tick benchmark (issue 5): one tick over 16 pools x 1,000 enabled tenants.

    .venv/bin/python scripts/with_test_env.py bench/bench_trino_tick.py [--pools N] [--tenants N]

Needs the local services of ``.ci/services.sh`` (PostgreSQL on 5432, the kube-apiserver on
https://127.0.0.1:16443). It creates its own databases (``duckgres_bench_trino`` for the config
store, ``duckgres_bench_trino_catalogs`` for the catalog store), one namespace per pool on the
kube-apiserver and a Gateway double, then runs the real ``Operator.tick``:

- every pool has tenant admission on, desired 1 instance, and its tenants enabled and owned;
- the first ticks create each pool's candidate and its Kubernetes objects; the measured ticks
  are the steady state after that (per pool: the ConfigMap read, the fenced spec writes, one
  tenant step -- a principals publication -- the instance listing and snapshot, the candidate's
  readiness reads);
- **baseline**: the same pools with ``--baseline-tenants`` (10) tenants each, measured in the same
  run; then the remaining tenants are enabled and the same ticks are measured again.

Prints ``name: value unit (ratio vs baseline)`` lines, including the config-store queries per pool
per tick at both sizes (the target is constant queries per pool and a tick <= 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from benchdb import recreate, setup_django

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DB = "duckgres_bench_trino"
CATALOG_DB = "duckgres_bench_trino_catalogs"


def add_tenants(pool_ids: list[str], start: int, stop: int) -> None:
    """Enabled, owned, ready warehouses ``start..stop-1`` in every pool (bulk inserts)."""
    from duckgres_admin.models import Warehouse
    from duckgres_admin.models.trino import WarehouseTrino

    for pool_id in pool_ids:
        short = pool_id.removeprefix("registered:")
        warehouses = [
            Warehouse(
                org_id=f"org-{short}-{n:05d}",
                database_name=f"{short.replace('-', '_')}_wh_{n:05d}",
                state="ready",
                metadata_store_kind="external",
                metadata_store_host="meta-1.example.internal",
                metadata_store_port=5432,
                metadata_store_sslmode="require",
                metadata_store_database=f"wh_{n:05d}",
                metadata_store_user=f"wh_{n:05d}",
                metadata_store_password_ref="env:TENANT_PASSWORD",
                data_bucket="tenant-data",
                data_region="us-east-1",
            )
            for n in range(start, stop)
        ]
        Warehouse.objects.bulk_create(warehouses, batch_size=1000)
        WarehouseTrino.objects.bulk_create(
            [
                WarehouseTrino(warehouse=w, enabled=True, trino_cell_id=pool_id, state="ready")
                for w in warehouses
            ],
            batch_size=1000,
        )


def measure(world: Any, ticks: int) -> tuple[list[float], list[int]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    durations, queries = [], []
    for _ in range(ticks):
        connection.queries_log.clear()  # a bounded deque: a full one would hide this tick's
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            report = world.operator.tick(world.settings)
            durations.append(time.perf_counter() - started)
        queries.append(len(captured.captured_queries))
        failed = {p: r for p, r in report.pools.items() if r.startswith(("failed", "fenced"))}
        if failed or not report.leader:
            raise SystemExit(f"a tick did not run cleanly: leader={report.leader} {failed}")
    return durations, queries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--baseline-tenants", type=int, default=10)
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()

    recreate(CONFIG_DB)
    recreate(CATALOG_DB)
    with psycopg.connect(
        f"postgresql://postgres@127.0.0.1:5432/{CATALOG_DB}", autocommit=True
    ) as conn:
        conn.execute("CREATE SCHEMA trino_catalogs")
    setup_django(CONFIG_DB)

    from django.conf import settings as django_settings
    from django.db import connection
    from kubernetes import client

    from tests.fixtures.availability import kube_token, kube_unavailable, kube_url
    from tests.fixtures.kube import KubeApi, kube_client
    from tests.fixtures.trino import CatalogStore
    from tests.trino.gateway_double import GatewayDouble
    from tests.trino.operator_harness import make_world

    reason = kube_unavailable()
    if reason:
        raise SystemExit(f"the kube-apiserver is needed: {reason}")
    api_client = kube_client()
    core = client.CoreV1Api(api_client)
    namespace = f"bench-{secrets.token_hex(4)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    kube = KubeApi(kube_url(), kube_token(), namespace, api_client, core)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO duckgres_leases (name, holder, epoch, expires_at) "
            "VALUES ('trino', '', 0, '-infinity') ON CONFLICT (name) DO NOTHING"
        )
    gateway = GatewayDouble().start()
    pools = tuple(f"pool-{i:02d}" for i in range(args.pools))
    with tempfile.TemporaryDirectory() as tmp:
        world = make_world(
            kube,
            gateway,
            Path(tmp),
            django_settings,
            pools=pools,
            desired_instances=1,
            min_serving=1,
            tenant_admission=True,
            catalog_store=CatalogStore(database=CATALOG_DB, schema="trino_catalogs"),
        )
        try:
            pool_ids = [world.cell(p).stored_id for p in pools]
            add_tenants(pool_ids, 0, args.baseline_tenants)
            measure(world, 3)  # terms, candidates, their objects: the steady state after this
            base_t, base_q = measure(world, args.ticks)
            add_tenants(pool_ids, args.baseline_tenants, args.tenants)
            measure(world, 1)  # publication rows of the new tenants are created once
            big_t, big_q = measure(world, args.ticks)
        finally:
            world.operator.end_all_terms("bench done")
            world.close()
            gateway.stop()
            with contextlib.suppress(Exception):  # best-effort cleanup
                core.delete_namespace(namespace)

    base_med, big_med = statistics.median(base_t), statistics.median(big_t)
    n, b = args.tenants, args.baseline_tenants
    print(f"pools: {args.pools}; tenants per pool: {b} (baseline) and {n}; ticks: {args.ticks}")
    print(f"tick with {b} tenants/pool (baseline): {base_med:.3f} s (1.00x)")
    print(f"tick with {n} tenants/pool: {big_med:.3f} s ({big_med / base_med:.2f}x vs baseline)")
    print(f"tick with {n} tenants/pool, worst of {args.ticks}: {max(big_t):.3f} s")
    bq, gq = statistics.median(base_q) / args.pools, statistics.median(big_q) / args.pools
    print(f"config-store queries per pool per tick, {b} tenants: {bq:.1f} (1.00x)")
    print(f"config-store queries per pool per tick, {n} tenants: {gq:.1f} ({gq / bq:.2f}x)")
    verdict = "meets" if big_med <= 1.0 else "misses"
    print(f"target tick <= 1 s at {args.pools} x {n}: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
