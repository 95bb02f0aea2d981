"""The product deployed on the real one-node cluster (marker ``pods``; docs/testing.md).

Once per session ``deployed`` installs the control plane exactly as an operator does — the
namespace, the Secret, ``kubectl apply -k`` of the test overlay over ``k8s/`` — after importing
the image built by ``make image`` into the node's containerd, then waits for the migration Job
and every Deployment. What stays on the host, reached by the pods at the bridge address
10.244.0.1: the config store (a fresh database ``duckgres_pods`` with a password login, so no
pytest-django database is shared with the pods), Redis (db 4), the two store clusters
(5433/5434), an S3 server (moto, 10.244.0.1:19000) and, for the one Trino pool wired in the
overlay (tests/pods/overlay/trino.yaml), its catalog store (a fresh database
``duckgres_pods_trino`` with its own password login) and its Gateway (the double of
tests/trino/gateway_double.py over HTTPS on 10.244.0.1:443, certificate from the test CA). The
cell namespace ``duckgres-trino-cell`` is recreated per session with
k8s/trino-rbac/cell-rolebinding.yaml applied in it, as docs/kubernetes.md says. The tests drive
the API only through its Service and read what they check from the cluster, the config store,
the catalog store, the Gateway double and S3 directly.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fixtures.api_client import ApiClient
from tests.fixtures.availability import pods_unavailable
from tests.fixtures.stores import StoreCluster, StoreClusters
from tests.trino.gateway_double import GatewayDouble
from tests.trino.gateway_double import _Handler as _GatewayHandler

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = Path(os.environ.get("NODE_DIR", "/var/tmp/duckgres-ci/kube-node"))
KUBECONFIG = NODE_DIR / "admin.kubeconfig"
NODE_IP = "10.244.0.1"
NAMESPACE = "duckgres"
RUNNERS_NAMESPACE = "duckgres-runners"  # runner pods and their Secrets (k8s/runners/)
S3_PORT = 19000
BUCKET = "duckgres-pods"
DATABASE = "duckgres_pods"
BROKER_DB = 4
IMAGE_ARCHIVE = ROOT / "var" / "image" / "duckgres-admin-0.1.0.oci.tar"
STORE_SECRET = "duckgres-store-pods"
TENANT_SECRET = "duckgres-tenant-pods"
# The Trino pool of tests/pods/overlay/trino.yaml (keep the names in step with that file).
TRINO_CELL_NAMESPACE = "duckgres-trino-cell"
TRINO_POOL_ID = "registered:pods-pool"
TRINO_CATALOG_DATABASE = "duckgres_pods_trino"
TRINO_CATALOG_SCHEMA = "trino_catalogs"
TRINO_SECRET = "duckgres-admin-trino"
GATEWAY_PORT = 443
GATEWAY_SERVER_NAME = "gateway.duckgres-pods.test"
GATEWAY_CA_CONFIGMAP = "duckgres-pods-gateway-ca"
TEST_CA_DIR = Path(os.environ.get("CI_STATE_DIR", "/var/tmp/duckgres-ci")) / "ca"
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


def scrape(pod: str, container: str, port: int) -> str:
    """A pod's own Prometheus exporter, read from inside the pod ("" when it does not answer)."""
    code = (
        "import urllib.request; print(urllib.request.urlopen("
        f"'http://127.0.0.1:{port}/metrics', timeout=5).read().decode())"
    )
    return kubectl("-n", NAMESPACE, "exec", pod, "-c", container, "--", "python", "-c", code,
                   timeout=60, check=False)  # fmt: skip


def wait_rollouts(names: tuple[str, ...]) -> None:
    """Every named Deployment rolled out (``kubectl rollout status``, 300 s each)."""
    for name in names:
        kubectl("-n", NAMESPACE, "rollout", "status", f"deploy/{name}", "--timeout=300s",
                timeout=320)  # fmt: skip


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
    gateway: GatewayDouble | None = None
    trino_catalog_dsn: str = ""  # host-side DSN of duckgres_pods_trino (as postgres)
    trino_secrets: dict[str, str] = field(default_factory=dict)

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


def _admin_execute(statements: list[sql.Composed | sql.SQL], dbname: str = "postgres") -> None:
    """DDL as ``postgres`` (trusted on loopback) from this process: passwords stay off argv."""
    with psycopg.connect(
        host="127.0.0.1", user="postgres", dbname=dbname, autocommit=True, connect_timeout=10
    ) as conn:
        for statement in statements:
            conn.execute(statement)


