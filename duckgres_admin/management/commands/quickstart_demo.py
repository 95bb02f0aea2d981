"""``manage.py quickstart_demo``: the quickstart overlay's demo reshard (docs/kubernetes.md
"Quickstart"), run by its Job ``duckgres-quickstart-demo`` inside the cluster.

Once the API answers through its Service: a DuckLake-shaped catalog for the tenant
``quickstart`` on the store ``quickstart-a`` (built as the provisioner, owned by the tenant),
the two in-cluster stores and the warehouse registered through the API (as an operator would),
and one reshard to ``quickstart-b`` started and followed to its end. Every step first looks
whether it is done already, so a retried Job repeats only what is missing; an operation that
already exists for the org is followed, never started twice.

Passwords come only from the environment (the Secret ``duckgres-quickstart``); the stores and
the warehouse name them by reference (``k8s:<namespace>/duckgres-store-quickstart#provisioner``,
``…/duckgres-tenant-quickstart#password``). Exit 0 only when the operation succeeded and the
warehouse is ``ready``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from psycopg import sql

from duckgres_admin.lib import http
from reshard.engines.demo_catalog import build_demo_catalog, create_database

ORG = "quickstart"
TENANT = "quickstart"
BUCKET = "duckgres-quickstart-data"
STORES = {"quickstart-a": 1, "quickstart-b": 2}  # store name -> StatefulSet ordinal
TERMINAL = ("succeeded", "failed", "cancelled")


class Api:
    """JSON calls to the API's Service with the internal secret (the automation identity)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.headers = {
            "X-Duckgres-Internal-Secret": settings.DUCKGRES_INTERNAL_SECRET,
            "Accept": "application/json",
            "Content-Type": "application/json",
        }

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        response = http.request(
            method,
            f"{self.base_url}/api/v1/{path}",
            headers=self.headers,
            body=None if body is None else json.dumps(body).encode(),
            timeout=30,
            max_bytes=4 * 1024 * 1024,
        )
        return response.status, (json.loads(response.body) if response.body else None)

    def expect(self, method: str, path: str, status: int, body: Any = None) -> Any:
        got, answer = self.call(method, path, body)
        if got != status:
            raise CommandError(f"{method} /api/v1/{path} answered HTTP {got}: {answer}")
        return answer


