"""The product deployed on the real one-node cluster (marker ``pods``; docs/testing.md).

Once per session ``deployed`` installs the control plane exactly as an operator does — the
namespace, the Secret, ``kubectl apply -k`` of the test overlay over ``k8s/`` — after importing
the image built by ``make image`` into the node's containerd, then waits for the migration Job
and every Deployment. What stays on the host, reached by the pods at the bridge address
10.244.0.1: the config store (a fresh database ``duckgres_pods`` with a password login, so no
pytest-django database is shared with the pods), Redis (db 4), the two store clusters
(5433/5434) and an S3 server (moto, 10.244.0.1:19000). The tests drive the API only through its
Service and read what they check from the cluster, the config store and S3 directly.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fixtures.api_client import ApiClient
from tests.fixtures.availability import pods_unavailable
from tests.fixtures.stores import StoreCluster, StoreClusters

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = Path(os.environ.get("NODE_DIR", "/var/tmp/duckgres-ci/kube-node"))
KUBECONFIG = NODE_DIR / "admin.kubeconfig"
NODE_IP = "10.244.0.1"
NAMESPACE = "duckgres"
S3_PORT = 19000
BUCKET = "duckgres-pods"
DATABASE = "duckgres_pods"
BROKER_DB = 4
IMAGE_ARCHIVE = ROOT / "var" / "image" / "duckgres-admin-0.1.0.oci.tar"
STORE_SECRET = "duckgres-store-pods"
TENANT_SECRET = "duckgres-tenant-pods"
DEPLOYMENTS = (
    "duckgres-admin-api",
    "duckgres-admin-worker",
    "duckgres-admin-control-worker",
    "duckgres-admin-beat",
    "duckgres-admin-trino-worker",
)


def kubectl(*args: str, input: str | None = None, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def wait_until(predicate: Callable[[], Any], what: str, timeout: float, poll: float = 0.5) -> Any:
    """Poll until ``predicate`` returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Deployed:
    api: ApiClient
    service_ip: str
    config_store_dsn: str  # host-side DSN of duckgres_pods (as postgres, trusted on loopback)
    secrets: dict[str, str]
    s3: Any
    clusters: StoreClusters
    pod_stores: dict[str, StoreCluster] = field(default_factory=dict)

    def db(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(self.config_store_dsn, autocommit=True, connect_timeout=5)

    def one(self, sql: str, *params: Any) -> Any:
        with self.db() as conn:
            row = conn.execute(sql, params).fetchone()
        return None if row is None else (row[0] if len(row) == 1 else row)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return list(kubectl_json("-n", NAMESPACE, "get", "pods", "-l", selector)["items"])

    def put_secret_key(self, name: str, key: str, value: str) -> None:
        """Add or replace one key of a Secret in the namespace (never in argv)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "type": "Opaque",
        }
        current = kubectl("-n", NAMESPACE, "get", "secret", name, "-o", "json", check=False)
        data = json.loads(current).get("data", {}) if current.strip() else {}
        data[key] = base64.b64encode(value.encode()).decode()
        doc["data"] = data
        kubectl("apply", "-f", "-", input=json.dumps(doc))


def _psql_admin(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAt", "-v",
         "ON_ERROR_STOP=1", "-c", sql],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def _fresh_config_store(password: str) -> str:
    """A fresh, empty config-store database for the pods, owned by a password login."""
    _psql_admin(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    exists = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc",
         f"SELECT 1 FROM pg_roles WHERE rolname = '{DATABASE}'"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    verb = "ALTER" if exists else "CREATE"
    _psql_admin(f"{verb} ROLE {DATABASE} LOGIN PASSWORD '{password}'")
    _psql_admin(f"CREATE DATABASE {DATABASE} OWNER {DATABASE}")
    return f"postgresql://postgres@127.0.0.1:5432/{DATABASE}?sslmode=require"


def _reset_namespace() -> None:
    """Remove an earlier session's deployment (pods first, without their grace periods)."""
    if not kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        return
    kubectl("-n", NAMESPACE, "delete", "pods", "--all", "--grace-period=0", "--force",
            "--wait=false", check=False)  # fmt: skip
    kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=180s", timeout=200)


def _secret_doc(name: str, values: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
        }
    )


def _s3_server() -> Any:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=NODE_IP, port=S3_PORT, verbose=False)
    server.start()
    return server


