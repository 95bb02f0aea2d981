"""The trino worker's Kubernetes identity, rights and network boundaries (spec trino-pools §4.3,
§4.12, §4.13, §7): k8s/base/rbac.yaml (its ServiceAccount and ClusterRoles), the per-cell
bindings in k8s/trino-rbac/, k8s/base/networkpolicy.yaml and k8s/base/trino-worker.yaml.

The ci kube-apiserver authorizes everything (``AlwaysAllow``), so RBAC cannot be enforced there.
Instead the product's own Trino calls run against the real apiserver with every request
recorded, and each request is checked against the shipped rules by a small evaluator of the
RBAC rule semantics (group, resource/subresource, verb, resourceNames) — so a new Kubernetes
call in the operator without a matching grant fails here, and so does a grant nothing uses
unless it is one of the few listed as reserved.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from duckgres_admin.lib import k8s
from tests.fixtures.manifests import DOCS, K8S_DIR, env_of, matches, one
from tests.trino.blueprints import valid_blueprint
from trino_pools import config, tasks
from trino_pools.blueprint import MANAGED_BY, MANAGED_BY_LABEL

TEMPLATES_DIR = K8S_DIR / "trino-rbac"
REPO = K8S_DIR.parent
TRINO_SA = {"kind": "ServiceAccount", "name": "duckgres-admin-trino", "namespace": "duckgres"}
CELL_ROLE = "duckgres-admin-trino-cell"
NODE_ROLE = "duckgres-admin-trino-node-replacement"

Grant = tuple[str, str, str, str]  # (api group, resource[/subresource], verb, resource name or *)

# Exactly what the operator needs in a cell namespace (the brief of spec §4.12/§4.13).
CELL_GRANTS: set[Grant] = {
    *{
        ("", r, v, "*")
        for r in ("services", "configmaps")
        for v in ("create", "get", "list", "delete")
    },
    *{("apps", "deployments", v, "*") for v in ("create", "get", "list", "delete")},
    ("apps", "deployments/status", "get", "*"),
    ("", "pods", "get", "*"),
    ("", "pods", "list", "*"),
    ("", "secrets", "get", "trino-observer"),
}
# Granted although the operator's calls do not issue them today: listing the instance objects
# by label (orphan and ownership sweeps), reading Deployment status through its subresource and
# reading one pod by name (pods are found by label now).
RESERVED_CELL_GRANTS: set[Grant] = {
    ("", "pods", "get", "*"),
    ("", "services", "list", "*"),
    ("", "configmaps", "list", "*"),
    ("apps", "deployments", "list", "*"),
    ("apps", "deployments/status", "get", "*"),
}
NODE_GRANTS: set[Grant] = {
    ("", "nodes", "get", "*"),
    ("", "nodes", "list", "*"),
    ("", "nodes", "patch", "*"),
    ("karpenter.sh", "nodeclaims", "get", "*"),
    ("karpenter.sh", "nodeclaims", "list", "*"),
}
# The duckgres_admin.lib.k8s functions the trino_pools package may call. Each one that talks to
# the API is exercised by test_every_kubernetes_call_of_the_operator_is_granted_in_the_cell; a
# new one must be added there (and its grant reviewed) before this test passes again.
K8S_FUNCTIONS_USED_BY_TRINO = {
    "KubeError",  # no call
    "pod_template_problems",  # client-side only, no call
    "read_config_map",
    "read_secret_key",
    "apply_instance_object",
    "read_object",
    "delete_object",
    "list_pods",
}


@pytest.fixture
def cell_kube(kube_api: Any, settings: Any) -> Any:
    """``kube_api`` with the product's Kubernetes seam aimed at it (its namespace is a cell)."""
    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    k8s.api_client.cache_clear()
    try:
        yield kube_api
    finally:
        k8s.api_client.cache_clear()


