"""Instance lifecycle of a shared Trino pool (spec trino-pools §3.1, §4.5, §4.6, §4.7, §4.13).

Real kube-apiserver (Deployment status and coordinator pods set by hand), the Gateway double, one
coordinator double per instance and the real config store; see tests/trino/operator_harness.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.db import connection

from duckgres_admin.lib import k8s
from duckgres_admin.lib.gateway import GatewayClient, parse_backends
from duckgres_admin.models.trino import TrinoPoolInstance, TrinoPoolOperationStep
from tests.trino import gateway_double, operator_harness
from tests.trino.operator_harness import PoolWorld, make_world
from trino_pools import config as trino_config
from trino_pools.operator import instances
from trino_pools.operator import tick as operator_tick
from trino_pools.operator.instances import base as instance_base

pytestmark = [pytest.mark.django_db, pytest.mark.kube]

# Fixtures used here (pytest finds them by name in this module).
gateway = gateway_double.gateway
world = operator_harness.world

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


@pytest.mark.safeguard("trino-26")
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
    assert row.worker_config_map_name == f"{first}-worker-config"
    assert row.worker_config_map_uid

    _bring_to(world, first, "SERVING")
    row = world.row(first)
    member = world.gateway.member(world.routing_group(), first)
    assert member is not None
    assert member["state"] == "ACTIVE"
    assert member["eligible"]
    assert row.coordinator_boot_id == world.coordinators[first].process_id
    assert row.coordinator_node_id == member["nodeId"]
    assert row.coordinator_id == member["coordinatorId"]
    assert row.validation_receipt
    assert row.validated_at is not None
    assert row.gateway_state == "ACTIVE"
    backend = world.gateway.backend(f"{world.routing_group()}-{first}")
    assert backend is not None
    assert backend["proxyTo"] == row.endpoint_url

    # A new release: surge-create a replacement, then drain, seal, retire the old instance.
    world.put_desired(release_id="trino-476-r2", generation=2)
    world.run_until(lambda: len(world.rows()) == 2, max_ticks=3)
    second = next(r.instance_id for r in world.rows() if r.instance_id != first)
    _bring_to(world, second, "CREATING", max_ticks=3)
    world.make_ready(second)
    _bring_to(world, second, "SERVING")
    _bring_to(world, first, "RETIRING", max_ticks=6)
    receipt = world.row(first).retirement_receipt
    assert receipt is not None
    assert receipt["kind"] == "DRAINED"
    # Objects are deleted by UID; the hand-made pod stays until the "kubelet" removes it.
    world.instance_tick(2)
    assert world.row(first).phase == "RETIRING"
    assert world.instance_objects(first) == {}
    world.remove_pods(first)
    _bring_to(world, first, "RETIRED", max_ticks=2)
    member = world.gateway.member(world.routing_group(), first)
    assert member is not None
    assert member["state"] == "RETIRED"
    # Its backend record is gone from the registry; the serving instance's stays.
    assert f"{world.routing_group()}-{first}" not in _backend_names(world)
    assert f"{world.routing_group()}-{second}" in _backend_names(world)
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


def _serve(world: PoolWorld, count: int, max_ticks: int = 80) -> list[str]:
    """Tick (making every new instance ready) until ``count`` instances are SERVING."""

    def ready_new() -> None:
        for row in world.rows():
            if row.phase == "CREATING" and row.instance_id not in world.coordinators:
                world.make_ready(row.instance_id)

    world.run_until(
        lambda: sum(1 for r in world.rows() if r.phase == "SERVING") >= count,
        max_ticks=max_ticks,
        each=ready_new,
    )
    return [r.instance_id for r in world.rows() if r.phase == "SERVING"]


@pytest.fixture
def world2(kube_api: Any, gateway: Any, tmp_path: Any, settings: Any) -> Any:
    """Two desired instances, min serving 1: one may drain while the other serves."""
    built = make_world(kube_api, gateway, tmp_path, settings, desired_instances=2)
    try:
        yield built
    finally:
        built.operator.end_all_terms("test teardown")
        built.close()
        trino_config.install_for_tests(None)


@pytest.mark.safeguard("trino-19")
def test_boot_id_is_the_coordinator_process_id(world: PoolWorld) -> None:
    world.run_until(lambda: bool(world.rows()), max_ticks=2)
    instance_id = world.rows()[0].instance_id
    _bring_to(world, instance_id, "CREATING", max_ticks=2)
    coordinator = world.make_ready(instance_id)
    # The Gateway refuses any bootId that is not the coordinator's processId.
    world.gateway.set_process_id(world.routing_group(), instance_id, coordinator.process_id)
    _bring_to(world, instance_id, "SERVING")
    (register,) = _register_requests(world)
    row = world.row(instance_id)
    assert register["bootId"] == coordinator.process_id
    assert register["podUid"] == row.coordinator_pod_uid != coordinator.process_id
    (admit,) = _member_requests(world, instance_id, "admit")
    assert admit["receipt"]["bootId"] == coordinator.process_id


@pytest.mark.safeguard("trino-20")
def test_a_lost_registration_response_is_adopted_with_the_gateways_identity(
    world: PoolWorld,
) -> None:
    instance_id = _first_instance(world)
    rg = world.routing_group()
    coordinator = world.coordinators[instance_id]
    world.gateway.fail_next("POST", rf"/pools/{rg}/members$", drop_response=True)
    _bring_to(world, instance_id, "PREPARING", max_ticks=3)
    assert len(_register_requests(world)) == 1  # adopted by reading the member back
    row = world.row(instance_id)
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert (row.coordinator_node_id, row.coordinator_id) == (
        member["nodeId"],
        member["coordinatorId"],
    )
    assert (row.coordinator_node_id, row.coordinator_id) == (
        coordinator.node_id,
        coordinator.coordinator_id,
    )
    assert row.coordinator_node_id != row.coordinator_id
    _bring_to(world, instance_id, "SERVING")
    # The coordinator dies: suspect, then the loss claim, both accepted by the Gateway.
    world.terminate_coordinator(instance_id)
    _bring_to(world, instance_id, "LOST", max_ticks=3)
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "LOST"
    (lost,) = _member_requests(world, instance_id, "lost")
    assert lost["evidence"]["nodeId"] == member["nodeId"]
    assert lost["evidence"]["coordinatorId"] == member["coordinatorId"]
    assert "OOMKilled" in lost["evidence"]["observation"]
    # Failure retirement: the Gateway's failure receipt first, then the objects, then retired.
    world.instance_tick()
    receipt = world.row(instance_id).retirement_receipt
    assert receipt is not None
    assert receipt["kind"] == "FAILED"
    assert world.instance_objects(instance_id) == {}
    world.remove_pods(instance_id)
    _bring_to(world, instance_id, "FAILURE_RETIRED", max_ticks=3)
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "RETIRED"
    assert f"{rg}-{instance_id}" not in _backend_names(world)


@pytest.mark.safeguard("trino-21")
def test_a_failed_candidate_is_walked_out_cleaned_up_and_failure_retired(
    world: PoolWorld,
) -> None:
    instance_id = _first_instance(world)
    rg = world.routing_group()
    _bring_to(world, instance_id, "PREPARING", max_ticks=3)
    world.coordinators[instance_id].restart()  # a new processId before admission
    _bring_to(world, instance_id, "FAILED_PREPARING", max_ticks=4)
    row = world.row(instance_id)
    assert "restarted before admission" in row.failure_reason
    # FAILED_PREPARING is not terminal: the member is walked PREPARING → SUSPECT → LOST and the
    # objects are deleted (the planner does not create while it occupies capacity).
    world.instance_tick(4)
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "LOST"
    assert world.instance_objects(instance_id) == {}
    assert world.row(instance_id).phase == "FAILED_PREPARING"  # its pod is still there
    world.remove_pods(instance_id)
    _bring_to(world, instance_id, "FAILURE_RETIRED", max_ticks=2)
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "RETIRED"
    assert f"{rg}-{instance_id}" not in _backend_names(world)
    # The pool moves on: a replacement candidate is created.
    world.run_until(lambda: len(world.rows()) == 2, max_ticks=2)


@pytest.mark.safeguard("trino-22")
def test_a_repair_names_the_lost_instance_in_repair_for(world: PoolWorld) -> None:
    (lost_id,) = _serve(world, 1)
    world.terminate_coordinator(lost_id)
    _bring_to(world, lost_id, "LOST", max_ticks=3)
    # Its pod stays (no kubelet), so it stays LOST while the planner creates a repair.
    world.run_until(lambda: len(world.rows()) == 2, max_ticks=4)
    repair = next(r for r in world.rows() if r.instance_id != lost_id)
    assert repair.repair
    assert repair.repair_for == lost_id
    _bring_to(world, repair.instance_id, "CREATING", max_ticks=3)
    world.make_ready(repair.instance_id)
    _bring_to(world, repair.instance_id, "SERVING")
    bodies = _register_requests(world)
    assert [b["repairFor"] for b in bodies] == ["", lost_id]
    member = world.gateway.member(world.routing_group(), repair.instance_id)
    assert member is not None
    assert member["repairFor"] == lost_id


@pytest.mark.safeguard("trino-24")
def test_seal_uses_the_recorded_generation_not_the_obligations_one(world2: PoolWorld) -> None:
    world = world2
    old, _other = _serve(world, 2)
    rg = world.routing_group()
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    recorded = world.row(old).gateway_generation
    assert recorded is not None
    world.gateway.set_obligations(rg, old, generation=recorded + 40)
    _bring_to(world, old, "SEALED", max_ticks=2)
    (seal,) = _member_requests(world, old, "seal")
    assert seal["expectedGeneration"] == recorded


@pytest.mark.safeguard("trino-25")
def test_a_lost_admit_response_settles_on_retry(world: PoolWorld) -> None:
    instance_id = _first_instance(world)
    rg = world.routing_group()
    _bring_to(world, instance_id, "VALIDATING")
    world.gateway.fail_next("POST", rf"/members/{instance_id}/admit$", drop_response=True)
    world.instance_tick()
    row = world.row(instance_id)
    assert row.phase == "VALIDATING"
    assert "unknown" in row.last_error
    step = TrinoPoolOperationStep.objects.get(
        operation_id=f"instance:{instance_id}", step_id="admit"
    )
    assert step.outcome == "unknown"
    _bring_to(world, instance_id, "SERVING", max_ticks=3)
    step.refresh_from_db()
    assert step.outcome == "ok"
    # Resolved by reading the Gateway's operation journal back, not by a second admit.
    assert len(_member_requests(world, instance_id, "admit")) == 1
    assert world.gateway.requests_to("GET", rf"/pools/{rg}/operations/instance%3A{instance_id}$")
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "ACTIVE"
    assert world.row(instance_id).last_error == ""


@pytest.mark.safeguard("trino-35")
def test_open_obligations_never_seal_and_the_wait_is_logged_once(
    world2: PoolWorld, caplog: pytest.LogCaptureFixture
) -> None:
    world = world2
    old, _other = _serve(world, 2)
    rg = world.routing_group()
    world.gateway.set_obligations(
        rg, old, pending_requests=0, open_transactions=1, active_queries=2, ready_to_seal=False
    )
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    caplog.set_level(logging.INFO, logger="duckgres.trino.operator")
    world.instance_tick(20)
    assert world.row(old).phase == "DRAINING"
    assert _member_requests(world, old, "seal") == []
    waits = [
        r
        for r in caplog.records
        if r.getMessage() == "Trino pool member is waiting." and r.instance == old  # type: ignore[attr-defined]
    ]
    assert len(waits) == 1
    wait = waits[0]
    assert (wait.reason, wait.open_transactions, wait.active_queries) == (  # type: ignore[attr-defined]
        "gateway_obligations",
        1,
        2,
    )
    world.gateway.set_obligations(rg, old, open_transactions=0, active_queries=0, drained=True)
    _bring_to(world, old, "SEALED", max_ticks=2)


def test_the_serving_floor_refusal_is_authoritative(world: PoolWorld) -> None:
    (only,) = _serve(world, 1)
    outcome = instances.drain(world.context(), world.row(only))
    assert "serving floor" in outcome
    assert world.row(only).phase == "SERVING"
    member = world.gateway.member(world.routing_group(), only)
    assert member is not None
    assert member["state"] == "ACTIVE"


def test_a_superseded_candidate_fails(world: PoolWorld) -> None:
    instance_id = _first_instance(world)
    _bring_to(world, instance_id, "PREPARING", max_ticks=3)
    world.put_desired(release_id="trino-476-r9", generation=5)
    _bring_to(world, instance_id, "FAILED_PREPARING", max_ticks=2)
    assert world.row(instance_id).failure_reason == instances.SUPERSEDED


@pytest.mark.safeguard("trino-36")
def test_a_failing_phase_cas_logs_neither_advanced_nor_retired(
    world2: PoolWorld, caplog: pytest.LogCaptureFixture
) -> None:
    world = world2
    old, _other = _serve(world, 2)
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    _bring_to(world, old, "RETIRING", max_ticks=4)
    world.instance_tick()  # objects deleted; the pod remains
    assert world.instance_objects(old) == {}
    stale = [world.row(old)]
    # Another writer moves the row on; this term's snapshot still says RETIRING.
    TrinoPoolInstance.objects.filter(instance_id=old).update(phase="RETIRED")
    world.remove_pods(old)
    caplog.set_level(logging.INFO, logger="duckgres.trino.instances")
    caplog.clear()
    errors: list[BaseException] = []
    assert not instances.progress(world.context(), stale, errors)
    assert errors
    assert isinstance(errors[0], instances.PhaseChanged)
    messages = [r.getMessage() for r in caplog.records]
    assert ADVANCED not in messages
    assert RETIRED_LINE not in messages
    assert world.row(old).last_error.startswith("PhaseChanged")


@pytest.mark.safeguard("trino-36")
def test_a_failing_create_cas_logs_no_advanced_line(
    world: PoolWorld, caplog: pytest.LogCaptureFixture
) -> None:
    world.run_until(lambda: bool(world.rows()), max_ticks=2)
    stale = world.rows()
    (row,) = stale
    TrinoPoolInstance.objects.filter(instance_id=row.instance_id).update(phase="FAILED_PREPARING")
    caplog.set_level(logging.INFO, logger="duckgres.trino.instances")
    caplog.clear()
    errors: list[BaseException] = []
    instances.progress(world.context(), stale, errors)
    assert errors
    assert isinstance(errors[0], instances.PhaseChanged)
    assert ADVANCED not in [r.getMessage() for r in caplog.records]
    # And a committed one does log (the check above is not vacuous).
    TrinoPoolInstance.objects.filter(instance_id=row.instance_id).update(phase="PENDING")
    caplog.clear()
    world.instance_tick()
    assert world.row(row.instance_id).phase == "CREATING"
    assert ADVANCED in [r.getMessage() for r in caplog.records]


def test_a_failing_instance_is_recorded_and_the_sweep_moves_on(world2: PoolWorld) -> None:
    world = world2
    first, second = _serve(world, 2)
    ordered = sorted([first, second])
    # The lower id's coordinator dies; its suspect claim is refused once by the Gateway.
    world.terminate_coordinator(ordered[0])
    world.terminate_coordinator(ordered[1])
    world.gateway.fail_next(
        "POST", rf"/members/{ordered[0]}/suspect$", refuse="POOL_EVIDENCE_REQUIRED"
    )
    world.instance_tick()
    assert world.row(ordered[0]).phase == "SERVING"
    assert "POOL_EVIDENCE_REQUIRED" in world.row(ordered[0]).last_error
    assert world.row(ordered[1]).phase == "SUSPECT"
    assert world.last_errors
    assert type(world.last_errors[0]).__name__ == "GatewayRefused"


def test_the_operators_real_tick_drives_an_instance_to_serving(world: PoolWorld) -> None:
    def tick_until(predicate: Any, max_ticks: int) -> None:
        for _ in range(max_ticks):
            if predicate():
                return
            report = world.tick()[0]
            assert report.leader
        assert predicate(), world.phases()

    tick_until(lambda: world.rows() and world.rows()[0].phase == "CREATING", 3)
    (row,) = world.rows()
    world.make_ready(row.instance_id)
    tick_until(lambda: world.row(row.instance_id).phase == "SERVING", 20)


def test_a_suspect_without_evidence_is_drained_never_served_again(world: PoolWorld) -> None:
    (instance_id,) = _serve(world, 1)
    world.terminate_coordinator(instance_id)
    world.instance_tick()
    assert world.row(instance_id).phase == "SUSPECT"
    world.remove_pods(instance_id)  # the registered pod vanished: the evidence is gone
    world.instance_tick()
    assert world.row(instance_id).phase == "DRAINING"
    member = world.gateway.member(world.routing_group(), instance_id)
    assert member is not None
    assert member["state"] == "DRAINING"


def test_two_pools_each_create_their_own_instance(
    kube_api: Any, gateway: Any, tmp_path: Any, settings: Any
) -> None:
    both = make_world(kube_api, gateway, tmp_path, settings, pools=("pool-a", "pool-b"))
    try:
        both.tick(2)
        a, b = both.rows("pool-a"), both.rows("pool-b")
        assert [r.phase for r in a] == ["CREATING"]
        assert [r.phase for r in b] == ["CREATING"]
        assert both.pool_of(b[0].instance_id) == "pool-b"
        assert both.instance_objects(b[0].instance_id)["Service"] == [b[0].instance_id]
    finally:
        both.operator.end_all_terms("test teardown")
        both.close()
        trino_config.install_for_tests(None)


def test_the_real_tick_with_the_catalog_writer_enabled(
    kube_api: Any, gateway: Any, tmp_path: Any, settings: Any, catalog_store: Any
) -> None:
    with_writer = make_world(kube_api, gateway, tmp_path, settings, catalog_store=catalog_store)
    try:
        reports = with_writer.tick(2)
        assert reports[-1].pools == {"pool-a": "progressed"}
        assert [r.phase for r in with_writer.rows()] == ["CREATING"]
    finally:
        with_writer.operator.end_all_terms("test teardown")
        with_writer.close()
        trino_config.install_for_tests(None)


def test_admit_refusals_barrier_then_not_certified_are_retried(world: PoolWorld) -> None:
    instance_id = _first_instance(world)
    _bring_to(world, instance_id, "VALIDATING")
    admit = rf"/members/{instance_id}/admit$"
    world.gateway.fail_next("POST", admit, refuse="POOL_PUBLICATION_BARRIER")
    world.instance_tick()
    assert world.row(instance_id).phase == "VALIDATING"  # barrier released, admit retried later
    world.gateway.fail_next("POST", admit, refuse="POOL_NOT_CERTIFIED")
    world.instance_tick()
    row = world.row(instance_id)
    assert row.phase == "PREPARING"  # a fresh validation pass, then a new admit
    assert row.validation_receipt is None
    _bring_to(world, instance_id, "SERVING")
    assert len(_member_requests(world, instance_id, "admit")) == 3


def test_a_stale_generation_on_seal_refreshes_the_recorded_generation(world2: PoolWorld) -> None:
    world = world2
    old, _other = _serve(world, 2)
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    world.gateway.fail_next("POST", rf"/members/{old}/seal$", refuse="POOL_STALE_GENERATION")
    world.instance_tick()
    assert world.row(old).phase == "DRAINING"
    _bring_to(world, old, "SEALED", max_ticks=2)
    seals = _member_requests(world, old, "seal")
    assert len(seals) == 2
    assert seals[0]["expectedGeneration"] == seals[1]["expectedGeneration"]


# --- review fixes: evidence, one step per tick, fail-closed cleanup, journalled deletes ---------


def _patch_coordinator_status(world: PoolWorld, instance_id: str, **fields: Any) -> str:
    """Set fields of the coordinator pod's ``trino`` container status; returns its old id."""
    from kubernetes import client

    core = client.CoreV1Api(world.kube.api_client)
    (pod,) = [
        p
        for p in world.instance_pods(instance_id)
        if p["metadata"]["name"].startswith(f"{instance_id}-coordinator-")
    ]
    statuses = pod["status"]["containerStatuses"]
    old_id = str(statuses[0]["containerID"])
    statuses[0].update(fields)
    core.patch_namespaced_pod_status(
        pod["metadata"]["name"], world.namespace, {"status": {"containerStatuses": statuses}}
    )
    return old_id


