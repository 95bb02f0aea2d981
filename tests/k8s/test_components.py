"""The optional HA component (``k8s/components/ha``; docs/kubernetes.md "High availability";
issue 26 items 2 and 4), read as kustomize would apply it to the shipped Deployments.

A node drain must never take both replicas of the API, the default worker or the control
worker at once: each gets a PodDisruptionBudget that selects exactly its pods, and a soft
spread over nodes and zones. The API lets in-flight requests finish before it stops.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.fixtures.manifests import K8S_DIR, one

HA = K8S_DIR / "components" / "ha"
REPLICATED = ("api", "worker", "control-worker")


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((HA / name).read_text()) if d]


def _pod_labels(component: str) -> dict[str, str]:
    deployment = one("Deployment", f"duckgres-admin-{component}")
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_component_lists_its_files() -> None:
    kustomization = yaml.safe_load((HA / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == ["pdb.yaml"]
    assert [p["path"] for p in kustomization["patches"]] == ["spread.yaml"]


def test_each_replicated_deployment_has_a_budget_that_selects_exactly_its_pods() -> None:
    budgets = {d["metadata"]["name"]: d for d in _docs("pdb.yaml")}
    assert set(budgets) == {f"duckgres-admin-{c}" for c in REPLICATED}
    for component in REPLICATED:
        budget = budgets[f"duckgres-admin-{component}"]
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["maxUnavailable"] == 1
        selector = budget["spec"]["selector"]["matchLabels"]
        assert selector.items() <= _pod_labels(component).items(), component
        assert selector["component"] == component  # never another Deployment's pods
        replicas = one("Deployment", f"duckgres-admin-{component}")["spec"]["replicas"]
        assert replicas >= 2, component  # one may go, one stays


def test_the_spread_patches_name_shipped_deployments_and_select_their_own_pods() -> None:
    patches = {d["metadata"]["name"]: d for d in _docs("spread.yaml")}
    assert set(patches) == {f"duckgres-admin-{c}" for c in REPLICATED}
    for component in REPLICATED:
        spec = patches[f"duckgres-admin-{component}"]["spec"]["template"]["spec"]
        keys = set()
        for constraint in spec["topologySpreadConstraints"]:
            keys.add(constraint["topologyKey"])
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # one node still works
            selector = constraint["labelSelector"]["matchLabels"]
            assert selector.items() <= _pod_labels(component).items(), component
        assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


def test_the_api_drains_before_gunicorn_stops() -> None:
    from duckgres_admin import gunicorn_conf

    spec = one("Deployment", "duckgres-admin-api")["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert 5 + gunicorn_conf.graceful_timeout < spec["terminationGracePeriodSeconds"]