def _fresh_database(name: str, password: str, *, owner: bool) -> None:
    """Drop and recreate database ``name`` with a login role ``name`` using ``password``."""
    ident = sql.Identifier(name)
    _admin_execute([sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident)])
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres") as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]).fetchone()
    verb = sql.SQL("ALTER" if exists else "CREATE")
    # The config store's login mints each runner's own login (docs/configuration.md).
    attributes = sql.SQL(" CREATEROLE" if owner else "")
    statements: list[sql.Composed | sql.SQL] = [
        sql.SQL("{} ROLE {} LOGIN{} PASSWORD {}").format(
            verb, ident, attributes, sql.Literal(password)
        )
    ]
    if owner:
        statements.append(sql.SQL("CREATE DATABASE {} OWNER {}").format(ident, ident))
    else:
        statements.append(sql.SQL("CREATE DATABASE {}").format(ident))
    _admin_execute(statements)


def _fresh_config_store(password: str) -> str:
    """A fresh, empty config-store database for the pods, owned by a password login."""
    _fresh_database(DATABASE, password, owner=True)
    return f"postgresql://postgres@127.0.0.1:5432/{DATABASE}?sslmode=require"


def _fresh_trino_catalog_store(password: str) -> str:
    """The pool's catalog store: a fresh database whose publisher login (its own password)
    may use and create in the writer's schema only (docs/trino-catalog-store.sql); the trino
    worker creates the tables at its start (DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP=true)."""
    name = TRINO_CATALOG_DATABASE
    _fresh_database(name, password, owner=False)
    _admin_execute(
        [
            sql.SQL("REVOKE ALL ON SCHEMA public FROM PUBLIC"),
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(TRINO_CATALOG_SCHEMA), sql.Identifier(name)
            ),
        ],
        dbname=name,
    )
    return f"postgresql://postgres@127.0.0.1:5432/{name}?sslmode=require"


def reset_namespaces() -> None:
    """Remove an earlier session's deployment (pods first, without their grace periods)."""
    for namespace in (NAMESPACE, RUNNERS_NAMESPACE, TRINO_CELL_NAMESPACE):
        if not kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").strip():
            continue
        kubectl("-n", namespace, "delete", "pods", "--all", "--grace-period=0", "--force",
                "--wait=false", check=False)  # fmt: skip
        kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", timeout=200)


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


def _configmap_doc(name: str, values: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "data": values,
        }
    )


def _gateway_tls(workdir: Path) -> ssl.SSLContext:
    """A server certificate for GATEWAY_SERVER_NAME issued by the test CA (.ci/test-ca.sh)."""
    ca_pem, ca_key = TEST_CA_DIR / "ca.pem", TEST_CA_DIR / "ca.key"
    for path in (ca_pem, ca_key):
        assert path.is_file(), f"{path} is missing: the test CA comes from .ci/test-ca.sh"
    key, csr, cert, ext = (workdir / n for n in ("gw.key", "gw.csr", "gw.pem", "gw.ext"))
    ext.write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        f"subjectAltName = DNS:{GATEWAY_SERVER_NAME}\n"
    )
    for args in (
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", f"/CN={GATEWAY_SERVER_NAME}"],
        ["x509", "-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key),
         "-CAcreateserial", "-CAserial", str(workdir / "ca.srl"), "-out", str(cert),
         "-days", "2", "-sha256", "-extfile", str(ext)],
    ):  # fmt: skip
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


class HostGateway(GatewayDouble):
    """The Gateway double served on the pod bridge (the pods' 10.244.0.1:443), not loopback."""

    def start_on(self, host: str, port: int, tls: ssl.SSLContext) -> HostGateway:
        double = self

        class Handler(_GatewayHandler):
            gateway = double

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True

            def get_request(self) -> tuple[Any, Any]:
                conn, addr = super().get_request()
                # The handshake runs in the handler thread, not in the accept loop.
                return tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), addr

        self._tls = True
        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self


def _trino_cell_namespace() -> None:
    """The pool's cell namespace and the trino worker's grants there (docs/kubernetes.md
    "Trino worker RBAC", step 2: before the pool's operator is enabled)."""
    kubectl("create", "namespace", TRINO_CELL_NAMESPACE)
    kubectl("-n", TRINO_CELL_NAMESPACE, "apply", "-f",
            str(ROOT / "k8s" / "trino-rbac" / "cell-rolebinding.yaml"))  # fmt: skip


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


OVERLAY = ROOT / "tests" / "pods" / "overlay"


