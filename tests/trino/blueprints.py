"""Builders for valid pool blueprints (spec trino-pools §6.3) and Kubernetes test helpers.

Other Trino tests import from here:

- ``valid_blueprint(namespace=…, release_id=…, image=…, replicas=…) -> dict``: a blueprint
  that ``trino_pools.blueprint.parse_blueprint`` accepts for that namespace;
- ``blueprint_text(**kw) -> str``: the same, JSON-encoded;
- ``pool_config_map(…)``: create/replace a pool's ConfigMap ``<prefix>-<pool>`` holding the
  registry and the blueprint, on the real apiserver;
- ``set_deployment_ready(api_client, namespace, name, ready)``: set a Deployment's
  ``readyReplicas`` via the status subresource (the test apiserver runs no controllers);
- fixture ``trino_kube``: ``kube_api`` with the product's Kubernetes seam pointed at it
  (import it explicitly: ``from tests.trino.blueprints import trino_kube_fixture  # noqa: F401``).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

IMAGE = "registry.example/trino@sha256:" + "a" * 64
IMAGE_2 = "registry.example/trino@sha256:" + "b" * 64
SIDECAR_IMAGE = "registry.example/jmx-exporter@sha256:" + "c" * 64

IDENTITY = {
    "instance_label": "trino.posthog.com/instance",
    "component_label": "trino.posthog.com/component",
    "discovery_uri_env": "TRINO_DISCOVERY_URI",
    "node_environment_env": "TRINO_NODE_ENVIRONMENT",
    "instance_id_env": "TRINO_INSTANCE_ID",
    "coordinator_http_port_name": "http",
    "coordinator_container_name": "trino",
    "worker_container_name": "trino",
}

COORDINATOR_CONFIG = (
    "coordinator=true\n"
    "node-scheduler.include-coordinator=false\n"
    "http-server.http.port=8080\n"
    "discovery.uri=${ENV:TRINO_DISCOVERY_URI}\n"
)
WORKER_CONFIG = (
    "coordinator=false\nhttp-server.http.port=8080\ndiscovery.uri=${ENV:TRINO_DISCOVERY_URI}\n"
)
NODE_PROPERTIES = "node.environment=${ENV:TRINO_NODE_ENVIRONMENT}\nnode.data-dir=/data/trino\n"


def pod_template(role: str, image: str = IMAGE) -> dict[str, Any]:
    main: dict[str, Any] = {
        "name": "trino",
        "image": image,
        "env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-XX:+UseG1GC"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "tenant-secrets", "mountPath": "/etc/trino/tenant-secrets"}],
    }
    if role == "coordinator":
        main["ports"] = [{"name": "http", "containerPort": 8080}]
    return {
        "metadata": {
            "labels": {"app.kubernetes.io/name": "trino", "team": "data"},
            "annotations": {"prometheus.io/scrape": "true"},
        },
        "spec": {
            "serviceAccountName": "trino",
            "containers": [
                main,
                {"name": "jmx", "image": SIDECAR_IMAGE, "ports": [{"containerPort": 9404}]},
            ],
            "volumes": [
                {"name": "tenant-secrets", "secret": {"secretName": "trino-tenant-secrets"}}
            ],
            "nodeSelector": {"duckgres.posthog.com/pool": "trino"},
        },
    }


def valid_blueprint(
    *,
    namespace: str = "trino-pool-a",
    release_id: str = "trino-476-r1",
    image: str = IMAGE,
    replicas: int = 2,
    generation: int = 1,
) -> dict[str, Any]:
    return {
        "blueprint_version": 1,
        "generation": generation,
        "release_id": release_id,
        "chart_version": "0.42.0",
        "image": image,
        "namespace": namespace,
        "service_account_name": "trino",
        "coordinator": {"pod_template": pod_template("coordinator", image)},
        "worker": {"pod_template": pod_template("worker", image), "replicas": replicas},
        "config_files": {
            "coordinator": {
                "config.properties": COORDINATOR_CONFIG,
                "node.properties": NODE_PROPERTIES,
                "jvm.config": "-server\n-Xmx1G\n",
            },
            "worker": {"config.properties": WORKER_CONFIG, "node.properties": NODE_PROPERTIES},
        },
        "shared_resources": {
            "secrets": ["trino-tenant-secrets", "trino-observer"],
            "config_maps": ["trino-catalog-defaults"],
        },
        "identity_binding": copy.deepcopy(IDENTITY),
    }


def blueprint_text(**kwargs: Any) -> str:
    return json.dumps(valid_blueprint(**kwargs), indent=2)


def blueprint_key(cell: Any) -> str:
    """The ConfigMap key of a cell's blueprint: the basename of its ``blueprint_file``."""
    return str(os.path.basename(cell.pool.blueprint_file))


def put_config_map(core: Any, namespace: str, name: str, data: dict[str, str]) -> None:
    """Create or replace a ConfigMap (raw client; tests only)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=data)
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_config_map(name, namespace, body)


def set_deployment_ready(api_client: Any, namespace: str, name: str, ready: int) -> None:
    """Set ``status.readyReplicas`` (and replicas/available) of a Deployment by hand."""
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    status = {
        "replicas": ready,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "updatedReplicas": ready,
    }
    apps.patch_namespaced_deployment_status(name, namespace, {"status": status})


@pytest.fixture(name="trino_kube")
def trino_kube_fixture(kube_api: Any, settings: Any) -> Iterator[Any]:
    """``kube_api`` with the product's Kubernetes seam (``duckgres_admin.lib.k8s``) aimed at it."""
    from duckgres_admin.lib import k8s

    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    k8s.api_client.cache_clear()
    try:
        yield kube_api
    finally:
        k8s.api_client.cache_clear()
