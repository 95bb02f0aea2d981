"""Instance objects on the real kube-apiserver (spec trino-pools §4.13, invariant 6; safeguard 23).

There is no controller-manager or kubelet: Deployments never get ReplicaSets or pods by
themselves, so tests create the instance's pods by hand and set Deployment status through the
status subresource.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from duckgres_admin.lib import k8s
from duckgres_admin.models.trino import TrinoPoolInstance
from tests.trino.blueprints import (
    IMAGE,
    put_config_map,
    set_deployment_ready,
    trino_kube_fixture,  # noqa: F401
    valid_blueprint,
)
from trino_pools import instantiate
from trino_pools.blueprint import parse_blueprint
from trino_pools.operator.instances import evidence
from trino_pools.registry import Cell, PoolSpec

pytestmark = pytest.mark.kube

X = "cell-0a1b2c3d"
EPOCH = 7
LABELS = {
    "posthog.com/trino-instance": X,
    "posthog.com/trino-pool": "pool-a",
    "app.kubernetes.io/managed-by": "duckgres-trino-pool",
}


def make_cell(namespace: str) -> Cell:
    return Cell(
        id="pool-a",
        namespace=namespace,
        routing_group="rg-a",
        client_url="https://pool-a.trino.example.com",
        host="pool-a.trino.example.com",
        port=443,
        pool=PoolSpec(3, 2, 1, 1, "/etc/duckgres/blueprints/pool-a.json", 8080, "production", True),
    )


def snapshot(namespace: str, **kwargs: Any) -> dict[str, Any]:
    text = json.dumps(valid_blueprint(namespace=namespace, **kwargs))
    blueprint = parse_blueprint(text, source="test", cell_namespace=namespace)
    return instantiate.snapshot_for(blueprint, make_cell(namespace))


def docs_for(namespace: str, instance_id: str = X, **kwargs: Any) -> list[dict[str, Any]]:
    return instantiate.instance_objects(
        instance_id, "pool-a", "rg-a", snapshot(namespace, **kwargs), EPOCH
    )


def everything(kube: Any, selector: str = "") -> dict[str, list[dict[str, Any]]]:
    """Every Service, Deployment, ConfigMap and Pod in the namespace (optionally by label)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in ("Service", "Deployment", "ConfigMap", "Pod"):
        items = k8s.list_objects(kube.namespace, kind, selector)
        found[kind] = sorted(items, key=lambda o: o["metadata"]["name"])
    return found


def names(found: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    return {kind: [o["metadata"]["name"] for o in items] for kind, items in found.items()}


def shared_resources(kube: Any) -> dict[str, str]:
    """The blueprint's pool-shared Secrets and ConfigMap; returns name -> uid."""
    from kubernetes import client

    uids = {}
    for name in ("trino-tenant-secrets", "trino-observer"):
        secret = kube.core.create_namespaced_secret(
            kube.namespace,
            client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"k": "v"}),
        )
        uids[name] = secret.metadata.uid
    put_config_map(kube.core, kube.namespace, "trino-catalog-defaults", {"a": "b"})
    cm = kube.core.read_namespaced_config_map("trino-catalog-defaults", kube.namespace)
    uids["trino-catalog-defaults"] = cm.metadata.uid
    return uids


def instance_pod(kube: Any, role: str, suffix: str = "abc12") -> dict[str, Any]:
    """A pod as the ReplicaSet controller would have made it (labels of the template)."""
    deployment = k8s.read_object(kube.namespace, "Deployment", f"{X}-{role}")
    assert deployment is not None
    template = deployment["spec"]["template"]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{X}-{role}-5d8f7-{suffix}",
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }
    return k8s.apply_instance_object(kube.namespace, body)


def test_names_urls_and_spec_digest():
    assert instantiate.endpoint_url(X, "trino-a", 8080) == (
        "http://cell-0a1b2c3d.trino-a.svc.cluster.local:8080"
    )
    assert instantiate.discovery_uri(X, "trino-a", 8080) == (
        "https://cell-0a1b2c3d.trino-a.svc.cluster.local:8080"
    )
    assert instantiate.backend_name("rg-a", X) == "rg-a-cell-0a1b2c3d"
    import hashlib

    expected = hashlib.sha256(
        b'{"blueprint_digest":"' + b"d" * 64 + b'","instance_id":"cell-0a1b2c3d"}'
    ).hexdigest()
    assert instantiate.spec_digest("d" * 64, X) == expected
    assert instantiate.spec_digest("d" * 64, "cell-ffffffff") != expected


