"""The production overlay and the components it combines (``k8s/overlays/production``,
``k8s/components/{ingress,scrape,webhook,ha}``; docs/kubernetes.md "Overlays"; issue 26 item 2),
rendered by kubectl's kustomize as ``kubectl apply -k`` would."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.docs import documented_files
from tests.fixtures.manifests import DOCS, K8S_DIR, images, kustomize

PRODUCTION = K8S_DIR / "overlays" / "production"


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_production_overlay_is_the_base_plus_its_components() -> None:
    docs = kustomize(PRODUCTION)
    base = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in DOCS}
    rendered = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs}
    assert base <= rendered
    assert {(kind, name) for kind, name, _ in rendered - base} == {
        ("Ingress", "duckgres-admin"),
        ("ServiceMonitor", "duckgres-admin"),
        ("PodMonitor", "duckgres-admin-worker"),
        ("PodDisruptionBudget", "duckgres-admin-api"),
        ("PodDisruptionBudget", "duckgres-admin-worker"),
        ("PodDisruptionBudget", "duckgres-admin-control-worker"),
    }
    assert images(docs) == {"registry.example/duckgres-admin:0.1.0"}
    namespaces = {d["metadata"].get("namespace", "duckgres") for d in docs}
    assert namespaces == {"duckgres", "duckgres-runners"}


def test_the_public_host_is_set_once_and_reaches_every_setting_that_needs_it(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, copy)
    overlay = copy / "overlays" / "production" / "kustomization.yaml"
    text = overlay.read_text()
    assert text.count("admin.example.com") == 1, "the overlay names the host exactly once"
    overlay.write_text(text.replace("admin.example.com", "ops.example.org"))
    docs = kustomize(overlay.parent)
    ingress = _one(docs, "Ingress", "duckgres-admin")
    assert ingress["spec"]["rules"][0]["host"] == "ops.example.org"
    assert ingress["spec"]["tls"][0]["hosts"] == ["ops.example.org"]
    settings = _one(docs, "ConfigMap", "duckgres-admin")["data"]
    assert settings["DUCKGRES_ALLOWED_HOSTS"] == "duckgres-admin-api,ops.example.org"
    assert settings["DUCKGRES_CSRF_TRUSTED_ORIGINS"] == "https://ops.example.org"
    assert settings["DUCKGRES_SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto"
    assert "admin.example.com" not in str(docs)


def test_the_scrape_targets_select_every_exporter() -> None:
    docs = kustomize(PRODUCTION)
    monitor = _one(docs, "ServiceMonitor", "duckgres-admin")
    selector = monitor["spec"]["selector"]["matchLabels"]
    [endpoint] = monitor["spec"]["endpoints"]
    scraped = {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Service"
        and selector.items() <= d["metadata"].get("labels", {}).items()
        and any(p["name"] == endpoint["port"] for p in d["spec"]["ports"])
    }
    assert scraped == {
        "duckgres-admin-api",
        "duckgres-admin-control-worker",
        "duckgres-admin-trino-worker",
    }
    pods = _one(docs, "PodMonitor", "duckgres-admin-worker")
    worker = _one(docs, "Deployment", "duckgres-admin-worker")["spec"]["template"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in worker["spec"]["containers"][0]["ports"]}
    assert ports[pods["spec"]["podMetricsEndpoints"][0]["port"]] == 9111


def test_the_webhook_component_gives_the_worker_its_receiver_from_a_secret() -> None:
    docs = kustomize(PRODUCTION)
    worker = _one(docs, "Deployment", "duckgres-admin-worker")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in worker["containers"][0]["env"]}
    for name, key in (
        ("DUCKGRES_WEBHOOK_URL", "url"),
        ("DUCKGRES_WEBHOOK_SECRET", "signing-secret"),
    ):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "duckgres-admin-webhook", "key": key}
    assert "DJANGO_SECRET_KEY" in env  # merged into the worker's env, not replacing it
    api = _one(docs, "Deployment", "duckgres-admin-api")["spec"]["template"]["spec"]
    assert not any(e["name"].startswith("DUCKGRES_WEBHOOK") for e in api["containers"][0]["env"])


def test_the_default_workers_metrics_directory_is_its_main_containers() -> None:
    """Set on the init container instead, it reached no worker process (seen on the cluster)."""
    worker = _one(DOCS, "Deployment", "duckgres-admin-worker")["spec"]["template"]["spec"]
    [main] = worker["containers"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["DUCKGRES_WORKER_METRICS_DIR"].startswith("/tmp/")
    assert any(m["mountPath"] == "/tmp" for m in main["volumeMounts"])
    for init in worker["initContainers"]:
        assert "DUCKGRES_WORKER_METRICS_DIR" not in {e["name"] for e in init["env"]}


def test_the_documented_rename_moves_both_namespaces_and_keeps_them_wired(tmp_path: Path) -> None:
    """docs/kubernetes.md "Renaming the namespaces", as printed, next to a copy of k8s/."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, copy)
    files = documented_files("The runner namespace", "acme-runners")
    assert set(files) == {
        "overlays/acme/kustomization.yaml",
        "overlays/acme/control/kustomization.yaml",
        "overlays/acme/runners/kustomization.yaml",
    }
    for path, text in files.items():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text(text)
    docs = kustomize(copy / "overlays" / "acme")
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert namespaces == {"acme", "acme-runners"}
    placed = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert placed - {None} == {"acme", "acme-runners"}
    runner_objects = {
        (d["kind"], d["metadata"]["name"])
        for d in docs
        if d["metadata"].get("namespace") == "acme-runners"
    }
    assert ("NetworkPolicy", "duckgres-reshard-runner-boundaries") in runner_objects
    config = _one(docs, "ConfigMap", "duckgres-admin")["data"]
    assert config["DUCKGRES_RESHARD_RUNNER_NAMESPACE"] == "acme-runners"
    [binding] = [
        d for d in docs
        if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == "acme-runners"
    ]  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "duckgres-admin-launcher", "namespace": "acme"}
    ]