def test_an_earlier_containers_last_state_is_not_termination_evidence(world: PoolWorld) -> None:
    instance_id = _first_instance(world)
    # The coordinator crashed once while starting: its pod reports that earlier container in
    # lastState, and the container running now is the one that registers and passes validation.
    _patch_coordinator_status(
        world,
        instance_id,
        restartCount=1,
        lastState={
            "terminated": {
                "containerID": "containerd://crashed-during-startup",
                "exitCode": 1,
                "reason": "Error",
                "finishedAt": "2026-01-01T00:00:00Z",
            }
        },
    )
    _bring_to(world, instance_id, "SERVING")
    registered = world.row(instance_id).coordinator_container_id
    assert registered
    assert registered != "containerd://crashed-during-startup"
    world.instance_tick(3)
    assert world.row(instance_id).phase == "SERVING"
    assert _member_requests(world, instance_id, "suspect") == []
    # The registered container itself dies and is restarted: that is evidence.
    _patch_coordinator_status(
        world,
        instance_id,
        restartCount=2,
        containerID="containerd://restarted-after-registration",
        state={"running": {"startedAt": "2026-01-01T00:10:00Z"}},
        lastState={
            "terminated": {
                "containerID": registered,
                "exitCode": 137,
                "reason": "OOMKilled",
                "finishedAt": "2026-01-01T00:09:59Z",
            }
        },
    )
    world.instance_tick()
    assert world.row(instance_id).phase == "SUSPECT"
    (suspect,) = _member_requests(world, instance_id, "suspect")
    assert "registered coordinator container terminated" in suspect["evidence"]["observation"]
    assert "OOMKilled" in suspect["evidence"]["observation"]