def test_objects_come_from_the_snapshot_only():
    stored = snapshot("trino-a")
    first = instantiate.instance_objects(X, "pool-a", "rg-a", stored, EPOCH)
    # A later blueprint (new release) does not change what the stored snapshot builds.
    snapshot("trino-a", release_id="trino-477-r1", replicas=9)
    again = instantiate.instance_objects(X, "pool-a", "rg-a", copy.deepcopy(stored), EPOCH)
    assert again == first
    # A bare blueprint works when the two cell values are passed.
    bare = instantiate.instance_objects(
        X,
        "pool-a",
        "rg-a",
        stored["blueprint"],
        EPOCH,
        coordinator_service_port=8080,
        node_environment="production",
    )
    assert bare == first
    with pytest.raises(instantiate.InstanceSpecError, match="coordinator_service_port"):
        instantiate.instance_objects(X, "pool-a", "rg-a", stored["blueprint"], EPOCH)


def test_instance_creation_leaves_exactly_the_specified_objects(trino_kube):
    kube = trino_kube
    ns = kube.namespace
    stored = snapshot(ns)
    blueprint_digest = instantiate.snapshot_blueprint(stored).digest
    inventory = instantiate.create_objects(
        ns, instantiate.instance_objects(X, "pool-a", "rg-a", stored, EPOCH)
    )

    found = everything(kube, f"posthog.com/trino-instance={X}")
    assert names(found) == {
        "Service": [X],
        "Deployment": [f"{X}-coordinator", f"{X}-worker"],
        "ConfigMap": [f"{X}-coordinator-config", f"{X}-worker-config"],
        "Pod": [],
    }
    assert names(everything(kube)) == names(found)  # nothing else was created
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for items in found.values() for o in items}
    assert inventory == {
        "service": (X, uids[X]),
        "coordinator_deployment": (f"{X}-coordinator", uids[f"{X}-coordinator"]),
        "worker_deployment": (f"{X}-worker", uids[f"{X}-worker"]),
        "config_map": (f"{X}-coordinator-config", uids[f"{X}-coordinator-config"]),
        "worker_config_map": (f"{X}-worker-config", uids[f"{X}-worker-config"]),
    }

    annotations = {
        "posthog.com/trino-spec-digest": instantiate.spec_digest(blueprint_digest, X),
        "posthog.com/trino-authority-epoch": "7",
        "posthog.com/trino-release-id": "trino-476-r1",
    }
    for items in found.values():
        for obj in items:
            assert LABELS.items() <= obj["metadata"]["labels"].items()
            assert obj["metadata"]["annotations"] == annotations

    (service,) = found["Service"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {
        "trino.posthog.com/instance": X,
        "trino.posthog.com/component": "coordinator",
    }
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 8080, "http")
    ]

    coordinator_cm, worker_cm = found["ConfigMap"]
    bp = valid_blueprint(namespace=ns)
    assert coordinator_cm["data"] == bp["config_files"]["coordinator"]
    assert worker_cm["data"] == bp["config_files"]["worker"]

    discovery = f"https://{X}.{ns}.svc.cluster.local:8080"
    for deployment, role, replicas in zip(
        found["Deployment"], ("coordinator", "worker"), (1, 2), strict=True
    ):
        selector = {"trino.posthog.com/instance": X, "trino.posthog.com/component": role}
        spec = deployment["spec"]
        assert spec["replicas"] == replicas
        assert spec["strategy"] == {"type": "Recreate"}
        assert spec["selector"] == {"matchLabels": selector}
        assert deployment["metadata"]["labels"] == {**LABELS, **selector}
        template = spec["template"]
        assert template["metadata"]["labels"] == {
            "app.kubernetes.io/name": "trino",
            "team": "data",
            **LABELS,
            **selector,
        }
        assert template["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true",
            **annotations,
        }
        pod = template["spec"]
        assert pod["serviceAccountName"] == "trino"
        main, sidecar = pod["containers"]
        assert main["image"] == IMAGE
        for container in (main, sidecar):
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["TRINO_DISCOVERY_URI"] == discovery
            assert env["TRINO_NODE_ENVIRONMENT"] == "production"
            assert env["TRINO_INSTANCE_ID"] == X
        files = sorted(bp["config_files"][role])
        assert [m for m in main["volumeMounts"] if m["name"] == "trino-instance-config"] == [
            {
                "name": "trino-instance-config",
                "mountPath": f"/etc/trino/{name}",
                "subPath": name,
                "readOnly": True,
            }
            for name in files
        ]
        assert not any(
            m["name"] == "trino-instance-config" for m in sidecar.get("volumeMounts", [])
        )
        assert {"name": "trino-instance-config", "configMap": {"name": f"{X}-{role}-config"}} in [
            {k: ({"name": v["name"]} if k == "configMap" else v) for k, v in vol.items()}
            for vol in pod["volumes"]
        ]
        (term,) = pod["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["labelSelector"] == {
            "matchLabels": {"trino.posthog.com/instance": X}
        }