def load_templates() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(TEMPLATES_DIR.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


TEMPLATES = load_templates()


def template(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in TEMPLATES if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    out: set[Grant] = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        out.add((group, resource, verb, name))
    return out


def allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str) -> bool:
    """RBAC rule semantics: every field must match; resourceNames, when present, must name it."""
    for rule in rules:
        if group not in rule["apiGroups"] or resource not in rule["resources"]:
            continue
        if verb not in rule["verbs"]:
            continue
        names = rule.get("resourceNames")
        if names and name not in names:
            continue
        return True
    return False


# --- the rules, parsed ---------------------------------------------------------------------


def test_the_cell_role_grants_exactly_the_operators_verbs():
    role = one("ClusterRole", CELL_ROLE)
    assert grants(role["rules"]) == CELL_GRANTS
    assert not any("*" in v for rule in role["rules"] for v in rule.values()), "no wildcards"
    assert "aggregationRule" not in role
    # The evaluator agrees: only trino-observer among Secrets, and nothing that mutates in place.
    rules = role["rules"]
    assert allowed(rules, "", "secrets", "get", "trino-observer")
    assert not allowed(rules, "", "secrets", "get", "duckgres-admin")
    assert not allowed(rules, "", "secrets", "list", "")
    for verb in ("update", "patch", "watch", "deletecollection", "escalate", "bind"):
        for group, resource in (("", "services"), ("", "configmaps"), ("apps", "deployments")):
            assert not allowed(rules, group, resource, verb, "x"), (resource, verb)
    for verb in ("create", "delete", "patch", "update"):
        assert not allowed(rules, "", "pods", verb, "x"), verb
    assert not allowed(rules, "", "pods/exec", "create", "x")


def test_the_node_replacement_role_reads_nodes_and_nodeclaims_and_only_patches_nodes():
    role = one("ClusterRole", NODE_ROLE)
    assert grants(role["rules"]) == NODE_GRANTS
    assert not allowed(role["rules"], "", "nodes", "delete", "n")
    assert not allowed(role["rules"], "", "pods/eviction", "create", "p")


def test_the_trino_worker_runs_as_its_own_account_with_no_rights_in_its_own_namespace():
    one("ServiceAccount", "duckgres-admin-trino")
    deployment = one("Deployment", "duckgres-admin-trino-worker")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == TRINO_SA["name"]
    # Nothing shipped in k8s/*.yaml binds the trino account: its rights exist only where a
    # template from k8s/trino-rbac/ was applied. The ClusterRoles are never bound cluster-wide
    # by the main manifests.
    for doc in DOCS:
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert TRINO_SA not in doc["subjects"], doc["metadata"]["name"]
    # The one ClusterRoleBinding shipped is the API's TokenReview grant (safeguard reshard-79).
    assert [d["roleRef"]["name"] for d in DOCS if d["kind"] == "ClusterRoleBinding"] == [
        "duckgres-admin-api-tokenreview"
    ]


def test_the_cell_template_binds_the_cell_role_in_the_namespace_it_is_applied_to():
    binding = template("RoleBinding", "duckgres-admin-trino")
    assert "namespace" not in binding["metadata"], "a template: kubectl -n <cell> apply"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": CELL_ROLE,
    }
    assert binding["subjects"] == [TRINO_SA]


def test_the_node_replacement_binding_is_a_separate_template():
    binding = template("ClusterRoleBinding", "duckgres-admin-trino-node-replacement")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": NODE_ROLE,
    }
    assert binding["subjects"] == [TRINO_SA]
    # The cell role is never bound cluster-wide, by the manifests or the templates.
    for doc in [*DOCS, *TEMPLATES]:
        if doc["kind"] == "ClusterRoleBinding":
            assert doc["roleRef"]["name"] != CELL_ROLE


