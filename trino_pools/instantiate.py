"""Kubernetes objects of one pool instance (spec trino-pools §4.13, invariant 6).

Per instance ``X`` (namespace = the snapshot's namespace): Service ``X``, Deployments
``X-coordinator`` (1 replica) and ``X-worker``, ConfigMaps ``X-coordinator-config`` and
``X-worker-config``.

Invariants:

- **Built only from the instance's own snapshot.** ``instance_objects`` takes the blueprint
  stored on the instance row (re-validated here) plus the epoch; nothing is read from the
  current desired configuration, so later blueprints never change an existing instance.
  The snapshot is either ``snapshot_for(blueprint, cell)`` (blueprint plus the two cell
  values the objects need, ``coordinator_service_port`` and ``node_environment``), or a bare
  blueprint dict with those two passed as keyword arguments.
- **Identity is the operator's.** Every object carries ``posthog.com/trino-instance=X``,
  ``posthog.com/trino-pool=<public id>``, ``app.kubernetes.io/managed-by=duckgres-trino-pool``
  and the annotations spec digest, authority epoch and release id; pods also carry the
  blueprint's instance/component labels, which the Service and Deployment selectors use. The
  discovery URI, node environment and instance id env vars are injected into every container;
  the role's ConfigMap files are mounted file by file (``subPath``) at ``/etc/trino/<file>``
  in the main container; pod anti-affinity terms are narrowed to the instance.
- **Every name and UID is recorded** (``create_objects`` returns all five, the worker
  ConfigMap included) and **every delete carries a UID precondition** (``delete_objects``).
  Deletion only ever targets the five instance names of kinds Service/Deployment/ConfigMap;
  a recorded name that is not one of them, or an unrecorded object that is not labelled as
  this instance's, is refused — so pool-shared resources (blueprint ``shared_resources``)
  are never deleted. ``delete_objects`` reports True only when all five objects and every
  pod of the instance are verifiably absent (a terminating pod counts as present). Its parts
  ``delete_plan`` / ``issue_deletes`` / ``recorded_absent`` / ``objects_absent`` are what the
  operator uses separately: the DELETEs are one journalled step (spec §4.7), settled by
  read-back, and absence is checked on later ticks.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from duckgres_admin.lib import k8s
from trino_pools.blueprint import (
    CONFIG_MOUNT_PATH,
    CONFIG_VOLUME,
    EPOCH_ANNOTATION,
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POOL_LABEL,
    RELEASE_ANNOTATION,
    SPEC_DIGEST_ANNOTATION,
    Blueprint,
    canonical_json,
    validate_blueprint,
)
from trino_pools.registry import Cell

# inventory key (the TrinoPoolInstance column prefix) -> (kind, name suffix after X)
INVENTORY: dict[str, tuple[str, str]] = {
    "coordinator_deployment": ("Deployment", "-coordinator"),
    "worker_deployment": ("Deployment", "-worker"),
    "service": ("Service", ""),
    "config_map": ("ConfigMap", "-coordinator-config"),
    "worker_config_map": ("ConfigMap", "-worker-config"),
}
Inventory = Mapping[str, tuple[str, str]]


class InstanceSpecError(ValueError):
    """The stored snapshot cannot produce objects (e.g. missing cell values)."""


def snapshot_for(blueprint: Blueprint, cell: Cell) -> dict[str, Any]:
    """What to store in ``TrinoPoolInstance.blueprint_snapshot`` when creating an instance.

    ``namespace`` is a copy of the blueprint's, for readers that only need the namespace.
    """
    return {
        "blueprint": copy.deepcopy(dict(blueprint.raw)),
        "namespace": blueprint.namespace,
        "coordinator_service_port": cell.pool.coordinator_service_port,
        "node_environment": cell.pool.node_environment,
    }


def snapshot_blueprint(snapshot: Mapping[str, Any]) -> Blueprint:
    """The validated blueprint of a stored snapshot (either snapshot form)."""
    raw = snapshot.get("blueprint", snapshot)
    if not isinstance(raw, Mapping):
        raise InstanceSpecError("the instance snapshot holds no blueprint")
    namespace = raw.get("namespace")
    return validate_blueprint(
        dict(raw), source="instance snapshot", cell_namespace=str(namespace or "")
    )


def spec_digest(blueprint_digest: str, instance_id: str) -> str:
    """SHA-256 (hex) of {blueprint digest, identity} (canonical JSON)."""
    body = canonical_json({"blueprint_digest": blueprint_digest, "instance_id": instance_id})
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def service_host(instance_id: str, namespace: str) -> str:
    return f"{instance_id}.{namespace}.svc.cluster.local"


def endpoint_url(instance_id: str, namespace: str, port: int) -> str:
    """The probe endpoint (plain HTTP: TLS terminates at the Gateway)."""
    return f"http://{service_host(instance_id, namespace)}:{port}"


def discovery_uri(instance_id: str, namespace: str, port: int) -> str:
    return f"https://{service_host(instance_id, namespace)}:{port}"


def backend_name(routing_group: str, instance_id: str) -> str:
    return f"{routing_group}-{instance_id}"


def object_name(instance_id: str, key: str) -> str:
    return f"{instance_id}{INVENTORY[key][1]}"


def _narrow(term: dict[str, Any], label: str, instance_id: str) -> None:
    selector = term.get("labelSelector")
    if isinstance(selector, dict):
        selector.setdefault("matchLabels", {})[label] = instance_id


def _pod_template(
    blueprint: Blueprint,
    role: str,
    instance_id: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    env: list[dict[str, str]],
) -> dict[str, Any]:
    identity = blueprint.identity
    template = copy.deepcopy(dict(blueprint.template(role)))
    metadata = template.setdefault("metadata", {})
    metadata["labels"] = {
        **(metadata.get("labels") or {}),
        **labels,
        identity.instance_label: instance_id,
        identity.component_label: role,
    }
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    spec = template["spec"]
    spec["serviceAccountName"] = blueprint.service_account_name
    for container in spec["containers"]:
        container["env"] = [dict(item) for item in env] + list(container.get("env") or [])
        if container["name"] == identity.main_container(role):
            mounts = list(container.get("volumeMounts") or [])
            for name in sorted(blueprint.config_files[role]):
                mounts.append(
                    {
                        "name": CONFIG_VOLUME,
                        "mountPath": f"{CONFIG_MOUNT_PATH}/{name}",
                        "subPath": name,
                        "readOnly": True,
                    }
                )
            container["volumeMounts"] = mounts
    volumes = list(spec.get("volumes") or [])
    volumes.append({"name": CONFIG_VOLUME, "configMap": {"name": f"{instance_id}-{role}-config"}})
    spec["volumes"] = volumes
    affinity = spec.setdefault("affinity", {})
    anti = affinity.get("podAntiAffinity")
    if anti:
        for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            _narrow(term, identity.instance_label, instance_id)
        for weighted in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
            _narrow(weighted.get("podAffinityTerm") or {}, identity.instance_label, instance_id)
    else:
        affinity["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {identity.instance_label: instance_id}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    return template


def _cell_values(
    snapshot: Mapping[str, Any], coordinator_service_port: int | None, node_environment: str | None
) -> tuple[int, str]:
    """The coordinator Service port and node environment, from the snapshot or the keywords."""
    port = snapshot.get("coordinator_service_port", coordinator_service_port)
    node_env = snapshot.get("node_environment", node_environment)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InstanceSpecError(
            "the instance snapshot has no coordinator_service_port; store snapshot_for(...)"
        )
    if not isinstance(node_env, str) or not node_env:
        raise InstanceSpecError(
            "the instance snapshot has no node_environment; store snapshot_for(...)"
        )
    return port, node_env


def _injected_env(
    blueprint: Blueprint, instance_id: str, port: int, node_env: str
) -> list[dict[str, str]]:
    """The discovery URI, node environment and instance id variables of every container."""
    identity = blueprint.identity
    uri = discovery_uri(instance_id, blueprint.namespace, port)
    return [
        {"name": identity.discovery_uri_env, "value": uri},
        {"name": identity.node_environment_env, "value": node_env},
        {"name": identity.instance_id_env, "value": instance_id},
    ]


def _service_object(
    metadata: dict[str, Any], blueprint: Blueprint, instance_id: str, port: int
) -> dict[str, Any]:
    """The instance's ClusterIP Service, selecting its coordinator pod's HTTP port."""
    identity = blueprint.identity
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": {
                identity.instance_label: instance_id,
                identity.component_label: "coordinator",
            },
            "ports": [
                {
                    "name": identity.coordinator_http_port_name,
                    "port": port,
                    "targetPort": identity.coordinator_http_port_name,
                    "protocol": "TCP",
                }
            ],
        },
    }


def _deployment_object(
    metadata: dict[str, Any], selector: dict[str, str], replicas: int, template: dict[str, Any]
) -> dict[str, Any]:
    """One role's Deployment (``Recreate`` strategy) of the given pod template."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }


