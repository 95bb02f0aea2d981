"""Malformed blueprints are reported as problems, never as a crash (spec trino-pools §6.3).

An operator-supplied blueprint of the wrong JSON shape must freeze its pool with a
``BlueprintError`` naming the field path, whatever the shape: a Python exception escaping
``validate_blueprint`` / ``parse_blueprint`` would not say what to fix.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import pytest

from tests.trino.blueprints import IMAGE, valid_blueprint
from trino_pools.blueprint import BlueprintError, parse_blueprint, validate_blueprint
from trino_pools.registry import RegistryError, parse_registry

NS = "trino-pool-a"
SRC = "ConfigMap trino-pool-a/duckgres-trino-pool-pool-a key pool-a.json"
ROLES = ("coordinator", "worker")


def problems_of(doc: Any) -> list[str]:
    """The problems ``validate_blueprint`` reports for ``doc`` (it must not accept it)."""
    with pytest.raises(BlueprintError) as info:
        validate_blueprint(doc, source=SRC, cell_namespace=NS)
    assert not info.value.namespace_mismatch
    return list(info.value.problems)


def with_main_field(role: str, key: str, value: Any) -> dict[str, Any]:
    """A valid blueprint whose ``role`` main container (``containers[0]``) has ``key = value``."""
    doc = valid_blueprint(namespace=NS)
    doc[role]["pod_template"]["spec"]["containers"][0][key] = value
    return doc


# The crash found by the randomised comparison: the main container's volumeMounts as a JSON
# scalar that is not iterable (a non-zero number or true) raised TypeError.
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "value",
    [1, -1, 101, 1.5, float("nan"), float("inf"), True],
    ids=["int", "negative-int", "large-int", "float", "nan", "infinity", "true"],
)
def test_main_container_volume_mounts_scalar_is_a_problem(role: str, value: Any) -> None:
    problems = problems_of(with_main_field(role, "volumeMounts", value))
    assert problems == [
        f"$.{role}.pod_template.spec.containers.0.volumeMounts: not a valid Kubernetes pod "
        "template field (Input should be a valid list); fix or remove it (field names are "
        "camelCase as in Kubernetes manifests)"
    ]
    # exactly what any other non-list volumeMounts (a string, an object) already reported
    assert problems == problems_of(with_main_field(role, "volumeMounts", "x"))
    assert problems == problems_of(with_main_field(role, "volumeMounts", {"a": 1}))


@pytest.mark.parametrize("role", ROLES)
def test_volume_mounts_scalar_through_parse_blueprint(role: str) -> None:
    text = json.dumps(with_main_field(role, "volumeMounts", 7))
    with pytest.raises(BlueprintError) as info:
        parse_blueprint(text, source=SRC, cell_namespace=NS)
    message = str(info.value)
    assert message.startswith(f"invalid Trino blueprint {SRC}: ")
    assert f"$.{role}.pod_template.spec.containers.0.volumeMounts: " in message


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"worker": ' + "[" * 100_000 + "]" * 100_000 + "}"],
    ids=["top-level", "inside-the-object"],
)
def test_json_nested_too_deeply_is_a_problem(text: str) -> None:
    """The JSON decoder's RecursionError on very deep nesting (well under 1 MiB) is reported."""
    with pytest.raises(BlueprintError) as info:
        parse_blueprint(text, source=SRC, cell_namespace=NS)
    assert info.value.problems == [
        "$: the JSON is nested too deeply to decode; remove the excess nesting"
    ]


def test_the_registry_reports_deep_nesting_through_the_same_decoder() -> None:
    with pytest.raises(RegistryError) as info:
        parse_registry('{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}", "registry.json")
    assert "$: the JSON is nested too deeply to decode; remove the excess nesting" in str(
        info.value
    )


# Neighbouring positions of the wrong JSON type: these were already reported cleanly; they
# stay problems naming the field (guarding the same class of crash).
@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda d: d["worker"]["pod_template"]["spec"]["containers"][0].update(env={"a": 1}),
            "$.worker.pod_template.spec.containers[0].env",
        ),
        (
            lambda d: d["coordinator"]["pod_template"]["spec"]["containers"][0].update(ports=5),
            "$.coordinator.pod_template.spec.containers[0].ports",
        ),
        (
            lambda d: d["worker"]["pod_template"]["spec"].update(containers=3),
            "$.worker.pod_template.spec.containers",
        ),
        (
            lambda d: d["worker"]["pod_template"]["spec"].update(initContainers=3),
            "$.worker.pod_template.spec.initContainers",
        ),
        (
            lambda d: d["worker"]["pod_template"]["spec"].update(volumes=3),
            "$.worker.pod_template.spec.volumes",
        ),
        (
            lambda d: d["worker"]["pod_template"].update(metadata=3),
            "$.worker.pod_template.metadata",
        ),
        (
            lambda d: d["worker"]["pod_template"]["metadata"].update(labels=[1]),
            "$.worker.pod_template.metadata.labels",
        ),
        (lambda d: d["worker"].update(pod_template=[]), "$.worker.pod_template"),
        (lambda d: d.update(worker=1), "$.worker"),
        (lambda d: d["config_files"].update(worker=[]), "$.config_files.worker"),
        (
            lambda d: d["config_files"]["worker"].update({"node.properties": 1}),
            '$.config_files.worker["node.properties"]',
        ),
        (lambda d: d["shared_resources"].update(secrets={"a": 1}), "$.shared_resources.secrets"),
        (
            lambda d: d["shared_resources"].update(config_maps=[None]),
            "$.shared_resources.config_maps[0]",
        ),
        (lambda d: d.update(identity_binding=[]), "$.identity_binding"),
        (
            lambda d: d["identity_binding"].update(instance_label=1),
            "$.identity_binding.instance_label",
        ),
    ],
)
def test_wrong_json_type_elsewhere_is_a_problem(mutate: Any, field: str) -> None:
    doc = valid_blueprint(namespace=NS)
    mutate(doc)
    problems = problems_of(doc)
    assert any(p.startswith(f"{field}: ") or p.startswith(f"{field}.") for p in problems), problems