def test_template_anti_affinity_is_narrowed_to_the_instance():
    stored = snapshot("trino-a")
    stored["blueprint"]["worker"]["pod_template"]["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "trino"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    docs = instantiate.instance_objects(X, "pool-a", "rg-a", stored, EPOCH)
    worker = next(d for d in docs if d["metadata"]["name"] == f"{X}-worker")
    (term,) = worker["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "trino",
        "trino.posthog.com/instance": X,
    }


def test_create_is_replayable_and_never_adopts_a_foreign_object(trino_kube):
    kube = trino_kube
    docs = docs_for(kube.namespace)
    first = instantiate.create_objects(kube.namespace, docs)
    # A lost create response: the replay adopts exactly the same objects.
    assert instantiate.create_objects(kube.namespace, docs) == first
    # Another instance's spec under the same name (different digest) is refused.
    other = instantiate.instance_objects(
        X, "pool-a", "rg-a", snapshot(kube.namespace, release_id="trino-477-r1"), EPOCH
    )
    with pytest.raises(k8s.KubeError, match="another spec digest") as info:
        instantiate.create_objects(kube.namespace, other)
    assert info.value.status == 409
    # An unlabelled object with an instance name is refused, not adopted.
    put_config_map(kube.core, kube.namespace, "cell-99999999-coordinator-config", {"a": "b"})
    with pytest.raises(k8s.KubeError, match="not this instance's") as info:
        instantiate.create_objects(kube.namespace, docs_for(kube.namespace, "cell-99999999"))
    assert info.value.status == 409


@pytest.mark.safeguard("trino-23")
def test_retirement_deletes_exactly_the_recorded_objects_and_never_a_shared_resource(trino_kube):
    kube = trino_kube
    shared = shared_resources(kube)
    inventory = instantiate.create_objects(kube.namespace, docs_for(kube.namespace))
    # The worker ConfigMap is recorded with its UID like the other four.
    assert inventory["worker_config_map"][0] == f"{X}-worker-config"
    assert inventory["worker_config_map"][1]
    neighbour = instantiate.create_objects(
        kube.namespace, docs_for(kube.namespace, "cell-11111111")
    )

    assert instantiate.delete_objects(kube.namespace, inventory) is True

    assert names(everything(kube, f"posthog.com/trino-instance={X}")) == {
        "Service": [],
        "Deployment": [],
        "ConfigMap": [],
        "Pod": [],
    }
    for name, uid in shared.items():
        kind = "ConfigMap" if name == "trino-catalog-defaults" else None
        if kind:
            obj = k8s.read_object(kube.namespace, kind, name)
            assert obj is not None
            assert obj["metadata"]["uid"] == uid
        else:
            secret = kube.core.read_namespaced_secret(name, kube.namespace)
            assert secret.metadata.uid == uid
    # The other instance is untouched.
    for name, uid in neighbour.values():
        kind = instantiate.INVENTORY[next(k for k, v in neighbour.items() if v == (name, uid))][0]
        obj = k8s.read_object(kube.namespace, kind, name)
        assert obj is not None
        assert obj["metadata"]["uid"] == uid
    # Deleting again is a no-op that still reports "absent".
    assert instantiate.delete_objects(kube.namespace, inventory) is True


def test_a_forged_inventory_never_reaches_a_shared_resource(trino_kube):
    kube = trino_kube
    shared = shared_resources(kube)
    inventory = dict(instantiate.create_objects(kube.namespace, docs_for(kube.namespace)))
    inventory["worker_config_map"] = ("trino-catalog-defaults", shared["trino-catalog-defaults"])
    with pytest.raises(instantiate.InstanceSpecError, match="never deleted"):
        instantiate.delete_objects(kube.namespace, inventory)
    assert k8s.read_object(kube.namespace, "ConfigMap", "trino-catalog-defaults") is not None
    assert len(everything(kube, f"posthog.com/trino-instance={X}")["Deployment"]) == 2


def test_a_uid_mismatch_refuses_deletion(trino_kube):
    kube = trino_kube
    docs = docs_for(kube.namespace)
    inventory = instantiate.create_objects(kube.namespace, docs)
    # The worker ConfigMap is replaced by another object of the same name (new UID).
    kube.core.delete_namespaced_config_map(f"{X}-worker-config", kube.namespace)
    k8s.apply_instance_object(kube.namespace, docs[1])
    replacement = k8s.read_object(kube.namespace, "ConfigMap", f"{X}-worker-config")
    assert replacement is not None
    assert replacement["metadata"]["uid"] != inventory["worker_config_map"][1]

    with pytest.raises(k8s.KubeError, match="UID precondition") as info:
        instantiate.delete_objects(kube.namespace, inventory)
    assert info.value.status == 409
    still = k8s.read_object(kube.namespace, "ConfigMap", f"{X}-worker-config")
    assert still is not None
    assert still["metadata"]["uid"] == replacement["metadata"]["uid"]
    # The lib call alone: a wrong UID is a 409, a vanished object is False.
    with pytest.raises(k8s.KubeError) as info:
        k8s.delete_object(kube.namespace, "ConfigMap", f"{X}-worker-config", "not-the-uid")
    assert info.value.status == 409
    assert k8s.delete_object(kube.namespace, "ConfigMap", "cell-absent00-x", "uid") is False


def test_unrecorded_objects_are_deleted_only_when_labelled_as_the_instance(trino_kube):
    kube = trino_kube
    inventory = instantiate.create_objects(kube.namespace, docs_for(kube.namespace))
    partial = {k: (v if k != "service" else ("", "")) for k, v in inventory.items()}
    assert instantiate.delete_objects(kube.namespace, partial) is True
    assert k8s.read_object(kube.namespace, "Service", X) is None


def test_pods_of_the_instance_keep_deletion_unfinished_until_gone(trino_kube):
    kube = trino_kube
    inventory = instantiate.create_objects(kube.namespace, docs_for(kube.namespace))
    pod = instance_pod(kube, "worker")
    name = pod["metadata"]["name"]
    # Bound to a node, a default-grace delete leaves the pod terminating.
    kube.core.create_namespaced_pod_binding(
        name=name,
        namespace=kube.namespace,
        body={
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        },
        _preload_content=False,
    )
    assert instantiate.delete_objects(kube.namespace, inventory) is False
    kube.core.delete_namespaced_pod(name, kube.namespace)
    terminating = k8s.read_object(kube.namespace, "Pod", name)
    assert terminating is not None
    assert terminating["metadata"].get("deletionTimestamp")
    assert instantiate.delete_objects(kube.namespace, inventory) is False
    kube.core.delete_namespaced_pod(name, kube.namespace, grace_period_seconds=0)
    assert instantiate.delete_objects(kube.namespace, inventory) is True


def test_workers_ready_reads_both_deployments(trino_kube):
    kube = trino_kube
    instantiate.create_objects(kube.namespace, docs_for(kube.namespace, replicas=3))
    assert instantiate.workers_ready(kube.namespace, X) == (False, 0, 3)
    set_deployment_ready(kube.api_client, kube.namespace, f"{X}-worker", 2)
    assert instantiate.workers_ready(kube.namespace, X) == (False, 2, 3)
    set_deployment_ready(kube.api_client, kube.namespace, f"{X}-coordinator", 1)
    set_deployment_ready(kube.api_client, kube.namespace, f"{X}-worker", 3)
    assert instantiate.workers_ready(kube.namespace, X) == (True, 3, 3)
    with pytest.raises(k8s.KubeError) as info:
        instantiate.workers_ready(kube.namespace, "cell-00000000")
    assert info.value.status == 404


def test_coordinator_pod_identity(trino_kube):
    """The product's rule (``evidence.coordinator_pod``): the instance label and the identity
    binding's component label, terminating pods ignored until a pod is registered."""
    kube = trino_kube
    instantiate.create_objects(kube.namespace, docs_for(kube.namespace))
    row = TrinoPoolInstance(
        instance_id=X, blueprint_snapshot=snapshot(kube.namespace), coordinator_pod_uid=""
    )
    assert evidence.coordinator_pod(row) is None
    instance_pod(kube, "worker")
    pod = instance_pod(kube, "coordinator")
    name = pod["metadata"]["name"]
    kube.core.create_namespaced_pod_binding(
        name=name,
        namespace=kube.namespace,
        body={
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        },
        _preload_content=False,
    )
    statuses: list[dict[str, Any]] = [
        {
            "name": c,
            "image": IMAGE,
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "containerID": f"containerd://{c}-0123",
            "state": {"running": {}},
        }
        for c in ("trino", "jmx")
    ]
    kube.core.patch_namespaced_pod_status(
        name, kube.namespace, {"status": {"phase": "Running", "containerStatuses": statuses}}
    )
    found = evidence.coordinator_pod(row)
    assert found is not None
    assert {
        "pod_uid": found["metadata"]["uid"],
        "pod_name": found["metadata"]["name"],
        "node_name": found["spec"].get("nodeName", ""),
        "container_id": evidence.container_status(row, found).get("containerID", ""),
        "phase": found["status"].get("phase", ""),
    } == {
        "pod_uid": pod["metadata"]["uid"],
        "pod_name": name,
        "node_name": "n1",
        "container_id": "containerd://trino-0123",
        "phase": "Running",
    }
    kube.core.delete_namespaced_pod(name, kube.namespace)  # terminating: no longer the coordinator
    assert evidence.coordinator_pod(row) is None


def test_journalled_delete_parts(trino_kube):
    """The parts the operator journals separately (spec §4.7): plan, deletes, read-back."""
    kube = trino_kube
    docs = docs_for(kube.namespace)
    inventory = instantiate.create_objects(kube.namespace, docs)
    plan = instantiate.delete_plan(inventory, instance_id=X)
    assert {(name, uid) for _kind, name, uid in plan} == set(inventory.values())
    assert not instantiate.recorded_absent(kube.namespace, plan)
    # A forged plan entry (a pool-shared object) is refused before any DELETE.
    forged = [*plan[:4], ("ConfigMap", "trino-catalog-defaults", "uid")]
    with pytest.raises(instantiate.InstanceSpecError, match="never deleted"):
        instantiate.issue_deletes(kube.namespace, forged, X)
    assert instantiate.recorded_absent(kube.namespace, plan) is False
    seen: list[int] = []
    deleted = instantiate.issue_deletes(
        kube.namespace, plan, X, before_each=lambda: seen.append(len(seen))
    )
    assert len(deleted) == 5
    assert seen == [0, 1, 2, 3, 4]  # the hook ran before every DELETE
    assert instantiate.recorded_absent(kube.namespace, plan)
    assert instantiate.objects_absent(kube.namespace, plan, X)
    # Another object now holding a recorded name is not the recorded one: the recorded object
    # is absent (read-back), but the name is not free (absence for retirement).
    k8s.apply_instance_object(kube.namespace, docs[1])
    assert instantiate.recorded_absent(kube.namespace, plan)
    assert not instantiate.objects_absent(kube.namespace, plan, X)
