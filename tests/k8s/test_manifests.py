"""The shipped manifests (k8s/*.yaml): structure, the runner NetworkPolicy, RBAC, and a server-side
dry run of every document against the real kube-apiserver (marker ``kube``)."""

from __future__ import annotations

import copy
import secrets
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin import gunicorn_conf
from duckgres_admin.lib import k8s
from reshard.launchers.podspec import build_runner_pod, runner_labels
from tests.fixtures.manifests import (
    BASE_DIR,
    DOCS,
    K8S_DIR,
    RUNNERS_DIR,
    deployments,
    env_of,
    load_docs,
    matches,
    one,
)

ALLOWED_API_VERSIONS = {
    "v1",
    "apps/v1",
    "batch/v1",
    "rbac.authorization.k8s.io/v1",
    "networking.k8s.io/v1",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
RUNNERS = "duckgres-runners"  # the runner namespace (k8s/runners/)


def namespace_labels(name: str) -> dict[str, str]:
    labels: dict[str, str] = one("Namespace", name)["metadata"]["labels"]
    return labels


def walk_keys(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [k for k, v in node.items() for k in (k, *walk_keys(v))]
    if isinstance(node, list):
        return [k for item in node for k in walk_keys(item)]
    return []


def test_every_manifest_uses_only_the_supported_api_versions():
    assert {d["kind"] for d in DOCS} == {
        "Namespace",
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",  # the API's TokenReview grant (safeguard reshard-79)
        "Deployment",
        "Job",
        "Service",
        "NetworkPolicy",
    }
    for doc in DOCS:
        assert doc["apiVersion"] in ALLOWED_API_VERSIONS, doc["metadata"]["name"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], doc["metadata"]["name"]
        else:
            assert doc["metadata"]["namespace"] in ("duckgres", RUNNERS), doc["metadata"]
    assert "endPort" not in walk_keys(DOCS)


def test_the_runner_policy_selects_exactly_the_pods_the_launcher_creates():
    policy = one("NetworkPolicy", "duckgres-reshard-runner-boundaries", RUNNERS)["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app": "duckgres-reshard"}}
    assert matches(policy["podSelector"], runner_labels(7))
    for deployment in deployments():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert not matches(policy["podSelector"], labels)
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == []


@pytest.mark.safeguard("reshard-79")
def test_the_runner_policy_egress_is_dns_postgres_https_and_the_api_pull_port():
    egress = one("NetworkPolicy", "duckgres-reshard-runner-boundaries", RUNNERS)["spec"]["egress"]
    ports = {(p["protocol"], p["port"]) for rule in egress for p in rule["ports"]}
    # The password-pull port, never the API's main port 8080.
    assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 5432), ("TCP", 443), ("TCP", 8081)}
    api_labels = one("Deployment", "duckgres-admin-api")["spec"]["template"]["metadata"]["labels"]
    for rule in egress:
        rule_ports = {p["port"] for p in rule["ports"]}
        if rule_ports == {8081}:
            [peer] = rule["to"]
            assert set(peer) == {"namespaceSelector", "podSelector"}
            assert matches(peer["namespaceSelector"], namespace_labels("duckgres"))
            assert not matches(peer["namespaceSelector"], namespace_labels(RUNNERS))
            assert matches(peer["podSelector"], api_labels)
            assert not matches(peer["podSelector"], runner_labels(7))
        else:
            assert "to" not in rule  # any destination, on these ports only