# ---- seeded randomised mutations -------------------------------------------------------

SEED = 20240611
MUTATIONS = 3000
JUNK: tuple[Any, ...] = (
    None,
    0,
    1,
    -1,
    2,
    101,
    1.5,
    float("nan"),
    True,
    False,
    "",
    "x",
    "BAD NAME",
    "/etc/trino",
    "/etc/trino/config.properties",
    "trino",
    "http",
    "trino-instance-config",
    "cell-0123abcd",
    "\x01",
    IMAGE,
    [],
    [1],
    ["x"],
    [None],
    {},
    {"a": 1},
    {"name": "trino"},
    [{"name": "TRINO_INSTANCE_ID"}],
    [{"name": "trino", "image": IMAGE}],
    [{"mountPath": "/etc/trino"}],
)
KEYS = (
    "extra",
    "name",
    "namespace",
    "image",
    "env",
    "volumeMounts",
    "ports",
    "containers",
    "initContainers",
    "ephemeralContainers",
    "volumes",
    "hostNetwork",
    "nodeName",
    "serviceAccount",
    "metadata",
    "spec",
    "labels",
    "replicas",
    "secrets",
    "config_maps",
    "x.properties",
    "posthog.com/trino-pool",
)
PROBLEM_RE = re.compile(r"^\$\S*: .+; .+$", re.DOTALL)


def _paths(doc: Any) -> list[tuple[Any, ...]]:
    """Every position in ``doc`` (``()`` is the document itself), parents before children."""
    found: list[tuple[Any, ...]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        found.append(path)
        if isinstance(node, dict):
            stack.extend(((*path, key), value) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, index), value) for index, value in enumerate(node))
    return found


def _mutate(rnd: random.Random, doc: Any) -> Any:
    """Replace, delete or add one value somewhere in ``doc``; returns the (new) document."""
    path = rnd.choice(_paths(doc))
    junk = copy.deepcopy(rnd.choice(JUNK))
    if not path:
        return junk if rnd.random() < 0.02 else doc
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    roll = rnd.random()
    if roll < 0.25 and isinstance(parent, dict):
        del parent[path[-1]]
    elif roll < 0.4 and isinstance(parent, dict):
        parent[rnd.choice(KEYS)] = junk
    else:
        parent[path[-1]] = junk
    return doc


def _outcome(doc: Any, namespace: str) -> BlueprintError | None:
    """The ``BlueprintError`` of ``doc`` (None if valid); any other exception fails the test."""
    try:
        validate_blueprint(doc, source=SRC, cell_namespace=namespace)
    except BlueprintError as exc:
        return exc
    except Exception as exc:
        pytest.fail(f"{type(exc).__name__}: {exc} on {json.dumps(doc)[:2000]}")
    return None


def test_random_mutations_never_crash() -> None:
    rnd = random.Random(SEED)
    base = json.dumps(valid_blueprint(namespace=NS))
    outcomes = {"accepted": 0, "rejected": 0}
    for _ in range(MUTATIONS):
        doc: Any = json.loads(base)
        for _ in range(rnd.choice((1, 1, 2, 3, 5))):
            doc = _mutate(rnd, doc)
        error = _outcome(doc, rnd.choice((NS, "other-namespace")))
        if error is None:
            outcomes["accepted"] += 1
            continue
        outcomes["rejected"] += 1
        assert error.problems, doc
        if not error.namespace_mismatch:
            assert all(PROBLEM_RE.match(p) for p in error.problems), error.problems
    # both outcomes are exercised (a mutation may hit a field that stays valid)
    assert outcomes["accepted"] > 0, outcomes
    assert outcomes["rejected"] > MUTATIONS // 2, outcomes