class Command(BaseCommand):
    help = "The quickstart's demo: a tenant catalog, two stores, a warehouse and a reshard."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tables", type=int, default=200, help="DuckLake tables")
        parser.add_argument("--api-url", default="http://duckgres-admin-api:8080")
        parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole demo")

    def say(self, message: str) -> None:
        self.stdout.write(f"quickstart: {message}")
        self.stdout.flush()

    def handle(self, *args: Any, **opts: Any) -> None:
        deadline = time.monotonic() + float(opts["timeout"])
        namespace = os.environ["POD_NAMESPACE"]
        api = Api(opts["api_url"])
        self.wait_for_api(api, deadline)
        self.tenant_catalog(_store_host(namespace, "quickstart-a"), int(opts["tables"]))
        for name in STORES:
            self.register_store(api, name, namespace)
        self.register_warehouse(api, namespace)
        op_id = self.start_or_find(api)
        op = self.follow(api, op_id, deadline)
        warehouse = api.expect("GET", f"warehouses/{ORG}", 200)
        self.say(
            f"operation {op_id} {op['state']}; warehouse {ORG} is {warehouse['state']} on "
            f"{warehouse.get('metadata_store_name')}"
        )
        if op["state"] != "succeeded" or warehouse["state"] != "ready":
            raise CommandError(f"the demo reshard ended {op['state']}: {op.get('error') or ''}")

    def wait_for_api(self, api: Api, deadline: float) -> None:
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                status, _ = api.call("GET", "warehouses")
                if status == 200:
                    self.say(f"the API answers at {api.base_url}")
                    return
                last = f"HTTP {status}"
            except http.HttpTransportError as exc:
                last = str(exc)
            self.say(f"waiting for the API ({last})")
            time.sleep(3)
        raise CommandError(f"the API did not answer in time; last: {last}")

    def tenant_catalog(self, host: str, tables: int) -> None:
        """The tenant's role, database and catalog on ``quickstart-a``, each made only when
        missing (a Job retried after a partial build finishes it)."""
        password = os.environ["QUICKSTART_PROVISIONER_PASSWORD"]
        tenant_password = os.environ["QUICKSTART_TENANT_PASSWORD"]
        common: dict[str, Any] = {
            "host": host, "port": 5432, "user": "provisioner", "password": password,
            "sslmode": "require", "connect_timeout": 10,
        }  # fmt: skip
        role = sql.Identifier(TENANT)
        with psycopg.connect(dbname="postgres", autocommit=True, **common) as conn:
            conn.execute("SET lock_timeout = '10s'")
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (TENANT,)).fetchone():
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        role, sql.Literal(tenant_password)
                    )
                )
            conn.execute(sql.SQL("GRANT {} TO provisioner").format(role))
            if not conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (TENANT,)
            ).fetchone():
                create_database(conn, TENANT, TENANT)
        with psycopg.connect(dbname=TENANT, **common) as conn:
            conn.execute("SET lock_timeout = '10s'")
            built = conn.execute("SELECT to_regclass('public.ducklake_snapshot')").fetchone()
            if built and built[0] is not None:
                self.say(f"tenant catalog {TENANT} on quickstart-a exists: kept")
                return
            conn.execute(sql.SQL("SET ROLE {}").format(role))
            summary = build_demo_catalog(conn, tables=tables)
        self.say(
            f"tenant catalog {TENANT} on quickstart-a: {summary.ducklake_tables} DuckLake "
            f"tables, {summary.rows} rows"
        )

    def register_store(self, api: Api, name: str, namespace: str) -> None:
        status, _ = api.call("GET", f"metadata-stores/{name}")
        if status == 200:
            self.say(f"metadata store {name} is registered: kept")
            return
        api.expect(
            "POST",
            "metadata-stores",
            201,
            {
                "name": name,
                "kind": "cnpg",
                "host": _store_host(namespace, name),
                "port": 5432,
                "sslmode": "require",
                "tls_policy": "allow-weaker",
                "tls_policy_reason": "quickstart: self-signed certificates, no CA to verify",
                "provisioner_user": "provisioner",
                "provisioner_password_ref": (
                    f"k8s:{namespace}/duckgres-store-quickstart#provisioner"
                ),
            },
        )
        self.say(f"metadata store {name} registered at {_store_host(namespace, name)}")

    def register_warehouse(self, api: Api, namespace: str) -> None:
        status, _ = api.call("GET", f"warehouses/{ORG}")
        if status == 200:
            self.say(f"warehouse {ORG} is registered: kept")
            return
        api.expect(
            "POST",
            "warehouses",
            201,
            {
                "org_id": ORG,
                "database_name": TENANT,
                "state": "ready",
                "metadata_store_kind": "cnpg",
                "metadata_store_name": "quickstart-a",
                "metadata_store_database": TENANT,
                "metadata_store_user": TENANT,
                "metadata_store_password_ref": (
                    f"k8s:{namespace}/duckgres-tenant-quickstart#password"
                ),
                "data_bucket": BUCKET,
                "data_region": "us-east-1",
            },
        )
        self.say(f"warehouse {ORG} registered on quickstart-a")

    def start_or_find(self, api: Api) -> int:
        listed = api.expect("GET", f"reshards?org={ORG}&limit=1", 200)
        if listed["operations"]:
            op_id = int(listed["operations"][0]["id"])
            self.say(f"operation {op_id} exists for {ORG}: following it")
            return op_id
        started = api.expect(
            "POST",
            f"warehouses/{ORG}/reshards",
            202,
            {"target": {"type": "cnpg", "cnpg_shard": "quickstart-b"}},
        )
        self.say(f"reshard {started['id']} started: quickstart-a -> quickstart-b")
        return int(started["id"])

    def follow(self, api: Api, op_id: int, deadline: float) -> dict[str, Any]:
        after = 0
        while True:
            op = api.expect("GET", f"reshards/{op_id}", 200)
            page = api.expect("GET", f"reshards/{op_id}/log?after={after}", 200)
            for entry in page.get("entries", []):
                after = max(after, int(entry["id"]))
                self.say(f"[{entry['source']}] {entry['message']}")
            if op["state"] in TERMINAL and not page.get("entries"):
                return dict(op)
            if time.monotonic() > deadline:
                raise CommandError(f"operation {op_id} still {op['state']} at the deadline")
            time.sleep(2)


def _store_host(namespace: str, store: str) -> str:
    return f"duckgres-quickstart-pg-{STORES[store]}.duckgres-quickstart-pg.{namespace}.svc"
