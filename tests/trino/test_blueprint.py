"""The strict pool blueprint (spec trino-pools §6.3): every rule, good and bad."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.trino.blueprints import IMAGE, SIDECAR_IMAGE, blueprint_text, valid_blueprint
from trino_pools.blueprint import (
    BlueprintError,
    canonical_json,
    digest_of,
    parse_blueprint,
)

NS = "trino-pool-a"
SRC = "ConfigMap trino-pool-a/duckgres-trino-pool-pool-a key pool-a.json"


def parse(doc: dict[str, Any] | str, namespace: str = NS) -> Any:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return parse_blueprint(text, source=SRC, cell_namespace=namespace)


def problems(doc: dict[str, Any] | str) -> str:
    with pytest.raises(BlueprintError) as info:
        parse(doc)
    assert not info.value.namespace_mismatch
    message = str(info.value)
    assert message.startswith(f"invalid Trino blueprint {SRC}: ")
    return message


def test_a_valid_blueprint_parses_with_its_canonical_digest():
    doc = valid_blueprint(replicas=3)
    bp = parse(blueprint_text(replicas=3))
    assert bp.release_id == "trino-476-r1"
    assert bp.image == IMAGE
    assert bp.namespace == NS
    assert bp.worker_replicas == 3
    assert bp.generation == 1
    assert bp.shared_secrets == ("trino-tenant-secrets", "trino-observer")
    assert bp.shared_config_maps == ("trino-catalog-defaults",)
    assert bp.identity.coordinator_container_name == "trino"
    assert set(bp.config_files) == {"coordinator", "worker"}
    assert bp.raw == doc
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert canonical_json(doc) == canonical
    import hashlib

    assert bp.digest == hashlib.sha256(canonical.encode()).hexdigest() == digest_of(doc)
    # key order and whitespace do not change the digest; content does
    assert parse(json.dumps(doc, indent=4, sort_keys=True)).digest == bp.digest
    assert parse(blueprint_text(replicas=4)).digest != bp.digest


def test_optional_shared_resources_and_generation_zero():
    doc = valid_blueprint(generation=0)
    del doc["shared_resources"]
    bp = parse(doc)
    assert (bp.generation, bp.shared_secrets, bp.shared_config_maps) == (0, (), ())


def test_namespace_mismatch_has_its_own_message():
    with pytest.raises(BlueprintError) as info:
        parse(blueprint_text(namespace="trino-pool-b"))
    assert info.value.namespace_mismatch
    assert str(info.value) == (
        f"blueprint {SRC} targets namespace 'trino-pool-b' but the cell's namespace is "
        "'trino-pool-a'; the pool stays frozen until the blueprint's namespace matches the "
        "registry"
    )


def test_one_document_only_and_size_limit():
    text = blueprint_text()
    assert "must contain one JSON document" in problems(text + "\n{}")
    parse(text + " \n\t ")  # whitespace after the document is fine
    assert "not valid JSON" in problems(text[:-5])
    assert "duplicate key" in problems('{"release_id": "a", "release_id": "b"}')
    with pytest.raises(BlueprintError, match="larger than 1 MiB"):
        parse(text + " " * (1024 * 1024))
    assert "$: must be an object" in problems("[]")


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        elif value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return apply


def _file(role: str, name: str, value: Any) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        files = doc["config_files"][role]
        if value is _DELETE:
            del files[name]
        else:
            files[name] = value

    return apply


_DELETE = object()
CO = "coordinator.pod_template"
WO = "worker.pod_template"
MAIN = f"{CO}.spec.containers.0"


BAD: list[tuple[str, Mutation, str]] = [
    ("unknown top field", _set("replicas", 3), '$.replicas: unknown field "replicas"'),
    ("missing release", _set("release_id", _DELETE), "$.release_id: release_id is required"),
    ("version 2", _set("blueprint_version", 2), "unsupported blueprint_version 2"),
    ("negative generation", _set("generation", -1), "generation must be an integer >= 0"),
    ("bool generation", _set("generation", True), "generation must be an integer >= 0"),
    ("release pattern", _set("release_id", "-bad"), "$.release_id: '-bad' is not"),
    ("release too long", _set("release_id", "r" * 129), "$.release_id:"),
    ("chart pattern", _set("chart_version", "1 2"), "$.chart_version: '1 2' is not"),
    ("image by tag", _set("image", "trino:476"), "$.image: 'trino:476' is not a digest-pinned"),
    ("short digest", _set("image", "trino@sha256:abc"), "$.image:"),
    ("namespace not a label", _set("namespace", "Trino_A"), "$.namespace: 'Trino_A' is not"),
    ("no service account", _set("service_account_name", ""), "$.service_account_name:"),
    ("unknown coordinator field", _set("coordinator.replicas", 2), "$.coordinator.replicas:"),
    ("no pod template", _set("worker.pod_template", _DELETE), "$.worker.pod_template:"),
    ("zero replicas", _set("worker.replicas", 0), "replicas must be 1..100 (got 0)"),
    ("101 replicas", _set("worker.replicas", 101), "replicas must be 1..100 (got 101)"),
    ("template name", _set(f"{CO}.metadata.name", "x"), "must not set name"),
    ("template namespace", _set(f"{WO}.metadata.namespace", "x"), "must not set namespace"),
    (
        "template owner refs",
        _set(f"{CO}.metadata.ownerReferences", []),
        "must not set ownerReferences",
    ),
    ("unknown metadata field", _set(f"{CO}.metadata.finalizers", []), 'unknown field "finalizers"'),
    (
        "instance label",
        _set(f"{CO}.metadata.labels", {"trino.posthog.com/instance": "x"}),
        "the label trino.posthog.com/instance is set by the operator",
    ),
    (
        "component label",
        _set(f"{WO}.metadata.labels", {"trino.posthog.com/component": "worker"}),
        "the label trino.posthog.com/component is set by the operator",
    ),
    (
        "pool label",
        _set(f"{WO}.metadata.labels", {"posthog.com/trino-pool": "pool-a"}),
        "the label posthog.com/trino-pool is set by the operator",
    ),
    ("host network", _set(f"{CO}.spec.hostNetwork", True), "hostNetwork is not allowed"),
    ("host pid", _set(f"{WO}.spec.hostPID", True), "hostPID is not allowed"),
    ("host ipc", _set(f"{WO}.spec.hostIPC", True), "hostIPC is not allowed"),
    ("node pin", _set(f"{CO}.spec.nodeName", "node-1"), "pinning a node is not allowed"),
    (
        "other service account",
        _set(f"{CO}.spec.serviceAccountName", "default"),
        "'default' does not match service_account_name 'trino'",
    ),
    ("no containers", _set(f"{CO}.spec.containers", []), "needs 1 to 8 containers"),
    (
        "nine containers",
        _set(
            f"{WO}.spec.containers",
            [{"name": "trino", "image": IMAGE}]
            + [{"name": f"s{i}", "image": SIDECAR_IMAGE} for i in range(8)],
        ),
        "needs 1 to 8 containers",
    ),
    (
        "no main container",
        _set(f"{MAIN}.name", "presto"),
        "exactly one main container named 'trino' is required (found 0)",
    ),
    (
        "two main containers",
        _set(f"{WO}.spec.containers.1.name", "trino"),
        "exactly one main container named 'trino' is required (found 2)",
    ),
    (
        "main not the release image",
        _set(f"{MAIN}.image", SIDECAR_IMAGE),
        "the main container does not run the release image",
    ),
    (
        "sidecar by tag",
        _set(f"{CO}.spec.containers.1.image", "jmx:latest"),
        "'jmx:latest' is not digest-pinned",
    ),
    (
        "init container by tag",
        _set(f"{WO}.spec.initContainers", [{"name": "init", "image": "busybox"}]),
        "initContainers[0].image: 'busybox' is not digest-pinned",
    ),
    (
        "injected env",
        _set(f"{MAIN}.env", [{"name": "TRINO_DISCOVERY_URI", "value": "x"}]),
        "TRINO_DISCOVERY_URI is injected by the operator",
    ),
    (
        "injected env in a sidecar",
        _set(f"{WO}.spec.containers.1.env", [{"name": "TRINO_INSTANCE_ID", "value": "x"}]),
        "TRINO_INSTANCE_ID is injected by the operator",
    ),
    (
        "no named coordinator port",
        _set(f"{MAIN}.ports", [{"containerPort": 8080}]),
        "the coordinator has no port named 'http'",
    ),
    (
        "unknown pod spec field",
        _set(f"{CO}.spec.hostNetworking", True),
        "coordinator.pod_template.spec.hostNetworking: not a valid Kubernetes pod template field",
    ),
    (
        "unknown container field",
        _set(f"{MAIN}.imageDigest", "x"),
        "not a valid Kubernetes pod template field",
    ),
    (
        "reserved volume",
        _set(f"{WO}.spec.volumes", [{"name": "trino-instance-config", "emptyDir": {}}]),
        "the volume name trino-instance-config is reserved",
    ),
    (
        "reserved mount",
        _set(f"{MAIN}.volumeMounts", [{"name": "tenant-secrets", "mountPath": "/etc/trino"}]),
        "a volume over /etc/trino would hide the instance configuration files",
    ),
    (
        "mount over a config file",
        _set(f"{MAIN}.volumeMounts", [{"name": "x", "mountPath": "/etc/trino/jvm.config"}]),
        "/etc/trino/jvm.config is where the operator mounts the coordinator file of that name",
    ),
    ("unknown role", _set("config_files.gateway", {}), "$.config_files.gateway: unknown field"),
    ("missing role", _set("config_files.worker", _DELETE), "the worker files are required"),
    (
        "missing config.properties",
        _file("worker", "config.properties", _DELETE),
        "the worker needs config.properties",
    ),
    (
        "config without discovery reference",
        _file("coordinator", "config.properties", "coordinator=true\n"),
        "config.properties does not reference ${ENV:TRINO_DISCOVERY_URI}",
    ),
    (
        "node without environment reference",
        _file("worker", "node.properties", "node.environment=production\n"),
        "node.properties does not reference ${ENV:TRINO_NODE_ENVIRONMENT}",
    ),
    (
        "path as file name",
        _file("worker", "catalog/x.properties", "a=b\n"),
        "is not a plain file name",
    ),
    (
        "control character",
        _file("worker", "log.properties", "io.trino=INFO\x00\n"),
        "contains the control character U+0000",
    ),
    (
        "file over 256 KiB",
        _file("worker", "big.properties", "a" * (256 * 1024 + 1)),
        "keep each file at most 256 KiB",
    ),
    (
        "files over 768 KiB",
        _set(
            "config_files.worker",
            {
                "config.properties": "discovery.uri=${ENV:TRINO_DISCOVERY_URI}\n",
                "node.properties": "node.environment=${ENV:TRINO_NODE_ENVIRONMENT}\n",
                **{f"f{i}.properties": "a" * (200 * 1024) for i in range(4)},
            },
        ),
        "keep all files together at most 768 KiB",
    ),
    (
        "unknown shared kind",
        _set("shared_resources.services", []),
        "$.shared_resources.services: unknown field",
    ),
    (
        "33 shared names",
        _set("shared_resources.secrets", [f"s-{i}" for i in range(33)]),
        "list at most 32 names",
    ),
    (
        "shared name like an instance",
        _set("shared_resources.config_maps", ["cell-0123abcd-worker-config"]),
        "looks like an instance object name",
    ),
    (
        "unknown identity field",
        _set("identity_binding.pool_label", "x"),
        "$.identity_binding.pool_label: unknown field",
    ),
    (
        "missing identity field",
        _set("identity_binding.worker_container_name", _DELETE),
        "worker_container_name is required",
    ),
    (
        "bad env name",
        _set("identity_binding.instance_id_env", "INSTANCE-ID"),
        "'INSTANCE-ID' is not an environment variable name",
    ),
    (
        "same env twice",
        _set("identity_binding.instance_id_env", "TRINO_DISCOVERY_URI"),
        "must be distinct",
    ),
    (
        "long port name",
        _set("identity_binding.coordinator_http_port_name", "coordinator-http"),
        "is not a valid port name",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_rule_rejects_with_the_field_path(mutate: Mutation, expected: str):
    doc = valid_blueprint()
    mutate(doc)
    assert expected in problems(doc)


def test_every_problem_is_reported_at_once_with_a_fix():
    doc = valid_blueprint()
    doc["image"] = "trino:476"
    doc["worker"]["replicas"] = 0
    doc["coordinator"]["pod_template"]["spec"]["hostNetwork"] = True
    message = problems(doc)
    assert "$.image: 'trino:476' is not a digest-pinned image" in message
    assert "$.worker.replicas:" in message
    assert "$.coordinator.pod_template.spec.hostNetwork: hostNetwork is not allowed; remove" in (
        message
    )


def test_allowed_variations_parse():
    doc = valid_blueprint()
    spec = doc["worker"]["pod_template"]["spec"]
    spec["hostNetwork"] = False
    spec["initContainers"] = [{"name": "init", "image": SIDECAR_IMAGE}]
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "trino"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    del doc["coordinator"]["pod_template"]["spec"]["serviceAccountName"]
    doc["config_files"]["worker"]["log.properties"] = "io.trino=INFO\r\n\tx=y\n"
    doc["identity_binding"]["instance_label"] = "posthog.com/trino-instance"
    doc["coordinator"]["pod_template"]["metadata"]["labels"] = {"team": "data"}
    parse(doc)