def test_a_replaced_registered_container_is_termination_evidence(world: PoolWorld) -> None:
    (instance_id,) = _serve(world, 1)
    # The registered container was replaced (its lastState already rotated out): evidence.
    _patch_coordinator_status(
        world, instance_id, restartCount=3, containerID="containerd://a-later-container"
    )
    world.instance_tick()
    assert world.row(instance_id).phase == "SUSPECT"
    (suspect,) = _member_requests(world, instance_id, "suspect")
    assert "replaced" in suspect["evidence"]["observation"]


def _to_retiring(world: PoolWorld) -> str:
    old, _other = _serve(world, 2)
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    for _ in range(2):  # seal, then the retire claim: each tick's one step
        assert world.instance_tick() == ["progressed"]
    assert world.row(old).phase == "RETIRING"
    return old


def test_issued_deletes_are_the_ticks_one_instance_step_and_are_journalled_first(
    world2: PoolWorld,
) -> None:
    world = world2
    old = _to_retiring(world)
    # Serving (1) < desired (2): without a step this tick the planner would create a repair.
    assert len(world.rows()) == 2
    assert world.instance_tick() == ["progressed"]
    assert world.instance_objects(old) == {}  # the DELETEs went out this tick …
    assert len(world.rows()) == 2  # … and nothing else happened in it
    assert world.row(old).phase == "RETIRING"  # its pod is still there
    row = world.row(old)
    step = TrinoPoolOperationStep.objects.get(operation_id=f"instance:{old}", step_id="k8s.delete")
    assert step.outcome == "ok"
    body = json.loads(step.payload)
    assert body["operationId"] == f"instance:{old}"
    recorded = {
        (name, uid)
        for name, uid in (
            (row.service_name, row.service_uid),
            (row.coordinator_deployment_name, row.coordinator_deployment_uid),
            (row.worker_deployment_name, row.worker_deployment_uid),
            (row.config_map_name, row.config_map_uid),
            (row.worker_config_map_name, row.worker_config_map_uid),
        )
    }
    assert {(name, uid) for _kind, name, uid in body["objects"]} == recorded
    assert all(uid for _kind, _name, uid in body["objects"])
    # The pod goes away: the settled step is not repeated and the instance retires.
    world.remove_pods(old)
    _bring_to(world, old, "RETIRED", max_ticks=1)