QUICKSTART = K8S_DIR / "overlays" / "quickstart"


@pytest.mark.safeguard("reshard-141")
def test_the_quickstart_overlay_brings_its_services_and_no_secret_value() -> None:
    """docs/kubernetes.md "Quickstart": the base plus the in-cluster services, the secrets
    Job and the demo Job; no Secret object (every value is drawn in the cluster), the two
    locally built images, and the S3 endpoint's namespace taken from the Service."""
    docs = kustomize(QUICKSTART)
    base = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in DOCS}
    rendered = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs}
    assert base <= rendered
    added = {(kind, name) for kind, name, _ in rendered - base}
    assert {
        ("StatefulSet", "duckgres-quickstart-pg"),
        ("Deployment", "duckgres-quickstart-redis"),
        ("Deployment", "duckgres-quickstart-s3"),
        ("Job", "duckgres-quickstart-secrets"),
        ("Job", "duckgres-quickstart-demo"),
        ("NetworkPolicy", "duckgres-quickstart-runners-to-s3"),
        ("Role", "duckgres-quickstart-bootstrap"),
    } <= added
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert images(docs) == {
        "localhost/duckgres-admin:0.1.0",
        "localhost/duckgres-quickstart-deps:0.1.0",
    }
    role = _one(docs, "Role", "duckgres-quickstart-bootstrap")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}
    ]
    settings = _one(docs, "ConfigMap", "duckgres-admin")["data"]
    assert settings["DUCKGRES_S3_ENDPOINT_URL"] == "http://duckgres-quickstart-s3.duckgres.svc:9000"
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []):
            for env in container.get("env", []):
                assert "value" not in env or not env["name"].endswith(("PASSWORD", "SECRET")), env