def instance_objects(
    instance_id: str,
    pool_public_id: str,
    routing_group: str,
    snapshot: Mapping[str, Any],
    epoch: int,
    *,
    coordinator_service_port: int | None = None,
    node_environment: str | None = None,
) -> list[dict[str, Any]]:
    """The five objects of instance ``instance_id``, in creation order (ConfigMaps first).

    ``routing_group`` is accepted for symmetry with ``backend_name``; no object embeds it.
    """
    del routing_group
    blueprint = snapshot_blueprint(snapshot)
    port, node_env = _cell_values(snapshot, coordinator_service_port, node_environment)
    identity = blueprint.identity
    labels = {
        INSTANCE_LABEL: instance_id,
        POOL_LABEL: pool_public_id,
        MANAGED_BY_LABEL: MANAGED_BY,
    }
    annotations = {
        SPEC_DIGEST_ANNOTATION: spec_digest(blueprint.digest, instance_id),
        EPOCH_ANNOTATION: str(epoch),
        RELEASE_ANNOTATION: blueprint.release_id,
    }
    env = _injected_env(blueprint, instance_id, port, node_env)

    def metadata(name: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": blueprint.namespace,
            "labels": {**labels, **(extra or {})},
            "annotations": dict(annotations),
        }

    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(f"{instance_id}-{role}-config"),
            "data": dict(blueprint.config_files[role]),
        }
        for role in ("coordinator", "worker")
    ]
    docs.append(_service_object(metadata(instance_id), blueprint, instance_id, port))
    for role in ("coordinator", "worker"):
        selector = {identity.instance_label: instance_id, identity.component_label: role}
        docs.append(
            _deployment_object(
                metadata(f"{instance_id}-{role}", selector),
                selector,
                1 if role == "coordinator" else blueprint.worker_replicas,
                _pod_template(blueprint, role, instance_id, labels, annotations, env),
            )
        )
    return docs