def test_a_refused_seal_is_the_ticks_one_instance_step(world2: PoolWorld) -> None:
    world = world2
    old, _other = _serve(world, 2)
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    assert len(world.rows()) == 2
    world.gateway.fail_next("POST", rf"/members/{old}/seal$", refuse="POOL_NOT_DRAINED")
    # Serving (1) < desired (2): a tick whose instance step sent nothing would create a repair.
    assert world.instance_tick() == ["progressed"]
    assert len(_member_requests(world, old, "seal")) == 1
    assert world.row(old).phase == "DRAINING"
    assert len(world.rows()) == 2


def test_an_unsettled_delete_step_is_resolved_by_read_back(
    world2: PoolWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = world2
    old = _to_retiring(world)
    world.instance_tick()  # the deletes
    world.remove_pods(old)
    # As if the process had died between the DELETEs and recording their outcome.
    TrinoPoolOperationStep.objects.filter(
        operation_id=f"instance:{old}", step_id="k8s.delete"
    ).update(outcome="unknown")
    calls: list[tuple[str, str]] = []
    real_delete = k8s.delete_object

    def spy(namespace: str, kind: str, name: str, uid: str, **kw: Any) -> bool:
        calls.append((kind, name))
        return real_delete(namespace, kind, name, uid, **kw)

    monkeypatch.setattr(k8s, "delete_object", spy)
    _bring_to(world, old, "RETIRED", max_ticks=1)
    assert calls == []  # GET by name and UID proved them absent: nothing re-sent
    step = TrinoPoolOperationStep.objects.get(operation_id=f"instance:{old}", step_id="k8s.delete")
    assert step.outcome == "ok"


def test_the_lease_is_rechecked_between_deletes(
    world2: PoolWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trino_pools.operator import LeadershipLost

    world = world2
    old = _to_retiring(world)
    calls: list[str] = []
    real_delete = k8s.delete_object

    def spy(namespace: str, kind: str, name: str, uid: str, **kw: Any) -> bool:
        calls.append(name)
        deleted = real_delete(namespace, kind, name, uid, **kw)
        if len(calls) == 2:  # another replica takes the lease now
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE duckgres_leases SET holder = 'another-replica', "
                    "expires_at = now() + interval '1 hour' WHERE name = 'trino'"
                )
        return deleted

    monkeypatch.setattr(k8s, "delete_object", spy)
    # The operator reuses a renewal younger than 1 s: a real takeover cannot happen that soon
    # (the row expires a full lease duration after the renewal). This test forces an immediate
    # takeover, so it turns the reuse off to check that a renewal runs before every DELETE.
    monkeypatch.setattr(operator_tick, "RENEW_MIN_INTERVAL_SECONDS", 0.0)
    ctx = world.context()
    with pytest.raises(LeadershipLost):
        instances.progress(ctx, [world.row(old)], [])
    assert len(calls) == 2
    step = TrinoPoolOperationStep.objects.get(operation_id=f"instance:{old}", step_id="k8s.delete")
    assert step.outcome == "unknown"
    # Leadership back: read-back finds recorded objects left, so the stored deletes are re-sent.
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE duckgres_leases SET holder = '', expires_at = '-infinity' WHERE name = 'trino'"
        )
    assert world.instance_tick() == ["progressed"]
    assert world.instance_objects(old) == {}
    step.refresh_from_db()
    assert step.outcome == "ok"