def test_the_pool_config_template_reads_named_configmaps_only():
    role = template("Role", "duckgres-admin-trino-pool-config")
    assert "namespace" not in role["metadata"]
    [rule] = role["rules"]
    assert rule["apiGroups"] == [""]
    assert rule["resources"] == ["configmaps"]
    assert rule["verbs"] == ["get"]
    assert rule["resourceNames"], "only the pools' own ConfigMaps"
    binding = template("RoleBinding", "duckgres-admin-trino-pool-config")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "duckgres-admin-trino-pool-config",
    }
    assert binding["subjects"] == [TRINO_SA]
    assert {d["kind"] for d in TEMPLATES} == {"RoleBinding", "Role", "ClusterRoleBinding"}


# --- the process ---------------------------------------------------------------------------


def test_the_trino_worker_command_and_identity(monkeypatch):
    deployment = one("Deployment", "duckgres-admin-trino-worker")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:4] == ["celery", "-A", "duckgres_admin", "worker"]
    assert command[command.index("-Q") + 1] == tasks.TRINO_QUEUE
    assert "--pool=solo" in command
    assert "--concurrency=1" in command
    assert deployment["spec"]["replicas"] == 1  # two are safe (the lease); see docs/kubernetes.md
    # No probes, as the other Celery workers (a solo worker answers a ping between tasks only).
    assert "readinessProbe" not in container
    assert "livenessProbe" not in container
    env = env_of(deployment)
    assert env["POD_NAME"] == {
        "name": "POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    # The owner identity the lease and every pool's authority_owner carry is built from it.
    from trino_pools import lease

    monkeypatch.setenv("POD_NAME", "duckgres-admin-trino-worker-7c9d-x2x4q")
    monkeypatch.setattr(lease, "_identity", None)
    identity = lease.owner_identity()
    assert re.fullmatch(r"duckgres-admin-trino-worker-7c9d-x2x4q\.[0-9a-f]{16}", identity)


def test_the_trino_worker_network_policy():
    policy = one("NetworkPolicy", "duckgres-admin-trino-worker-boundaries")["spec"]
    trino = one("Deployment", "duckgres-admin-trino-worker")
    assert matches(policy["podSelector"], trino["spec"]["template"]["metadata"]["labels"])
    for deployment in [d for d in DOCS if d["kind"] == "Deployment" and d is not trino]:
        assert not matches(
            policy["podSelector"], deployment["spec"]["template"]["metadata"]["labels"]
        )
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    # Ingress: the metrics scrape only, on the exporter's port.
    [ingress] = policy["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": config.DEFAULT_METRICS_PORT}]
    [port] = trino["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert port["containerPort"] == config.DEFAULT_METRICS_PORT
    # Egress: DNS, PostgreSQL (config + catalog store), Redis, HTTPS (Gateway, API Service),
    # the API servers' 6443, and the instance pods on the coordinator port.
    ports = {(p["protocol"], p["port"]) for rule in policy["egress"] for p in rule["ports"]}
    assert ports == {
        ("UDP", 53),
        ("TCP", 53),
        ("TCP", 5432),
        ("TCP", 6379),
        ("TCP", 443),
        ("TCP", 6443),
        ("TCP", 8080),
    }
    [coordinators] = [r for r in policy["egress"] if "to" in r]
    assert coordinators["ports"] == [{"protocol": "TCP", "port": 8080}]
    [peer] = coordinators["to"]
    assert peer["namespaceSelector"] == {}  # the cell namespaces are not known statically
    # The peer selects exactly the pods the operator creates (its managed-by label).
    assert peer["podSelector"] == {"matchLabels": {MANAGED_BY_LABEL: MANAGED_BY}}
    from trino_pools import instantiate
    from trino_pools.blueprint import parse_blueprint
    from trino_pools.registry import Cell, PoolSpec

    docs = _instance_docs(instantiate, parse_blueprint, Cell, PoolSpec, "trino-pool-a")
    for doc in docs:
        if doc["kind"] == "Deployment":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert matches(peer["podSelector"], labels)
    coordinator = next(d for d in docs if d["metadata"]["name"].endswith("-coordinator"))
    container_ports = {
        p.get("containerPort")
        for c in coordinator["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
        if p.get("name") == "http"
    }
    assert container_ports == {8080}  # the shipped example blueprint's coordinator port


def _instance_docs(
    instantiate: Any, parse_blueprint: Any, cell_cls: Any, spec_cls: Any, namespace: str
) -> list[dict[str, Any]]:
    snapshot = _instance_snapshot(instantiate, parse_blueprint, cell_cls, spec_cls, namespace)
    docs: list[dict[str, Any]] = instantiate.instance_objects(
        "cell-5e6f7a8b", "pool-a", "rg-a", snapshot, 3
    )
    return docs


def _instance_snapshot(
    instantiate: Any, parse_blueprint: Any, cell_cls: Any, spec_cls: Any, namespace: str
) -> dict[str, Any]:
    text = json.dumps(valid_blueprint(namespace=namespace))
    blueprint = parse_blueprint(text, source="test", cell_namespace=namespace)
    cell = cell_cls(
        id="pool-a",
        namespace=namespace,
        routing_group="rg-a",
        client_url="https://pool-a.trino.example.com",
        host="pool-a.trino.example.com",
        port=443,
        pool=spec_cls(3, 2, 1, 1, "/etc/duckgres/blueprints/pool-a.json", 8080, "prod", True),
    )
    snapshot: dict[str, Any] = instantiate.snapshot_for(blueprint, cell)
    return snapshot


# --- the rules against what the operator really calls ----------------------------------------


def test_the_trino_package_calls_only_kubernetes_functions_whose_rights_are_checked():
    used: set[str] = set()
    for path in sorted((REPO / "trino_pools").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "duckgres_admin.lib.k8s":
                used.update(alias.name for alias in node.names)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "k8s"
            ):
                used.add(node.attr)
    assert used <= K8S_FUNCTIONS_USED_BY_TRINO, sorted(used - K8S_FUNCTIONS_USED_BY_TRINO)


_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _request_attributes(method: str, url: str) -> tuple[str, str, str, str, str]:
    """(namespace, group, resource[/sub], verb, name) of one request, as an authorizer sees it."""
    parts = urlsplit(url)
    match = _PATH.match(parts.path)
    assert match, url
    name = match["name"] or ""
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    if method == "GET":
        query = parse_qs(parts.query)
        verb = "watch" if query.get("watch") in (["true"], ["1"]) else ("get" if name else "list")
    else:
        verb = _VERBS[method]
    return match["namespace"] or "", match["group"] or "", resource, verb, name


@pytest.mark.kube
def test_every_kubernetes_call_of_the_operator_is_granted_in_the_cell(cell_kube):
    """One instance's whole Kubernetes life through the product's seam, every request checked.

    Pool ConfigMap read, observer Secret read, create (and the replayed create that adopts),
    readiness from the Deployments, the coordinator pod lookup, and the UID-preconditioned
    delete until everything is verifiably gone.
    """
    from kubernetes import client

    from duckgres_admin.models.trino import TrinoPoolInstance
    from trino_pools import instantiate, probes
    from trino_pools.blueprint import parse_blueprint
    from trino_pools.operator.instances import evidence
    from trino_pools.registry import Cell, PoolSpec

    namespace = cell_kube.namespace
    core = cell_kube.core
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="trino-pool-config-pool-a"),
            data={"cells.json": "{}"},
        ),
    )
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=probes.OBSERVER_SECRET),
            string_data={"username": "observer", "password": secrets.token_hex(20)},
        ),
    )

    recorded: list[tuple[str, str, Any]] = []
    api = k8s.api_client()
    real_call = api.call_api

    def recording(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        # call_api(method, url, header_params=None, body=None, post_params=None, …)
        body = args[1] if len(args) > 1 else kwargs.get("body")
        recorded.append((method, url, body))
        return real_call(method, url, *args, **kwargs)

    api.call_api = recording  # type: ignore[method-assign]
    try:
        k8s.read_config_map(namespace, "trino-pool-config-pool-a")
        assert probes.observer_credential(namespace)[0] == "observer"
        docs = _instance_docs(instantiate, parse_blueprint, Cell, PoolSpec, namespace)
        inventory = instantiate.create_objects(namespace, docs)
        assert instantiate.create_objects(namespace, copy.deepcopy(docs)) == inventory  # replay
        assert instantiate.workers_ready(namespace, "cell-5e6f7a8b") == (False, 0, 2)
        # The operator's own coordinator-pod rule (its pods list, by the identity labels).
        row = TrinoPoolInstance(
            instance_id="cell-5e6f7a8b",
            blueprint_snapshot=_instance_snapshot(instantiate, parse_blueprint, Cell, PoolSpec,
                                                  namespace),
            coordinator_pod_uid="",
        )  # fmt: skip
        assert evidence.coordinator_pod(row) is None
        for _ in range(5):
            if instantiate.delete_objects(namespace, inventory, instance_id="cell-5e6f7a8b"):
                break
        else:
            pytest.fail("the instance objects were not deleted")
    finally:
        del api.call_api

    assert recorded
    rules = one("ClusterRole", CELL_ROLE)["rules"]
    used: set[Grant] = set()
    deletes = 0
    for method, url, body in recorded:
        ns, group, resource, verb, name = _request_attributes(method, url)
        assert ns == namespace, f"{method} {url}: outside the cell namespace"
        assert allowed(rules, group, resource, verb, name), f"not granted: {verb} {resource} {name}"
        used.add((group, resource, verb, "trino-observer" if resource == "secrets" else "*"))
        if verb == "delete":
            deletes += 1
            assert body["preconditions"]["uid"], f"{url}: a delete without a UID precondition"
    assert deletes == 5
    granted = grants(rules)
    assert used <= granted
    assert granted - used <= RESERVED_CELL_GRANTS, sorted(granted - used - RESERVED_CELL_GRANTS)


# --- the API server and the schema accept the objects --------------------------------------


@pytest.mark.kube
def test_the_trino_rbac_objects_pass_a_server_side_dry_run(kube_api, settings):
    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    k8s.api_client.cache_clear()
    try:
        shipped = [
            one("ServiceAccount", "duckgres-admin-trino"),
            one("ClusterRole", CELL_ROLE),
            one("ClusterRole", NODE_ROLE),
            one("NetworkPolicy", "duckgres-admin-trino-worker-boundaries"),
            one("Deployment", "duckgres-admin-trino-worker"),
        ]
        for doc in [*shipped, *TEMPLATES]:
            doc = copy.deepcopy(doc)
            if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
                doc["metadata"]["namespace"] = kube_api.namespace
            k8s.server_dry_run(doc, kube_api.namespace)
        # Nothing was persisted, and the dry run really validates RBAC objects.
        rbac = client_rbac(kube_api)
        assert rbac.list_namespaced_role_binding(kube_api.namespace).items == []
        bad = copy.deepcopy(template("RoleBinding", "duckgres-admin-trino"))
        bad["metadata"]["namespace"] = kube_api.namespace
        bad["roleRef"]["kind"] = "Deployment"
        with pytest.raises(k8s.KubeError):
            k8s.server_dry_run(bad, kube_api.namespace)
    finally:
        k8s.api_client.cache_clear()


def client_rbac(kube_api: Any) -> Any:
    from kubernetes import client

    return client.RbacAuthorizationV1Api(kube_api.api_client)


def test_the_trino_rbac_templates_pass_strict_schema_validation():
    tool = shutil.which("kubernetes-validate") or str(
        Path(sys.executable).with_name("kubernetes-validate")
    )
    assert Path(tool).exists(), "kubernetes-validate is missing: run make install"
    paths = [str(p) for p in sorted(TEMPLATES_DIR.glob("*.yaml"))]
    assert len(paths) == 3
    result = subprocess.run(
        [tool, "--strict", "-k", "1.29", *paths], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
