"""Instance lifecycle of a shared Trino pool (spec trino-pools §3.1, §4.5, §4.6, §4.7, §4.13).

Real kube-apiserver (Deployment status and coordinator pods set by hand), the Gateway double, one
coordinator double per instance and the real config store; see tests/trino/operator_harness.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from duckgres_admin.models.trino import TrinoPoolInstance, TrinoPoolOperationStep
from tests.trino.gateway_double import gateway  # noqa: F401
from tests.trino.operator_harness import PoolWorld, world  # noqa: F401
from trino_pools import instances

pytestmark = [pytest.mark.django_db, pytest.mark.kube]

ADVANCED = instances.ADVANCED
RETIRED_LINE = instances.RETIRED_MESSAGE


def _member_requests(world: PoolWorld, instance_id: str, action: str) -> list[Any]:
    rg = world.routing_group()
    return [
        r[3]
        for r in world.gateway.requests_to("POST", rf"/pools/{rg}/members/{instance_id}/{action}$")
    ]


def _register_requests(world: PoolWorld) -> list[Any]:
    rg = world.routing_group()
    return [r[3] for r in world.gateway.requests_to("POST", rf"/pools/{rg}/members$")]


def _bring_to(world: PoolWorld, instance_id: str, phase: str, max_ticks: int = 40) -> None:
    world.run_until(lambda: world.row(instance_id).phase == phase, max_ticks=max_ticks)


def _first_instance(world: PoolWorld) -> str:
    """Tick until the first instance exists and its objects are created; make it ready."""
    world.run_until(lambda: bool(world.rows()), max_ticks=2)
    instance_id = world.rows()[0].instance_id
    _bring_to(world, instance_id, "CREATING", max_ticks=2)
    world.make_ready(instance_id)
    return instance_id


def test_full_lifecycle_create_to_serving_then_rollout_retires_the_old_instance(
    world: PoolWorld,
) -> None:
    first = _first_instance(world)
    row = world.row(first)
    assert row.release_id == "trino-476-r1"
    assert row.endpoint_url == f"http://{first}.{world.namespace}.svc.cluster.local:8080"
    created = world.instance_objects(first)
    assert created == {
        "ConfigMap": [f"{first}-coordinator-config", f"{first}-worker-config"],
        "Deployment": [f"{first}-coordinator", f"{first}-worker"],
        "Service": [first],
    }
    assert row.worker_config_map_name == f"{first}-worker-config" and row.worker_config_map_uid

    _bring_to(world, first, "SERVING")
    row = world.row(first)
    member = world.gateway.member(world.routing_group(), first)
    assert member is not None and member["state"] == "ACTIVE" and member["eligible"]
    assert row.coordinator_boot_id == world.coordinators[first].process_id
    assert row.coordinator_node_id == member["nodeId"]
    assert row.coordinator_id == member["coordinatorId"]
    assert row.validation_receipt and row.validated_at is not None
    assert row.gateway_state == "ACTIVE"
    backend = world.gateway.backend(f"{world.routing_group()}-{first}")
    assert backend is not None and backend["proxyTo"] == row.endpoint_url

    # A new release: surge-create a replacement, then drain, seal, retire the old instance.
    world.put_desired(release_id="trino-476-r2", generation=2)
    world.run_until(lambda: len(world.rows()) == 2, max_ticks=3)
    second = next(r.instance_id for r in world.rows() if r.instance_id != first)
    _bring_to(world, second, "CREATING", max_ticks=3)
    world.make_ready(second)
    _bring_to(world, second, "SERVING")
    _bring_to(world, first, "RETIRING", max_ticks=6)
    assert world.row(first).retirement_receipt["kind"] == "DRAINED"
    # Objects are deleted by UID; the hand-made pod stays until the "kubelet" removes it.
    world.instance_tick(2)
    assert world.row(first).phase == "RETIRING"
    assert world.instance_objects(first) == {}
    world.remove_pods(first)
    _bring_to(world, first, "RETIRED", max_ticks=2)
    member = world.gateway.member(world.routing_group(), first)
    assert member is not None and member["state"] == "RETIRED"
    assert world.row(second).phase == "SERVING"
    assert world.instance_objects(second) == {
        "ConfigMap": [f"{second}-coordinator-config", f"{second}-worker-config"],
        "Deployment": [f"{second}-coordinator", f"{second}-worker"],
        "Service": [second],
    }
    # Every Gateway mutation carried the full envelope with this term's epoch and owner.
    auth = world.operator.terms[world.cell().stored_id].auth
    for method, path, _headers, body in world.gateway.requests:
        if method == "POST" and "/members" in path:
            assert body["controllerEpoch"] == auth.epoch
            assert body["ownerIdentity"] == auth.owner
            assert body["operationId"].startswith("instance:")