def _fail_in_db(instance_id: str) -> None:
    """Another path failed the candidate (as _fail_candidate would have, from any phase)."""
    TrinoPoolInstance.objects.filter(instance_id=instance_id).update(
        phase="FAILED_PREPARING", failure_reason="test: failed"
    )


def test_a_failed_candidate_with_an_unexpected_member_state_is_never_deleted(
    world: PoolWorld,
) -> None:
    (instance_id,) = _serve(world, 1)  # its Gateway member is ACTIVE
    _fail_in_db(instance_id)
    before = world.instance_objects(instance_id)
    world.instance_tick(2)
    row = world.row(instance_id)
    assert row.phase == "FAILED_PREPARING"
    assert "is ACTIVE" in row.last_error
    assert world.instance_objects(instance_id) == before
    assert not TrinoPoolOperationStep.objects.filter(
        operation_id=f"instance:{instance_id}", step_id="k8s.delete"
    ).exists()


def test_an_unsettled_registration_is_resolved_before_a_failed_candidate_is_deleted(
    world: PoolWorld,
) -> None:
    instance_id = _first_instance(world)
    rg = world.routing_group()
    world.gateway.fail_next("POST", rf"/pools/{rg}/members$", unavailable=True)
    world.instance_tick()
    step = TrinoPoolOperationStep.objects.get(
        operation_id=f"instance:{instance_id}", step_id="register"
    )
    assert step.outcome == "unknown"
    assert world.gateway.member(rg, instance_id) is None
    _fail_in_db(instance_id)
    before = world.instance_objects(instance_id)
    world.instance_tick()
    # The stored registration was resolved first (never received → re-sent byte for byte) …
    step.refresh_from_db()
    assert step.outcome == "ok"
    assert world.instance_objects(instance_id) == before  # … and nothing was deleted
    registers = _register_requests(world)
    assert len(registers) == 2
    assert registers[0] == registers[1]
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "PREPARING"
    # No orphan: the member is walked out, then the objects go and it is retired.
    world.instance_tick(3)
    assert world.instance_objects(instance_id) == {}
    world.remove_pods(instance_id)
    _bring_to(world, instance_id, "FAILURE_RETIRED", max_ticks=2)
    member = world.gateway.member(rg, instance_id)
    assert member is not None
    assert member["state"] == "RETIRED"