@pytest.mark.safeguard("reshard-79")
def test_the_api_admits_only_runner_pods_to_the_pull_port():
    policy = one("NetworkPolicy", "duckgres-admin-api-ingress")["spec"]
    api = one("Deployment", "duckgres-admin-api")
    assert matches(policy["podSelector"], api["spec"]["template"]["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]
    runner_rules = [
        rule
        for rule in policy["ingress"]
        if any(
            "podSelector" in peer
            and matches(peer["podSelector"], runner_labels(7))
            and matches(peer["namespaceSelector"], namespace_labels(RUNNERS))
            and not matches(peer["namespaceSelector"], namespace_labels("duckgres"))
            for peer in rule["from"]
        )
    ]
    assert [[(p["protocol"], p["port"]) for p in r["ports"]] for r in runner_rules] == [
        [("TCP", 8081)]
    ]
    # 8081 is admitted by no other rule: runner pods only.
    others = [rule for rule in policy["ingress"] if rule not in runner_rules]
    assert all(8081 not in {p["port"] for p in rule["ports"]} for rule in others)
    container = api["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert {"name": "password-pull", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert env_of(api)["DUCKGRES_PASSWORD_PULL_PORT"] == {
        "name": "DUCKGRES_PASSWORD_PULL_PORT",
        "value": "8081",
    }
    service = one("Service", "duckgres-admin-api")["spec"]
    assert 8081 not in {p["port"] for p in service["ports"]}  # pod IP only, never the Service
    assert gunicorn_conf.binds("0.0.0.0:8080", 8081) == ["0.0.0.0:8080", "0.0.0.0:8081"]
    assert gunicorn_conf.binds("[::]:8080", 8081) == ["[::]:8080", "[::]:8081"]
    assert gunicorn_conf.binds("0.0.0.0:8080", 0) == ["0.0.0.0:8080"]


@pytest.mark.safeguard("reshard-79")
def test_the_api_may_create_tokenreviews_and_nothing_else_cluster_wide():
    role = one("ClusterRole", "duckgres-admin-api-tokenreview")
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    binding = one("ClusterRoleBinding", "duckgres-admin-api-tokenreview")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "duckgres-admin-api-tokenreview",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "duckgres-admin-api", "namespace": "duckgres"}
    ]
    cluster_bindings = [d for d in load_docs() if d["kind"] == "ClusterRoleBinding"]
    assert [b["metadata"]["name"] for b in cluster_bindings] == ["duckgres-admin-api-tokenreview"]


POD_RULES = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get",
             "list", "watch"]}  # fmt: skip
SECRETS_GET = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
IDENTITIES = {  # ServiceAccount: (its Role's rules or None for no Role, token mounted)
    "duckgres-admin-api": (
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, SECRETS_GET],
        True,
    ),
    # Here: its own pod and the referenced Secrets, read only (safeguard reshard-138).
    "duckgres-admin-launcher": (
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, SECRETS_GET],
        True,
    ),
    "duckgres-admin-beat": (None, False),
}
# The runner namespace: the launcher's Role there, and accounts with no rights and no token.
LAUNCHER_IN_RUNNERS = [
    POD_RULES,
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete", "get"]},
]
DEPLOYMENT_IDENTITY = {
    "duckgres-admin-api": "duckgres-admin-api",
    "duckgres-admin-worker": "duckgres-admin-launcher",
    "duckgres-admin-control-worker": "duckgres-admin-launcher",
    "duckgres-admin-beat": "duckgres-admin-beat",
    "duckgres-admin-trino-worker": "duckgres-admin-trino",  # test_trino_worker_rbac.py
}


@pytest.mark.safeguard("reshard-78")
def test_every_component_has_its_own_least_privilege_identity():
    here = [d for d in load_docs() if d["metadata"].get("namespace") == "duckgres"]
    roles = {d["metadata"]["name"]: d for d in here if d["kind"] == "Role"}
    bindings = {d["metadata"]["name"]: d for d in here if d["kind"] == "RoleBinding"}
    for account, (rules, token) in IDENTITIES.items():
        sa = one("ServiceAccount", account)
        assert sa.get("automountServiceAccountToken", True) is token, account
        if rules is None:
            assert account not in roles, account
            assert not [
                b for b in bindings.values()
                if any(s.get("name") == account for s in b.get("subjects", []))
            ], account  # fmt: skip
            continue
        assert roles[account]["rules"] == rules, account
        assert bindings[account]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": account,
        }
        assert bindings[account]["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "duckgres"}
        ]
    assert "duckgres-admin" not in roles  # the shared identity is gone
    for deployment in deployments():
        spec = deployment["spec"]["template"]["spec"]
        name = deployment["metadata"]["name"]
        assert spec["serviceAccountName"] == DEPLOYMENT_IDENTITY[name], name
        if name == "duckgres-admin-beat":
            assert spec["automountServiceAccountToken"] is False
    assert set(DEPLOYMENT_IDENTITY) == {d["metadata"]["name"] for d in deployments()}