def deploy_product(
    store_clusters: StoreClusters, *, overlay: Path = OVERLAY, archive: Path = IMAGE_ARCHIVE
) -> tuple[Deployed, Callable[[], None]]:
    """Install the control plane on the one-node cluster (``overlay`` with the image of
    ``archive``: this tree's by default, an earlier release's for the upgrade test); returns it
    and its teardown."""
    assert archive.exists(), f"{archive} is missing: run make image (or make previous-image)"
    subprocess.run(
        [str(ROOT / ".ci" / "kube-node.sh"), "import-image", str(archive)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    reset_namespaces()

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
    # Trino: the pool's catalog store and the file secrets of Secret duckgres-admin-trino.
    catalog_password = secrets.token_urlsafe(24)
    catalog_host_dsn = _fresh_trino_catalog_store(catalog_password)
    trino_values = {
        "catalog-dsn": (
            f"postgresql://{TRINO_CATALOG_DATABASE}:{catalog_password}@{NODE_IP}:5432/"
            f"{TRINO_CATALOG_DATABASE}?sslmode=require"
        ),
        "rollout-token": "gw-" + secrets.token_hex(24),
        "service-auth-secret": "svc-" + secrets.token_hex(24),
    }
    subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-n", str(BROKER_DB), "FLUSHDB"],
        check=True, capture_output=True,
    )  # fmt: skip
    s3_server = _s3_server()
    tls_dir = Path(tempfile.mkdtemp(prefix="duckgres-pods-gateway-"))
    try:
        gateway = HostGateway(token=trino_values["rollout-token"]).start_on(
            NODE_IP, GATEWAY_PORT, _gateway_tls(tls_dir)
        )
    except BaseException:
        s3_server.stop()
        raise
    finally:
        shutil.rmtree(tls_dir, ignore_errors=True)

    def teardown() -> None:
        for namespace in (NAMESPACE, RUNNERS_NAMESPACE):
            kubectl("-n", namespace, "delete", "pods", "--all", "--grace-period=0", "--force",
                    "--wait=false", check=False)  # fmt: skip
        s3_server.stop()
        gateway.stop()

    try:
        s3 = _s3_client()
        s3.create_bucket(Bucket=BUCKET)
        _trino_cell_namespace()
        kubectl("apply", "-f", str(ROOT / "k8s" / "base" / "namespace.yaml"))
        kubectl("apply", "-f", "-", input=_secret_doc("duckgres-admin", values))
        kubectl("apply", "-f", "-", input=_secret_doc(TRINO_SECRET, trino_values))
        kubectl(
            "apply",
            "-f",
            "-",
            input=_configmap_doc(
                GATEWAY_CA_CONFIGMAP, {"ca.pem": (TEST_CA_DIR / "ca.pem").read_text()}
            ),
        )
        kubectl(
            "apply",
            "-f",
            "-",
            input=_secret_doc(
                STORE_SECRET, {"provisioner": store_clusters.source.provisioner_password}
            ),
        )
        kubectl("apply", "-f", "-", input=_secret_doc(TENANT_SECRET, {"placeholder": "x"}))
        kubectl("apply", "-k", str(overlay))
        kubectl("-n", NAMESPACE, "wait", "--for=condition=complete", "--timeout=300s",
                "job/duckgres-admin-migrate", timeout=320)  # fmt: skip
        wait_rollouts(DEPLOYMENTS)
        service_ip = kubectl(
            "-n", NAMESPACE, "get", "svc", "duckgres-admin-api", "-o",
            "jsonpath={.spec.clusterIP}",
        ).strip()  # fmt: skip
        api = ApiClient(
            f"http://{service_ip}:8080",
            {"X-Duckgres-Internal-Secret": values["internal-secret"], "Host": "duckgres-admin-api"},
        )
        wait_until(lambda: api.answers("warehouses"), "the API through its Service", 60)
        pod_stores = {
            # The test CA's certificates name 127.0.0.1, not the node IP: require, with the
            # store's explicit opt-in below (safeguard reshard-122).
            name: StoreCluster(cluster.name, NODE_IP, cluster.port, sslmode="require")
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
                "tls_policy": "allow-weaker",
                "tls_policy_reason": "test clusters: the certificates name 127.0.0.1, not the node",
                "provisioner_user": cluster.provisioner_user,
                "provisioner_password_ref": f"k8s:{NAMESPACE}/{STORE_SECRET}#provisioner",
            }
            resp = api.post("metadata-stores", body)
            assert resp.status == 201, (resp.status, resp.raw[:500])
    except BaseException:
        teardown()
        raise
    product = Deployed(
        api,
        service_ip,
        host_dsn,
        values,
        s3,
        store_clusters,
        pod_stores,
        gateway=gateway,
        trino_catalog_dsn=catalog_host_dsn,
        trino_secrets=trino_values,
    )
    return product, teardown


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
