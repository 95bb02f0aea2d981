"""Each pool's desired configuration from its own ConfigMap (spec trino-pools §4.4 step 1).

The desired-side half of safeguard 13 (unreadable or vanished configuration freezes, never
"desired zero") is proven here too; the operator's test proves that no drain or delete follows.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from duckgres_admin.lib import k8s
from tests.trino.blueprints import (
    blueprint_text,
    put_config_map,
    trino_kube_fixture,  # noqa: F401
)
from tests.trino.helpers import cell, registry, with_pool
from trino_pools.config import TrinoSettings
from trino_pools.desired import UNREADABLE, read_desired
from trino_pools.registry import Cell, parse_registry

pytestmark = pytest.mark.kube

PREFIX = "duckgres-trino-pool"


def cells_of(*docs: dict[str, Any]) -> tuple[Cell, ...]:
    return parse_registry(registry(*docs), "test registry")


def settings_for(cells: tuple[Cell, ...], namespace: str = "") -> TrinoSettings:
    return TrinoSettings(
        wired=True,
        cells=cells,
        pool_enabled=True,
        config_configmap_prefix=PREFIX,
        config_namespace=namespace,
    )


def write_map(kube: Any, pool: str, cells_json: str, blueprints: dict[str, str]) -> None:
    put_config_map(
        kube.core, kube.namespace, f"{PREFIX}-{pool}", {"cells.json": cells_json, **blueprints}
    )


@pytest.fixture
def two_pools(trino_kube):
    """Pools A and B, each with its own map in the test namespace."""
    kube = trino_kube
    docs = (cell("pool-a"), cell("pool-b"))
    text = registry(*docs)
    write_map(kube, "pool-a", text, {"pool-a.json": blueprint_text(namespace="trino-pool-a")})
    write_map(kube, "pool-b", text, {"pool-b.json": blueprint_text(namespace="trino-pool-b")})
    cells = cells_of(*docs)
    return kube, settings_for(cells, kube.namespace), cells


@pytest.mark.safeguard("trino-12")
def test_each_pool_reads_its_own_map_every_time_registry_and_blueprint_together(
    two_pools, monkeypatch
):
    kube, settings, (cell_a, cell_b) = two_pools
    reads: list[tuple[str, str]] = []
    real_read = k8s.read_config_map

    def counting(namespace: str, name: str, **kw: Any) -> dict[str, Any]:
        reads.append((namespace, name))
        return real_read(namespace, name, **kw)

    monkeypatch.setattr(k8s, "read_config_map", counting)

    a = read_desired(settings, cell_a)
    assert not a.frozen
    assert a.blueprint is not None
    assert (a.cell.pool.desired_instances, a.blueprint.release_id) == (3, "trino-476-r1")
    assert reads == [(kube.namespace, f"{PREFIX}-pool-a")]  # one read of A's own map

    # Edit A's map: the registry (desired 5) and the blueprint (new release) change together.
    edited = registry(with_pool(cell("pool-a"), desired_instances=5), cell("pool-b"))
    write_map(
        kube,
        "pool-a",
        edited,
        {"pool-a.json": blueprint_text(namespace="trino-pool-a", release_id="trino-477-r1")},
    )
    reads.clear()
    a = read_desired(settings, cell_a)
    assert not a.frozen
    assert a.blueprint is not None
    assert (a.cell.pool.desired_instances, a.blueprint.release_id) == (5, "trino-477-r1")
    assert reads == [(kube.namespace, f"{PREFIX}-pool-a")]

    b = read_desired(settings, cell_b)
    assert not b.frozen
    assert b.blueprint is not None
    assert (b.cell.pool.desired_instances, b.blueprint.release_id) == (3, "trino-476-r1")
    assert reads[-1] == (kube.namespace, f"{PREFIX}-pool-b")

    # Deleting A's map freezes A only.
    kube.core.delete_namespaced_config_map(f"{PREFIX}-pool-a", kube.namespace)
    a = read_desired(settings, cell_a)
    assert a.frozen
    assert a.blueprint is None
    assert a.frozen_reason.startswith(
        f"{UNREADABLE}ConfigMap {kube.namespace}/{PREFIX}-pool-a: configmaps/{PREFIX}-pool-a"
    )
    assert "not found (404)" in a.frozen_reason
    b = read_desired(settings, cell_b)
    assert not b.frozen
    assert b.blueprint is not None


def test_the_map_defaults_to_the_cells_namespace(trino_kube):
    kube = trino_kube
    doc = cell("pool-a", namespace=kube.namespace)
    write_map(
        kube, "pool-a", registry(doc), {"pool-a.json": blueprint_text(namespace=kube.namespace)}
    )
    (cell_a,) = cells_of(doc)
    desired = read_desired(settings_for((cell_a,)), cell_a)
    assert desired.blueprint is not None
    assert desired.blueprint.namespace == kube.namespace
    assert desired.source == f"ConfigMap {kube.namespace}/{PREFIX}-pool-a"


def frozen(settings: TrinoSettings, target: Cell) -> str:
    desired = read_desired(settings, target)
    assert desired.frozen
    assert desired.blueprint is None  # never "desired zero": no blueprint, a reason instead
    return desired.frozen_reason


def test_vanished_or_unreadable_configuration_freezes_never_desired_zero(two_pools):
    kube, settings, (cell_a, _) = two_pools
    # The pool vanished from the registry in its map.
    write_map(kube, "pool-a", registry(cell("pool-b")), {"pool-a.json": blueprint_text()})
    reason = frozen(settings, cell_a)
    assert reason.startswith("pool pool-a vanished from the desired registry")
    # The registry key is missing.
    put_config_map(kube.core, kube.namespace, f"{PREFIX}-pool-a", {"pool-a.json": blueprint_text()})
    assert frozen(settings, cell_a) == (
        f"{UNREADABLE}ConfigMap {kube.namespace}/{PREFIX}-pool-a has no key 'cells.json' "
        "(the registry); add it"
    )
    # The blueprint key is missing.
    write_map(kube, "pool-a", registry(cell("pool-a")), {})
    assert "has no key 'pool-a.json' (the blueprint of pool pool-a)" in frozen(settings, cell_a)
    # The registry in the map is invalid.
    write_map(kube, "pool-a", '{"cells": []} {}', {"pool-a.json": blueprint_text()})
    assert frozen(settings, cell_a).startswith(f"{UNREADABLE}ConfigMap")
    assert "must contain one JSON document" in frozen(settings, cell_a)
    # An empty map.
    put_config_map(kube.core, kube.namespace, f"{PREFIX}-pool-a", {})
    assert "has no key 'cells.json'" in frozen(settings, cell_a)


def test_a_map_resolving_the_pool_differently_freezes(two_pools):
    kube, settings, (cell_a, _) = two_pools
    moved = cell("pool-a", namespace="trino-elsewhere")
    write_map(
        kube,
        "pool-a",
        registry(moved),
        {"pool-a.json": blueprint_text(namespace="trino-elsewhere")},
    )
    reason = frozen(settings, cell_a)
    assert reason.startswith(
        "desired configuration names a different pool: namespace 'trino-elsewhere' in the "
        "ConfigMap, 'trino-pool-a' in this process's registry"
    )
    regrouped = cell("pool-a", routing_group="rg-other")
    write_map(kube, "pool-a", registry(regrouped), {"pool-a.json": blueprint_text()})
    assert "routing group 'rg-other'" in frozen(settings, cell_a)


def test_an_invalid_blueprint_or_namespace_mismatch_freezes_with_the_reason(two_pools):
    kube, settings, (cell_a, _) = two_pools
    text = registry(cell("pool-a"))
    write_map(kube, "pool-a", text, {"pool-a.json": blueprint_text(namespace="trino-pool-b")})
    assert frozen(settings, cell_a) == (
        f"blueprint ConfigMap {kube.namespace}/{PREFIX}-pool-a key pool-a.json targets namespace "
        "'trino-pool-b' but the cell's namespace is 'trino-pool-a'; the pool stays frozen until "
        "the blueprint's namespace matches the registry"
    )
    bad = json.loads(blueprint_text())
    bad["image"] = "trino:latest"
    write_map(kube, "pool-a", text, {"pool-a.json": json.dumps(bad)})
    reason = frozen(settings, cell_a)
    assert reason.startswith(
        f"invalid Trino blueprint ConfigMap {kube.namespace}/{PREFIX}-pool-a key pool-a.json: "
        "$.image: 'trino:latest' is not a digest-pinned image"
    )
    # The blueprint key follows the blueprint_file of the registry in the same map.
    renamed = registry(with_pool(cell("pool-a"), blueprint_file="/x/pool-a-v2.json"))
    write_map(kube, "pool-a", renamed, {"pool-a-v2.json": blueprint_text()})
    desired = read_desired(settings, cell_a)
    assert not desired.frozen
    assert desired.cell.pool.blueprint_file == "/x/pool-a-v2.json"


def test_an_unreachable_apiserver_freezes_within_the_budget(settings, dead_endpoint):
    settings.DUCKGRES_KUBE_API_URL = f"https://127.0.0.1:{dead_endpoint.port}"
    settings.DUCKGRES_KUBE_TOKEN = "t"
    settings.DUCKGRES_KUBE_VERIFY_TLS = False
    k8s.api_client.cache_clear()
    try:
        (cell_a,) = cells_of(cell("pool-a"))
        started = time.monotonic()
        reason = frozen(settings_for((cell_a,), "trino-config"), cell_a)
        assert time.monotonic() - started < 10.5
    finally:
        k8s.api_client.cache_clear()
    assert reason.startswith(f"{UNREADABLE}ConfigMap trino-config/{PREFIX}-pool-a: Kubernetes get")