@pytest.mark.safeguard("reshard-138")
def test_the_runner_namespace_holds_only_rightless_accounts_and_the_launchers_role():
    there = [d for d in load_docs() if d["metadata"].get("namespace") == RUNNERS]
    accounts = {d["metadata"]["name"]: d for d in there if d["kind"] == "ServiceAccount"}
    assert set(accounts) == {"duckgres-admin-runner"}  # and `default`, bound to nothing
    assert all(a["automountServiceAccountToken"] is False for a in accounts.values())
    [role] = [d for d in there if d["kind"] == "Role"]
    assert role["metadata"]["name"] == "duckgres-admin-launcher"
    assert role["rules"] == LAUNCHER_IN_RUNNERS
    [binding] = [d for d in there if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == "duckgres-admin-launcher"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "duckgres-admin-launcher", "namespace": "duckgres"}
    ]
    # Nothing here is bound to any other account, and no ClusterRoleBinding names one.
    assert not [d for d in load_docs() if d["kind"] == "ClusterRoleBinding"
                and any(s.get("namespace") == RUNNERS for s in d["subjects"])]  # fmt: skip
    sandbox = one("NetworkPolicy", "duckgres-restore-test-sandbox-boundaries", RUNNERS)["spec"]
    assert sandbox["podSelector"] == {"matchLabels": {"app": "duckgres-restore-test"}}
    assert sandbox["ingress"] == []
    ports = {(p["protocol"], p["port"]) for rule in sandbox["egress"] for p in rule["ports"]}
    assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 5432), ("TCP", 443)}  # never the API
    assert all("to" not in rule for rule in sandbox["egress"])
    assert {d["kind"] for d in there} == {
        "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy"
    }  # fmt: skip
    # The launcher may create pods only there; the control plane's namespace gives it reads.
    assert namespace_labels(RUNNERS)["pod-security.kubernetes.io/enforce"] == "restricted"
    config = one("ConfigMap", "duckgres-admin")["data"]
    assert config["DUCKGRES_RESHARD_RUNNER_NAMESPACE"] == RUNNERS


