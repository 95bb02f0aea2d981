"""The Python half of ``make demo`` (driven by scripts/demo.sh; see docs/operations.md).

    demo.py prepare   create the demo tenant catalog on the source store (5433)
    demo.py run       register the stores and the warehouse through the API, start a reshard,
                      follow its op log (``?after=`` paging) until the op is terminal, print
                      the outcome and the report; exit 0 only when the op is terminal and the
                      warehouse is back to ``ready``

Environment (set by demo.sh): DEMO_API_URL, DUCKGRES_INTERNAL_SECRET, DEMO_TENANT_PASSWORD,
DEMO_PROVISIONER_PASSWORD_VAR. No secret is ever printed: only references.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.api_client import TERMINAL, ApiClient  # noqa: E402
from tests.fixtures.stores import StoreCluster, create_tenant_catalog, drop_tenant  # noqa: E402

ORG = "demo-org"
BUCKET = "demo-org-data"
TENANT = "demo_org"
SOURCE = StoreCluster("ci_source", "127.0.0.1", 5433)
TARGET = StoreCluster("ci_target", "127.0.0.1", 5434)
STORES = (("demo-source", SOURCE), ("demo-target", TARGET))


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def prepare() -> int:
    """A DuckLake-shaped catalog of DEMO_TABLES DuckLake tables (default 2,000), owned by the
    tenant role, built by the same generator as ``manage.py make_demo_catalog``."""
    from psycopg import sql

    from reshard.engines.demo_catalog import build_demo_catalog

    for cluster in (SOURCE, TARGET):
        drop_tenant(cluster, TENANT)  # leftovers of an earlier demo run
    create_tenant_catalog(
        SOURCE, name=TENANT, password=os.environ["DEMO_TENANT_PASSWORD"], with_tables=False
    )
    tables = int(os.environ.get("DEMO_TABLES", "2000"))
    started = time.monotonic()
    with SOURCE.superuser_conn(TENANT) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(TENANT)))
        summary = build_demo_catalog(conn, tables=tables)
    say(
        f"tenant catalog {TENANT} on 127.0.0.1:5433 (owner {TENANT}): "
        f"{summary.ducklake_tables} DuckLake tables in {summary.physical_tables} ducklake_* "
        f"tables, {summary.rows} rows, {summary.database_bytes / 2**20:.1f} MiB "
        f"(built in {time.monotonic() - started:.1f} s)"
    )
    return 0


def _check(resp: Any, expected: int, what: str) -> Any:
    if resp.status != expected:
        raise SystemExit(f"demo: {what} answered HTTP {resp.status}: {resp.raw[:500]!r}")
    return resp.body


def _wait_api(api: ApiClient, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            resp = api.get("warehouses")
            if resp.status == 200:
                return
            last = f"HTTP {resp.status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise SystemExit(f"demo: the API did not answer within {timeout:.0f} s; last: {last}")


def _create_bucket() -> None:
    """The org's data bucket on the demo S3 endpoint (moto): backups land under it."""
    import boto3

    boto3.client(
        "s3",
        endpoint_url=os.environ["DUCKGRES_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=BUCKET)
    say(f"S3 bucket {BUCKET} at {os.environ['DUCKGRES_S3_ENDPOINT_URL']} (moto server)")


def run() -> int:
    api = ApiClient.internal(os.environ["DEMO_API_URL"], os.environ["DUCKGRES_INTERNAL_SECRET"])
    _wait_api(api)
    provisioner_ref = f"env:{os.environ['DEMO_PROVISIONER_PASSWORD_VAR']}"
    sslmode = "verify-full" if os.environ.get("DUCKGRES_STORE_SSLROOTCERT") else "require"
    for name, cluster in STORES:
        body = {
            "name": name,
            "kind": "cnpg",
            "host": cluster.host,
            "port": cluster.port,
            "sslmode": sslmode,
            "provisioner_user": cluster.provisioner_user,
            "provisioner_password_ref": provisioner_ref,
        }
        if sslmode != "verify-full":  # no CA to verify against: an explicit, visible opt-in
            body["tls_policy"] = "allow-weaker"
            body["tls_policy_reason"] = "demo on loopback without the services' CA"
        _check(api.post("metadata-stores", body), 201, f"POST /metadata-stores {name}")
        say(f"metadata store {name}: cnpg at {cluster.host}:{cluster.port} (sslmode {sslmode})")
    warehouse = {
        "org_id": ORG,
        "database_name": TENANT,
        "state": "ready",
        "metadata_store_kind": "cnpg",
        "metadata_store_name": "demo-source",
        "metadata_store_database": TENANT,
        "metadata_store_user": TENANT,
        "metadata_store_password_ref": "env:DEMO_TENANT_PASSWORD",
        "compaction_enabled": True,
        "data_bucket": BUCKET,
        "data_region": "us-east-1",
    }
    _create_bucket()
    _check(api.post("warehouses", warehouse), 201, "POST /warehouses")
    say(f"warehouse {ORG}: ready, bound to cnpg demo-source/{TENANT}")

    started = _check(
        api.start_reshard(ORG, {"target": {"type": "cnpg", "cnpg_shard": "demo-target"}}),
        202,
        f"POST /warehouses/{ORG}/reshards",
    )
    op_id = int(started["id"])
    say(f"reshard op {op_id} started: demo-source -> demo-target (state {started['state']})")
    say("following the op log:")

    after = 0
    deadline = time.monotonic() + float(os.environ.get("DEMO_TIMEOUT_SECONDS", "300"))
    report: list[str] = []
    in_report = False
    op: dict[str, Any] = dict(started)
    while True:
        for entry in api.log_entries(op_id, after=after):
            after = int(entry["id"])
            message = str(entry["message"])
            print(f"  {entry['ts']} {entry['level']:<5} {entry['source']:<7} {message}", flush=True)
            if message.startswith("==== reshard report"):
                in_report = True
            if in_report:
                report.append(message)
            if message.startswith("runner log persisted"):
                in_report = False
        if op.get("state") in TERMINAL:
            # One last page after the terminal state, then stop.
            if not api.log_entries(op_id, after=after):
                break
            continue
        if time.monotonic() > deadline:
            say(f"op {op_id} not terminal in time: state {op.get('state')}, step {op.get('step')}")
            return 1
        time.sleep(0.5)
        op = api.op(op_id)

    wh = _check(api.get(f"warehouses/{ORG}"), 200, f"GET /warehouses/{ORG}")
    print()
    say(f"outcome: op {op_id} {op['state']}" + (f": {op['error']}" if op.get("error") else ""))
    say(
        f"warehouse {ORG}: {wh['state']}, bound to {wh['metadata_store_kind']} "
        f"{wh.get('metadata_store_name') or wh.get('metadata_store_host')}/"
        f"{wh['metadata_store_database']}"
    )
    if report:
        say("report:")
        for line in report:
            print(f"  {line}")
    if wh["state"] != "ready":
        say("FAILED: the warehouse is not back to ready")
        return 1
    if op.get("backup_s3_uri"):
        say(f"pre-flip catalog backup: {op['backup_s3_uri']} ({op['backup_bytes']} bytes)")
    if op["state"] == "succeeded":
        say("the catalog moved to demo-target and the warehouse is ready")
    else:
        say(
            "the operation did not complete and was rolled back: the warehouse is ready on its "
            "original store. This build does not implement every reshard step yet "
            "(docs/operations.md)."
        )
    return 0


def main(argv: list[str]) -> int:
    if argv == ["prepare"]:
        return prepare()
    if argv == ["run"]:
        return run()
    print("usage: demo.py prepare|run", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