def _inventory_key(doc: Mapping[str, Any]) -> str:
    kind = doc.get("kind")
    name = str((doc.get("metadata") or {}).get("name", ""))
    instance_id = str(((doc.get("metadata") or {}).get("labels") or {}).get(INSTANCE_LABEL, ""))
    for key, (key_kind, suffix) in INVENTORY.items():
        if kind == key_kind and name == f"{instance_id}{suffix}":
            return key
    raise InstanceSpecError(f"{kind} {name} is not an instance object")


def create_objects(namespace: str, docs: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Create (or adopt after a lost response) the instance objects; returns key -> (name, uid).

    Keys are the ``TrinoPoolInstance`` column prefixes: ``config_map`` (coordinator),
    ``worker_config_map``, ``service``, ``coordinator_deployment``, ``worker_deployment``.
    An existing object with the same name is adopted only when it carries this instance's
    labels and the same spec digest; otherwise ``KubeError`` (409).
    """
    result: dict[str, tuple[str, str]] = {}
    for doc in docs:
        key = _inventory_key(doc)
        obj = k8s.apply_instance_object(namespace, doc)
        meta = obj.get("metadata") or {}
        wanted = (doc["metadata"].get("annotations") or {}).get(SPEC_DIGEST_ANNOTATION)
        found = (meta.get("annotations") or {}).get(SPEC_DIGEST_ANNOTATION)
        if wanted != found:
            raise k8s.KubeError(
                f"{doc['kind']} {meta.get('name')} in namespace {namespace} exists with another "
                "spec digest; refusing to adopt it",
                409,
            )
        result[key] = (str(meta.get("name", "")), str(meta.get("uid", "")))
    missing = set(INVENTORY) - set(result)
    if missing:
        raise InstanceSpecError(f"instance objects missing from the request: {sorted(missing)}")
    return result


def _instance_id_of(inventory: Inventory) -> str:
    for key, (_, suffix) in INVENTORY.items():
        name = (inventory.get(key) or ("", ""))[0]
        if name and (not suffix or name.endswith(suffix)):
            return name[: len(name) - len(suffix)] if suffix else name
    return ""


def _ours(obj: Mapping[str, Any], instance_id: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(
        labels.get(INSTANCE_LABEL) == instance_id and labels.get(MANAGED_BY_LABEL) == MANAGED_BY
    )


DeletePlan = list[tuple[str, str, str]]  # (kind, name, recorded uid or "")


def delete_plan(inventory: Inventory, *, instance_id: str = "") -> DeletePlan:
    """The five ``(kind, name, uid)`` targets of an instance's deletion, in inventory order.

    A recorded name must be the instance's own name for that key (else ``InstanceSpecError``:
    nothing is deleted); an unrecorded entry keeps its expected name with uid ``""``.
    """
    instance_id = instance_id or _instance_id_of(inventory)
    if not instance_id:
        raise InstanceSpecError("cannot tell which instance the inventory belongs to")
    plan: DeletePlan = []
    for key, (kind, _) in INVENTORY.items():
        expected = object_name(instance_id, key)
        name, uid = inventory.get(key) or ("", "")
        if name and name != expected:
            raise InstanceSpecError(
                f"refusing to delete {kind} {name!r}: instance {instance_id}'s {key} is "
                f"{expected!r} (pool-shared and foreign objects are never deleted)"
            )
        plan.append((kind, expected, uid))
    return plan


def _check_plan(plan: DeletePlan, instance_id: str) -> None:
    allowed = {(INVENTORY[key][0], object_name(instance_id, key)) for key in INVENTORY}
    for kind, name, _ in plan:
        if (kind, name) not in allowed:
            raise InstanceSpecError(
                f"refusing to delete {kind} {name!r}: not one of instance {instance_id}'s objects "
                "(pool-shared and foreign objects are never deleted)"
            )


def issue_deletes(
    namespace: str,
    plan: DeletePlan,
    instance_id: str,
    *,
    before_each: Callable[[], None] | None = None,
) -> list[str]:
    """UID-preconditioned DELETEs of ``plan`` (only this instance's five names, ever).

    An entry without a recorded UID (a lost create response) is deleted only if the object
    carries this instance's labels, pinned to the UID just read. ``before_each`` runs before
    every DELETE (the operator re-checks its lease there). A UID precondition failure raises
    ``KubeError`` (409). Returns the ``kind/name`` of every DELETE that found its object.
    """
    _check_plan(plan, instance_id)
    deleted: list[str] = []
    for kind, name, recorded_uid in plan:
        uid = recorded_uid
        if not uid:
            existing = k8s.read_object(namespace, kind, name)
            if existing is None:
                continue
            if not _ours(existing, instance_id):
                raise k8s.KubeError(
                    f"refusing to delete {kind} {name} in namespace {namespace}: it is not "
                    f"labelled as instance {instance_id}'s",
                    409,
                )
            uid = str((existing.get("metadata") or {}).get("uid", ""))
        if before_each is not None:
            before_each()
        if k8s.delete_object(namespace, kind, name, uid):
            deleted.append(f"{kind}/{name}")
    return deleted


def recorded_absent(namespace: str, plan: DeletePlan) -> bool:
    """Kubernetes GET by name and UID: True when no object of ``plan`` still exists.

    An entry with a recorded UID is absent when its name is free or now holds another object
    (another UID is not the recorded object); an entry without one is absent when its name is
    free. Used to settle an unsettled delete step by read-back (spec §4.7).
    """
    for kind, name, uid in plan:
        found = k8s.read_object(namespace, kind, name)
        if found is None:
            continue
        if uid and str((found.get("metadata") or {}).get("uid", "")) != uid:
            continue
        return False
    return True


def objects_absent(namespace: str, plan: DeletePlan, instance_id: str) -> bool:
    """True only when all five names are free and no pod of the instance exists.

    A terminating object or pod counts as present ("verifiably absent").
    """
    for kind, name, _ in plan:
        if k8s.read_object(namespace, kind, name) is not None:
            return False
    pods = k8s.list_pods(namespace, f"{INSTANCE_LABEL}={instance_id}")
    return not pods


def delete_objects(namespace: str, inventory: Inventory, *, instance_id: str = "") -> bool:
    """Delete the instance's five objects with UID preconditions; True when all are gone.

    ``delete_plan`` + ``issue_deletes`` + ``objects_absent`` in one call (the operator journals
    the deletes between the first two and checks absence on a later tick: see
    ``trino_pools.operator.instances.teardown``). Returns True only when all five objects and
    every pod labelled with the instance are absent; a terminating object or pod counts as
    present.
    """
    instance_id = instance_id or _instance_id_of(inventory)
    plan = delete_plan(inventory, instance_id=instance_id)
    issue_deletes(namespace, plan, instance_id)
    return objects_absent(namespace, plan, instance_id)


def _deployment(namespace: str, name: str) -> dict[str, Any]:
    obj = k8s.read_object(namespace, "Deployment", name)
    if obj is None:
        raise k8s.KubeError(f"deployments/{name} in namespace {namespace} not found (404)", 404)
    return obj


def workers_ready(namespace: str, instance_id: str) -> tuple[bool, int, int]:
    """(coordinator ready?, ready workers, desired workers) from the Deployments' status.

    A missing Deployment raises ``KubeError`` (404).
    """
    coordinator = _deployment(namespace, f"{instance_id}-coordinator")
    worker = _deployment(namespace, f"{instance_id}-worker")
    coordinator_ready = int((coordinator.get("status") or {}).get("readyReplicas") or 0) >= 1
    ready = int((worker.get("status") or {}).get("readyReplicas") or 0)
    desired = int((worker.get("spec") or {}).get("replicas") or 0)
    return coordinator_ready, ready, desired