def test_processes_and_their_identity():
    config = one("ConfigMap", "duckgres-admin")["data"]
    assert config["DUCKGRES_RESHARD_LAUNCHER"] == "pod"
    for deployment in deployments():
        env = env_of(deployment)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert {"configMapRef": {"name": "duckgres-admin"}} in container["envFrom"]
        for name, path in (
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_IP", "status.podIP"),
        ):
            assert env[name]["valueFrom"] == {"fieldRef": {"fieldPath": path}}
        assert (
            deployment["spec"]["selector"]["matchLabels"]
            == deployment["spec"]["template"]["metadata"]["labels"]
        )

    api = one("Deployment", "duckgres-admin-api")["spec"]["template"]["spec"]["containers"][0]
    command = api["command"]
    assert command[0] == "gunicorn"
    # The shipped gunicorn settings live in one module, which the image's CMD names too.
    assert command[command.index("--config") + 1] == "python:duckgres_admin.gunicorn_conf"
    assert not {"--workers", "-w", "--threads"} & set(command)
    assert gunicorn_conf.workers == 1  # the password stash is in-process
    assert gunicorn_conf.threads > 1
    assert api["readinessProbe"]
    assert api["livenessProbe"]

    control = one("Deployment", "duckgres-admin-control-worker")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "--pool=solo" in control["command"]
    assert "--concurrency=1" in control["command"]
    assert control["command"][control["command"].index("-Q") + 1] == "duckgres.control"
    trino = one("Deployment", "duckgres-admin-trino-worker")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert trino["command"][trino["command"].index("-Q") + 1] == "duckgres.trino"
    assert "--pool=solo" in trino["command"]
    worker = one("Deployment", "duckgres-admin-worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["command"][worker["command"].index("-Q") + 1] == "duckgres.default"
    beat = one("Deployment", "duckgres-admin-beat")
    assert beat["spec"]["replicas"] == 1
    assert (
        "django_celery_beat.schedulers:DatabaseScheduler"
        in beat["spec"]["template"]["spec"]["containers"][0]["command"]
    )


def test_the_worker_manifests_consume_the_queues_the_product_routes_to():
    """duckgres_admin.platform.queues is the one table of queue and task names: every worker
    Deployment
    consumes queues of that table, every queue a route or a beat row sends to has a consumer,
    and every beat row's task is one of the product's task names."""
    from duckgres_admin.platform import beat as beat_rows
    from duckgres_admin.platform.queues import ROUTES, QueueName, TaskName

    consumed: dict[str, set[str]] = {}
    for dep in deployments():
        for container in dep["spec"]["template"]["spec"]["containers"]:
            command = container.get("command") or []
            if "worker" in command and "-Q" in command:
                queues = set(command[command.index("-Q") + 1].split(","))
                consumed[dep["metadata"]["name"]] = queues
    assert set(consumed) == {
        "duckgres-admin-worker",
        "duckgres-admin-control-worker",
        "duckgres-admin-trino-worker",
    }
    all_consumed = set().union(*consumed.values())
    assert all_consumed <= {str(q) for q in QueueName}, consumed
    sent_to = {str(q) for q in ROUTES.values()} | {str(row.queue) for row in beat_rows.ROWS}
    assert sent_to <= all_consumed, f"queues nobody consumes: {sent_to - all_consumed}"
    assert {str(q) for q in QueueName} == all_consumed
    assert {row.task for row in beat_rows.ROWS} <= {str(t) for t in TaskName}
    # One worker per queue: the janitor's solo worker alone consumes the broadcast queue, the
    # trino worker alone its queue.
    for queue in QueueName:
        owners = [name for name, queues in consumed.items() if str(queue) in queues]
        assert len(owners) == 1, (queue, owners)


@pytest.mark.safeguard("reshard-50")
@pytest.mark.parametrize("name", ["duckgres-admin-worker", "duckgres-admin-control-worker"])
def test_the_launching_workers_yield_a_valid_runner_pod(name):
    """The pod launcher accepts the shipped control-plane pods (no literal secrets)."""
    template = copy.deepcopy(one("Deployment", name)["spec"]["template"])
    own_pod = {"metadata": {"name": f"{name}-0", "namespace": "duckgres"}, "spec": template["spec"]}
    pod = build_runner_pod(
        op_id=9,
        own_pod=own_pod,
        runner_image="",
        password_url="",
        cpu="2",
        memory="8Gi",
        machine="x86_64",
        now=datetime.now(UTC),
        login_secret="duckgres-reshard-op-1-login",
    )
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["DUCKGRES_RUNNER_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "duckgres-admin",
        "key": "runner-secret",
    }
    assert env["DUCKGRES_CONFIG_STORE"]["valueFrom"]["secretKeyRef"]["key"] == "config-store-dsn"
    for never in (
        "DUCKGRES_INTERNAL_SECRET",
        "DUCKGRES_DATAPLANE_SECRET",
        "DUCKGRES_BROKER_URL",
        "DUCKGRES_RESHARD_POD_CPU",
    ):
        assert never not in env
    assert "serviceAccountName" not in pod["spec"]  # the builder is told the runner's own
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["containers"][0]["workingDir"] == "/app"
    assert pod["metadata"]["labels"] == runner_labels(9)


@pytest.mark.kube
def test_every_manifest_passes_a_server_side_dry_run(kube_api, settings):
    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    k8s.api_client.cache_clear()
    try:
        for doc in load_docs():
            doc = copy.deepcopy(doc)
            if doc["kind"] == "Namespace":
                doc["metadata"]["name"] = f"dry-{secrets.token_hex(4)}"
            elif doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = kube_api.namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = kube_api.namespace
            k8s.server_dry_run(doc, kube_api.namespace)
        # Nothing was persisted.
        names = [
            cm.metadata.name
            for cm in kube_api.core.list_namespaced_config_map(kube_api.namespace).items
        ]
        assert "duckgres-admin" not in names
        # And the dry run really validates: a bad port is refused by the server.
        bad = copy.deepcopy(one("NetworkPolicy", "duckgres-reshard-runner-boundaries", RUNNERS))
        bad["metadata"]["namespace"] = kube_api.namespace
        bad["spec"]["egress"][1]["ports"][0]["port"] = 70000
        with pytest.raises(k8s.KubeError, match="between 1 and 65535"):
            k8s.server_dry_run(bad, kube_api.namespace)
    finally:
        k8s.api_client.cache_clear()


def test_the_manifests_pass_strict_schema_validation():
    """Offline schema check (``kubernetes-validate --strict``), when the tool is installed."""
    tool = shutil.which("kubernetes-validate") or str(
        Path(sys.executable).with_name("kubernetes-validate")
    )
    assert Path(tool).exists(), "kubernetes-validate is missing: run make install"
    paths = [
        str(p)
        for p in sorted(
            [
                *BASE_DIR.glob("*.yaml"),
                *RUNNERS_DIR.glob("*.yaml"),
                *(K8S_DIR / "templates").glob("*.yaml"),
            ]
        )
        if p.name != "kustomization.yaml"
    ]
    result = subprocess.run(
        [tool, "--strict", "-k", "1.29", *paths], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
