"""The control plane as shipped, running on the real one-node cluster (marker ``pods``)."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from tests.fixtures.pod_security import read_only_root, restricted_violations
from tests.pods.conftest import DEPLOYMENTS, NAMESPACE, Deployed, kubectl, kubectl_json

pytestmark = [pytest.mark.pods, pytest.mark.timeout(900)]


def _get(deployed: Deployed, path: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(
        f"http://{deployed.service_ip}:8080{path}", headers={"Host": "duckgres-admin-api"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


@pytest.mark.safeguard("reshard-62")
def test_every_process_runs_from_the_shipped_manifests(deployed: Deployed) -> None:
    job = kubectl_json("-n", NAMESPACE, "get", "job", "duckgres-admin-migrate")
    assert job["status"].get("succeeded") == 1
    for name in DEPLOYMENTS:
        dep: dict[str, Any] = kubectl_json("-n", NAMESPACE, "get", "deploy", name)
        want = dep["spec"]["replicas"]
        assert dep["status"].get("availableReplicas") == want, (name, dep["status"])
    # Every pod ran its wait-for-migrations init container to completion, as uid 10001.
    for pod in deployed.pods("app=duckgres-admin"):
        if pod["metadata"]["labels"].get("component") == "migrate":
            continue
        [init] = pod["status"]["initContainerStatuses"]
        assert init["state"]["terminated"]["exitCode"] == 0, pod["metadata"]["name"]
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    # Every pod the cluster really runs passes the restricted Pod Security level, read-only root.
    for pod in kubectl_json("-n", NAMESPACE, "get", "pods")["items"]:
        name = pod["metadata"]["name"]
        assert restricted_violations(pod["spec"], name) == []
        assert read_only_root(pod["spec"]) == [], name
    # The schema the Job migrated is complete.
    assert deployed.one("SELECT count(*) FROM django_migrations") > 20


def test_the_admin_static_files_and_readyz_answer_through_the_service(deployed: Deployed) -> None:
    status, _type, body = _get(deployed, "/readyz")
    assert status == 200, body[:300]
    status, content_type, body = _get(deployed, "/static/admin/css/base.css")
    assert status == 200
    assert content_type.startswith("text/css")
    assert b"body" in body


# (identity, verb, resource, allowed) on the real API server's RBAC authorizer, impersonated.
CAN_I = [
    ("duckgres-admin-api", "get", "secrets", True),
    ("duckgres-admin-api", "get", "pods", True),
    ("duckgres-admin-api", "create", "pods", False),
    ("duckgres-admin-api", "delete", "pods", False),
    ("duckgres-admin-launcher", "create", "pods", True),
    ("duckgres-admin-launcher", "delete", "pods", True),
    ("duckgres-admin-launcher", "get", "pods/log", True),
    ("duckgres-admin-launcher", "get", "secrets", True),
    ("duckgres-admin-launcher", "create", "deployments.apps", False),
    ("duckgres-admin-launcher", "list", "secrets", False),
    ("duckgres-admin-beat", "get", "secrets", False),
    ("duckgres-admin-beat", "get", "pods", False),
    ("duckgres-admin-runner", "get", "secrets", False),
    ("duckgres-admin-runner", "create", "pods", False),
    ("duckgres-admin-runner", "list", "pods", False),
    ("duckgres-admin-trino", "get", "secrets", False),
    ("duckgres-admin-trino", "create", "pods", False),
]


@pytest.mark.safeguard("reshard-78")
def test_each_component_runs_as_its_own_identity_with_only_its_rights(deployed: Deployed) -> None:
    expected = {
        "api": "duckgres-admin-api",
        "worker": "duckgres-admin-launcher",
        "control-worker": "duckgres-admin-launcher",
        "beat": "duckgres-admin-beat",
        "trino-worker": "duckgres-admin-trino",
    }
    seen = set()
    for pod in deployed.pods("app=duckgres-admin"):
        component = pod["metadata"]["labels"].get("component", "")
        if component not in expected:
            continue
        seen.add(component)
        spec = pod["spec"]
        assert spec["serviceAccountName"] == expected[component], pod["metadata"]["name"]
        tokens = [v for v in spec.get("volumes", []) if "projected" in v]
        if component == "beat":  # beat holds no API token at all
            assert tokens == [], spec.get("volumes")
    assert seen == set(expected)
    wrong = []
    for account, verb, resource, allowed in CAN_I:
        answer = kubectl(
            "auth", "can-i", verb, resource, "-n", NAMESPACE,
            f"--as=system:serviceaccount:{NAMESPACE}:{account}", check=False,
        ).strip()  # fmt: skip
        if (answer == "yes") != allowed:
            wrong.append((account, verb, resource, answer))
    assert wrong == []