def test_the_create_step_journals_the_full_documents_and_a_newer_term_resends_them(
    world: PoolWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.run_until(lambda: bool(world.rows()), max_ticks=2)
    (row,) = world.rows()
    first_epoch = world.operator.terms[world.cell().stored_id].auth.epoch
    real_apply = k8s.apply_instance_object
    sent: list[dict[str, Any]] = []

    def lossy(namespace: str, doc: dict[str, Any], **kw: Any) -> dict[str, Any]:
        sent.append(json.loads(json.dumps(doc)))
        obj = real_apply(namespace, doc, **kw)
        if len(sent) == 1:
            raise k8s.KubeError("connection reset by peer (test)", 0)  # applied, answer lost
        return obj

    monkeypatch.setattr(k8s, "apply_instance_object", lossy)
    world.instance_tick()
    assert world.row(row.instance_id).phase == "PENDING"
    step = TrinoPoolOperationStep.objects.get(
        operation_id=f"instance:{row.instance_id}", step_id="k8s.create"
    )
    assert step.outcome == "unknown"
    stored = json.loads(step.payload)["objects"]
    assert len(stored) == 5
    assert stored[0] == sent[0]
    # A newer term: the stored documents are re-sent, not ones rebuilt with the new epoch.
    world.operator.end_term(world.cell().stored_id, reason="test: new term")
    world.instance_tick()
    assert world.operator.terms[world.cell().stored_id].auth.epoch > first_epoch
    assert world.row(row.instance_id).phase == "CREATING"
    assert sent[1:] == stored
    for kind in ("ConfigMap", "Service", "Deployment"):
        for obj in k8s.list_objects(
            world.namespace, kind, f"posthog.com/trino-instance={row.instance_id}"
        ):
            epoch = obj["metadata"]["annotations"]["posthog.com/trino-authority-epoch"]
            assert epoch == str(first_epoch)


# --- backend records are removed; departing instances are health-watched ------------------------


def _backend_names(world: PoolWorld) -> set[str]:
    """The Gateway's backend registry as the operator reads it (GET /gateway/backend/all)."""
    client = GatewayClient(world.gateway.url, world.gateway.token, allow_http=True)
    return {b.name for b in parse_backends(client.get(GatewayClient.BACKEND_ALL))}


def _backend_deletes(world: PoolWorld) -> list[tuple[str, Any]]:
    return [
        (r[2].get("content-type", "").split(";")[0], r[3])
        for r in world.gateway.requests_to("POST", r"/gateway/backend/modify/delete$")
    ]


def _step(instance_id: str, step_id: str) -> TrinoPoolOperationStep:
    return TrinoPoolOperationStep.objects.get(
        operation_id=f"instance:{instance_id}", step_id=step_id
    )


def test_a_retired_instance_leaves_no_backend_and_a_lost_delete_is_read_back(
    world2: PoolWorld,
) -> None:
    world = world2
    old = _to_retiring(world)
    other = next(r.instance_id for r in world.rows() if r.instance_id != old)
    rg = world.routing_group()
    name, other_name = f"{rg}-{old}", f"{rg}-{other}"
    assert {name, other_name} <= _backend_names(world)
    world.instance_tick()  # the deletes
    world.remove_pods(old)
    # The backend delete is applied but its answer is lost: the row must not go terminal yet.
    world.gateway.fail_next("POST", r"/gateway/backend/modify/delete$", drop_response=True)
    world.instance_tick()
    assert world.row(old).phase == "RETIRING"
    member = world.gateway.member(rg, old)
    assert member is not None
    assert member["state"] == "RETIRED"  # deleted only after the member is RETIRED
    assert _step(old, "backend.delete").outcome == "unknown"
    assert name not in _backend_names(world)
    # Settled by reading the registry back: no second delete, then the terminal CAS (a
    # replacement the planner creates meanwhile may take a tick first: lower ids go first).
    _bring_to(world, old, "RETIRED", max_ticks=3)
    step = _step(old, "backend.delete")
    assert step.outcome == "ok"
    assert json.loads(step.payload)["name"] == name
    assert _backend_deletes(world) == [("text/plain", name)]
    assert name not in _backend_names(world)
    # The serving instance's (active) record is untouched.
    assert other_name in _backend_names(world)
    backend = world.gateway.backend(other_name)
    assert backend is not None
    assert backend["active"]


def test_failure_retired_instances_leave_no_backend(world: PoolWorld) -> None:
    # A lost serving instance: LOST → FAILURE_RETIRED.
    (lost,) = _serve(world, 1)
    rg = world.routing_group()
    assert f"{rg}-{lost}" in _backend_names(world)
    world.terminate_coordinator(lost)
    _bring_to(world, lost, "LOST", max_ticks=3)
    world.instance_tick()  # failure receipt, then the deletes
    world.remove_pods(lost)
    _bring_to(world, lost, "FAILURE_RETIRED", max_ticks=4)
    assert f"{rg}-{lost}" not in _backend_names(world)
    assert _step(lost, "backend.delete").outcome == "ok"
    # A candidate whose registration the Gateway refused (never a member): its backend, added
    # before registration, goes as well.
    world.run_until(lambda: len(world.rows()) == 2, max_ticks=3)
    candidate = next(r.instance_id for r in world.rows() if r.instance_id != lost)
    _bring_to(world, candidate, "CREATING", max_ticks=3)
    world.make_ready(candidate)
    world.gateway.fail_next("POST", rf"/pools/{rg}/members$", refuse="POOL_VALIDATION")
    _bring_to(world, candidate, "FAILED_PREPARING", max_ticks=3)
    assert world.gateway.member(rg, candidate) is None
    assert f"{rg}-{candidate}" in _backend_names(world)
    world.instance_tick()  # the deletes
    world.remove_pods(candidate)
    _bring_to(world, candidate, "FAILURE_RETIRED", max_ticks=2)
    assert f"{rg}-{candidate}" not in _backend_names(world)
    assert [body for _ct, body in _backend_deletes(world)] == [
        f"{rg}-{lost}",
        f"{rg}-{candidate}",
    ]


def test_an_active_or_foreign_backend_record_is_never_deleted(world: PoolWorld) -> None:
    instance_id = _first_instance(world)
    rg = world.routing_group()
    name = f"{rg}-{instance_id}"
    world.gateway.fail_next("POST", rf"/pools/{rg}/members$", refuse="POOL_VALIDATION")
    _bring_to(world, instance_id, "FAILED_PREPARING", max_ticks=3)
    world.instance_tick()  # the deletes
    world.remove_pods(instance_id)
    original = world.gateway.backend(name)
    assert original is not None
    # Someone activated the record outside the protocol: never deleted, the row stays.
    with world.gateway._lock:
        world.gateway._backends[name]["active"] = True
    world.instance_tick(2)
    row = world.row(instance_id)
    assert row.phase == "FAILED_PREPARING"
    assert "is active; refusing to delete it" in row.last_error
    # A record under this name that points elsewhere is not this instance's either.
    with world.gateway._lock:
        world.gateway._backends[name].update(active=False, proxyTo="http://elsewhere:8080")
    world.instance_tick()
    row = world.row(instance_id)
    assert row.phase == "FAILED_PREPARING"
    assert "names another target" in row.last_error
    assert _backend_deletes(world) == []
    assert world.gateway.backend(name) is not None
    # Back to this instance's inactive record: deleted, then the terminal CAS.
    with world.gateway._lock:
        world.gateway._backends[name] = original
    _bring_to(world, instance_id, "FAILURE_RETIRED", max_ticks=1)
    assert name not in _backend_names(world)


def test_a_draining_instance_whose_coordinator_dies_goes_suspect_then_lost(
    world2: PoolWorld,
) -> None:
    world = world2
    old, _other = _serve(world, 2)
    rg = world.routing_group()
    world.gateway.set_obligations(
        rg, old, pending_requests=0, open_transactions=1, active_queries=2, ready_to_seal=False
    )
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    # Healthy, obligations open: it keeps waiting (no drain deadline) and claims nothing.
    world.instance_tick(5)
    assert world.row(old).phase == "DRAINING"
    assert _member_requests(world, old, "suspect") == []
    # The coordinator dies while draining: its obligations can never complete.
    world.terminate_coordinator(old)
    _bring_to(world, old, "SUSPECT", max_ticks=3)
    (suspect,) = _member_requests(world, old, "suspect")
    assert suspect["stepId"] == "suspect"
    assert "OOMKilled" in suspect["evidence"]["observation"]
    assert suspect["evidence"]["podUid"] == world.row(old).coordinator_pod_uid
    assert _member_requests(world, old, "seal") == []
    _bring_to(world, old, "LOST", max_ticks=3)
    member = world.gateway.member(rg, old)
    assert member is not None
    assert member["state"] == "LOST"
    # … and it is failure-retired, its backend record removed.
    world.run_until(lambda: world.instance_objects(old) == {}, max_ticks=4)
    world.remove_pods(old)
    _bring_to(world, old, "FAILURE_RETIRED", max_ticks=4)
    assert f"{rg}-{old}" not in _backend_names(world)


def test_a_sealed_instance_whose_coordinator_dies_goes_suspect(world2: PoolWorld) -> None:
    world = world2
    old, _other = _serve(world, 2)
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    assert world.instance_tick() == ["progressed"]  # the seal
    assert world.row(old).phase == "SEALED"
    world.terminate_coordinator(old)
    world.instance_tick()
    assert world.row(old).phase == "SUSPECT"  # not RETIRING: no retire claim was made
    assert _member_requests(world, old, "retire") == []
    (suspect,) = _member_requests(world, old, "suspect")
    assert "OOMKilled" in suspect["evidence"]["observation"]


def test_a_departing_suspect_whose_evidence_vanishes_is_drained_again_and_retired(
    world2: PoolWorld,
) -> None:
    world = world2
    old, _other = _serve(world, 2)
    rg = world.routing_group()
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    world.gateway.set_obligations(rg, old, open_transactions=1, ready_to_seal=False)
    world.instance_tick()
    assert world.row(old).phase == "DRAINING"
    world.terminate_coordinator(old)
    _bring_to(world, old, "SUSPECT", max_ticks=3)
    world.remove_pods(old)  # the registered pod vanished: the evidence is gone
    world.gateway.set_obligations(rg, old, open_transactions=0, ready_to_seal=True)
    _bring_to(world, old, "DRAINING", max_ticks=3)
    member = world.gateway.member(rg, old)
    assert member is not None
    assert member["state"] == "DRAINING"  # a real second drain, not a replay of the first
    drains = _member_requests(world, old, "drain")
    suspected = _step(old, "suspect").result
    assert isinstance(suspected, dict)
    assert [d["stepId"] for d in drains] == ["drain", f"drain.g{suspected['generation']}"]
    _bring_to(world, old, "RETIRING", max_ticks=4)
    _bring_to(world, old, "RETIRED", max_ticks=3)
    assert f"{rg}-{old}" not in _backend_names(world)


def test_an_applied_suspect_claim_whose_cas_was_lost_is_completed_without_evidence(
    world2: PoolWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = world2
    old, _other = _serve(world, 2)
    rg = world.routing_group()
    world.gateway.set_obligations(rg, old, open_transactions=1, ready_to_seal=False)
    assert instances.drain(world.context(), world.row(old)).startswith("draining")
    world.terminate_coordinator(old)
    real_advance = instances.advance

    def crash_before_cas(ctx: Any, row: Any, to: str, **fields: Any) -> None:
        if to == "SUSPECT":
            raise RuntimeError("test: the process died after the claim, before its CAS")
        real_advance(ctx, row, to, **fields)

    monkeypatch.setattr(instance_base, "advance", crash_before_cas)
    world.instance_tick()
    monkeypatch.setattr(instance_base, "advance", real_advance)
    assert world.row(old).phase == "DRAINING"
    member = world.gateway.member(rg, old)
    assert member is not None
    assert member["state"] == "SUSPECT"
    assert _step(old, "suspect").outcome == "ok"
    # The evidence vanishes before the next tick: the applied claim is still completed.
    world.remove_pods(old)
    _bring_to(world, old, "SUSPECT", max_ticks=3)
    assert len(_member_requests(world, old, "suspect")) == 1
    # … and, without evidence, the suspect is drained again and retired normally.
    world.gateway.set_obligations(rg, old, open_transactions=0, ready_to_seal=True)
    _bring_to(world, old, "RETIRING", max_ticks=6)
