"""The quickstart overlay on the real one-node cluster (docs/kubernetes.md "Quickstart"), its
commands run verbatim: one ``kubectl apply -k k8s/overlays/quickstart`` brings the product, three
in-cluster PostgreSQL servers, Redis and an S3 server, draws its secrets inside the cluster, and
its demo Job reshards a 200-table DuckLake catalog from ``quickstart-a`` to ``quickstart-b`` in a
real runner pod. The file sorts first: it installs into the namespaces the rest of the suite's
deployment uses, and removes them when done."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.availability import pods_unavailable
from tests.fixtures.docs import documented_command
from tests.fixtures.pods import (
    KUBECONFIG,
    NAMESPACE,
    ROOT,
    RUNNERS_NAMESPACE,
    kubectl,
    kubectl_json,
    reset_namespaces,
    wait_until,
)

pytestmark = [pytest.mark.pods, pytest.mark.timeout(1500)]
ARCHIVES = ("duckgres-admin-0.1.0.oci.tar", "duckgres-quickstart-deps-0.1.0.oci.tar")
SECTION = "Quickstart"


def _documented(marker: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = documented_command(marker, section=SECTION)
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env=env,
    )  # fmt: skip


def _psql(pod: str, database: str, query: str) -> str:
    return kubectl("-n", NAMESPACE, "exec", pod, "--", "psql", "-h", "/tmp", "-U", "postgres",
                   "-d", database, "-tAc", query).strip()  # fmt: skip


@pytest.fixture(scope="module")
def quickstart() -> object:
    reason = pods_unavailable()
    if reason:
        pytest.skip(f"[pods] {reason}")
    for archive in ARCHIVES:
        path = ROOT / "var" / "image" / archive
        assert path.exists(), f"{path} is missing: run make image quickstart-image"
        subprocess.run([str(ROOT / ".ci" / "kube-node.sh"), "import-image", str(path)],
                       check=True, capture_output=True, timeout=300)  # fmt: skip
    reset_namespaces()
    yield None
    reset_namespaces()


@pytest.mark.safeguard("reshard-141")
def test_one_apply_brings_a_working_product_and_its_demo_reshard(quickstart, tmp_path: Path):
    applied = _documented("apply -k k8s/overlays/quickstart", timeout=300)
    assert applied.returncode == 0, applied.stderr
    waited = _documented("job/duckgres-quickstart-demo --timeout", timeout=960)
    demo_log = kubectl("-n", NAMESPACE, "logs", "job/duckgres-quickstart-demo", check=False)
    assert waited.returncode == 0, (waited.stderr, demo_log[-4000:])
    tail = _documented("logs job/duckgres-quickstart-demo")
    assert tail.returncode == 0, tail.stderr
    assert "operation 1 succeeded; warehouse quickstart is ready on quickstart-b" in tail.stdout

    # No secret value in any file: every Secret was drawn in the cluster by the bootstrap Job.
    made = kubectl_json("-n", NAMESPACE, "get", "secrets", "-l", "duckgres.io/quickstart=true")
    assert {s["metadata"]["name"] for s in made["items"]} == {
        "duckgres-admin", "duckgres-quickstart", "duckgres-store-quickstart",
        "duckgres-tenant-quickstart",
    }  # fmt: skip
    values = {
        k: base64.b64decode(v).decode()
        for s in made["items"] for k, v in s["data"].items()
    }  # fmt: skip
    rendered = subprocess.run(["kubectl", "kustomize", str(ROOT / "k8s/overlays/quickstart")],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    for key in ("postgres-password", "provisioner-password", "internal-secret", "runner-secret"):
        assert values[key] not in rendered
        assert values[key] not in demo_log

    # The catalog moved: on quickstart-b, owned by the tenant; the source copy is gone.
    built = re.search(r"tenant catalog quickstart on quickstart-a: (\d+) DuckLake tables", demo_log)
    assert built, demo_log[-4000:]
    assert built.group(1) == "200"
    tables = _psql("duckgres-quickstart-pg-2", "quickstart", "SELECT count(*) FROM ducklake_table")
    assert tables == built.group(1)
    left = _psql("duckgres-quickstart-pg-1", "postgres",
                 "SELECT count(*) FROM pg_database WHERE datname = 'quickstart'")  # fmt: skip
    assert left == "0"
    owner = _psql(
        "duckgres-quickstart-pg-2",
        "postgres",
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'quickstart'",
    )
    assert owner == "quickstart"
    # The pre-flip backup went to the in-cluster S3; the runner pod ran in the runner namespace
    # and the janitor reaped it.
    listed = kubectl("-n", NAMESPACE, "exec", "deploy/duckgres-admin-api", "--", "env",
                     "DUCKGRES_API_URL=http://localhost:8080", "duckgres", "--output", "json",
                     "reshard", "show", "1")  # fmt: skip
    op = json.loads(listed)
    assert op["state"] == "succeeded"
    assert str(op["backup_s3_uri"]).startswith("s3://duckgres-quickstart-data/"), demo_log[-6000:]
    wait_until(
        lambda: not kubectl("-n", RUNNERS_NAMESPACE, "get", "pods", "-o", "name").strip(),
        "the janitor reaping the runner pod", 180, poll=5,
    )  # fmt: skip

    # The documented look with the CLI, and the admin through the documented port-forward.
    cli = _documented("duckgres reshard list --org quickstart")
    assert cli.returncode == 0, cli.stderr
    assert "succeeded" in cli.stdout
    forward = documented_command("port-forward svc/duckgres-admin-api 8080", section=SECTION)
    proc = subprocess.Popen(["bash", "-c", f"exec {forward}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "KUBECONFIG": str(KUBECONFIG)})  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "Forwarding from" in proc.stdout.readline()
        with urllib.request.urlopen("http://localhost:8080/readyz", timeout=10) as ready:
            assert ready.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