def _s3_client() -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://{NODE_IP}:{S3_PORT}",
        region_name="us-east-1",
        aws_access_key_id="pods-test",
        aws_secret_access_key="pods-test-secret",
    )


def deploy_product(store_clusters: StoreClusters) -> tuple[Deployed, Callable[[], None]]:
    """Install the control plane on the one-node cluster; returns it and its teardown."""
    assert IMAGE_ARCHIVE.exists(), f"{IMAGE_ARCHIVE} is missing: run make image"
    subprocess.run(
        [str(ROOT / ".ci" / "kube-node.sh"), "import-image", str(IMAGE_ARCHIVE)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    _reset_namespace()

    db_password = secrets.token_urlsafe(24)
    host_dsn = _fresh_config_store(db_password)
    values = {
        "django-secret-key": secrets.token_urlsafe(48),
        "config-store-dsn": (
            f"postgresql://{DATABASE}:{db_password}@{NODE_IP}:5432/{DATABASE}?sslmode=require"
        ),
        "internal-secret": "int-" + secrets.token_hex(20),
        "runner-secret": "run-" + secrets.token_hex(20),
        "dataplane-secret": "dat-" + secrets.token_hex(20),
        "broker-url": f"redis://{NODE_IP}:6379/{BROKER_DB}",
        "aws-access-key-id": "pods-test",
        "aws-secret-access-key": "pods-test-secret",
    }
    subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-n", str(BROKER_DB), "FLUSHDB"],
        check=True, capture_output=True,
    )  # fmt: skip
    s3_server = _s3_server()

    def teardown() -> None:
        kubectl("-n", NAMESPACE, "delete", "pods", "--all", "--grace-period=0", "--force",
                "--wait=false", check=False)  # fmt: skip
        s3_server.stop()

    try:
        s3 = _s3_client()
        s3.create_bucket(Bucket=BUCKET)
        kubectl("apply", "-f", str(ROOT / "k8s" / "namespace.yaml"))
        kubectl("apply", "-f", "-", input=_secret_doc("duckgres-admin", values))
        kubectl(
            "apply",
            "-f",
            "-",
            input=_secret_doc(
                STORE_SECRET, {"provisioner": store_clusters.source.provisioner_password}
            ),
        )
        kubectl("apply", "-f", "-", input=_secret_doc(TENANT_SECRET, {"placeholder": "x"}))
        kubectl("apply", "-k", str(ROOT / "tests" / "pods" / "overlay"))
        kubectl("-n", NAMESPACE, "wait", "--for=condition=complete", "--timeout=300s",
                "job/duckgres-admin-migrate", timeout=320)  # fmt: skip
        for name in DEPLOYMENTS:
            kubectl("-n", NAMESPACE, "rollout", "status", f"deploy/{name}", "--timeout=300s",
                    timeout=320)  # fmt: skip
        service_ip = kubectl(
            "-n", NAMESPACE, "get", "svc", "duckgres-admin-api", "-o",
            "jsonpath={.spec.clusterIP}",
        ).strip()  # fmt: skip
        api = ApiClient(
            f"http://{service_ip}:8080",
            {"X-Duckgres-Internal-Secret": values["internal-secret"], "Host": "duckgres-admin-api"},
        )
        wait_until(lambda: api.get("warehouses").status == 200, "the API through its Service", 60)
        pod_stores = {
            name: StoreCluster(cluster.name, NODE_IP, cluster.port)
            for name, cluster in (
                ("source", store_clusters.source),
                ("target", store_clusters.target),
            )
        }
        for name, cluster in pod_stores.items():
            body = {
                "name": f"pods-{name}",
                "kind": "cnpg",
                "host": cluster.host,
                "port": cluster.port,
                "sslmode": "require",
                "provisioner_user": cluster.provisioner_user,
                "provisioner_password_ref": f"k8s:{NAMESPACE}/{STORE_SECRET}#provisioner",
            }
            resp = api.post("metadata-stores", body)
            assert resp.status == 201, (resp.status, resp.raw[:500])
    except BaseException:
        teardown()
        raise
    return Deployed(api, service_ip, host_dsn, values, s3, store_clusters, pod_stores), teardown


@pytest.fixture(scope="session")
def deployed(store_clusters: StoreClusters) -> Iterator[Deployed]:
    reason = pods_unavailable()
    if reason:
        pytest.skip(f"[pods] {reason}")
    product, teardown = deploy_product(store_clusters)
    try:
        yield product
    finally:
        teardown()
