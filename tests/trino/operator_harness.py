"""A reusable world for operator-level Trino pool tests (spec trino-pools §4.4-§4.6, §8 preamble).

Real services everywhere except the Trino processes: the real kube-apiserver namespace of
``kube_api`` (no controllers: Deployment status and coordinator pods are set by hand here), the
Gateway double (``tests/trino/gateway_double.py``), one coordinator double per instance
(``tests/trino/coordinator_double.py``, reached through ``probes.CONNECT_OVERRIDES``), the real
config store and, optionally, a real catalog store.

    from tests.trino import gateway_double, operator_harness
    from tests.trino.operator_harness import PoolWorld

    gateway = gateway_double.gateway  # fixtures, found by name in the test module
    world = operator_harness.world

    def test_x(world: PoolWorld) -> None:       # one pool "pool-a", desired 1
        world.instance_tick(2)                    # create, then the Kubernetes objects
        (row,) = world.rows()
        world.make_ready(row.instance_id)         # Deployments ready + a running coordinator pod
        world.run_until(lambda: world.row(row.instance_id).phase == "SERVING")

``make_world(kube_api, gateway, tmp_path, settings, pools=("pool-a", "pool-b"),
desired_instances=…, catalog_store=…)`` builds other shapes (each further pool gets its own
namespace; ``catalog_store`` — the ``catalog_store`` fixture — is bootstrapped and enables the
catalog writer). ``tick()`` is the operator's real tick
(tenant admission included); ``instance_tick()`` is the same pool tick without tenant admission
(steps 1-7 and 9-11 of §4.4), for instance-lifecycle tests. Other helpers:
``set_deployment_ready``, ``create_coordinator_pod``, ``terminate_coordinator`` (termination
evidence), ``remove_pods`` (what the garbage collector would do), ``instance_objects``,
``rows``/``row``/``phases``, ``context()`` (a ``PoolContext`` of the live term) and
``last_errors`` (of the last ``instance_tick``).

Use with ``pytest.mark.django_db`` and ``pytest.mark.kube``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from duckgres_admin.lib import k8s
from duckgres_admin.models.trino import TrinoPool, TrinoPoolInstance
from tests.trino import blueprints, helpers
from tests.trino.coordinator_double import CoordinatorDouble
from tests.trino.gateway_double import GatewayDouble
from trino_pools import config
from trino_pools import operator as trino_operator
from trino_pools.authority import PoolConflict
from trino_pools.blueprint import INSTANCE_LABEL
from trino_pools.config import TrinoSettings
from trino_pools.desired import read_desired
from trino_pools.lease import TrinoLease
from trino_pools.operator import Operator, PoolContext
from trino_pools.registry import Cell, parse_registry

PREFIX = "duckgres-trino-pool"
OBSERVER = ("observer", "observer-password-never-logged")


def _expire_trino_lease() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE duckgres_leases SET expires_at = '-infinity', holder = '' WHERE name = 'trino'"
        )


@dataclass
class PoolWorld:
    kube: Any  # tests.fixtures.kube.KubeApi
    gateway: GatewayDouble
    settings: TrinoSettings
    operator: Operator
    tmp: Path
    blueprint_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    coordinators: dict[str, CoordinatorDouble] = field(default_factory=dict)
    registry_cells: list[dict[str, Any]] = field(default_factory=list)
    last_errors: list[BaseException] = field(default_factory=list)  # of the last instance_tick
    extra_namespaces: list[str] = field(default_factory=list)

    # --- configuration ---------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return str(self.kube.namespace)

    def cell(self, pool: str = "pool-a") -> Cell:
        found = self.settings.cell(pool)
        assert found is not None, pool
        return found

    def routing_group(self, pool: str = "pool-a") -> str:
        return self.cell(pool).routing_group

    def put_desired(self, pool: str = "pool-a", **blueprint_kwargs: Any) -> None:
        """(Re)write the pool's ConfigMap: the registry plus its blueprint (one object)."""
        kwargs = {**self.blueprint_kwargs.get(pool, {}), **blueprint_kwargs}
        self.blueprint_kwargs[pool] = kwargs
        cell = self.cell(pool)
        text = blueprints.blueprint_text(namespace=cell.namespace, **kwargs)
        blueprints.put_config_map(
            self.kube.core,
            self.namespace,
            self.settings.configmap_name(cell),
            {
                self.settings.config_registry_key: helpers.registry(*self.registry_cells),
                blueprints.blueprint_key(cell): text,
            },
        )

    # --- running -----------------------------------------------------------------------------
    def tick(self, n: int = 1) -> list[trino_operator.TickReport]:
        """The operator's real tick, ``n`` times."""
        return [self.operator.tick(self.settings) for _ in range(n)]

    def instance_tick(self, n: int = 1, pool: str = "pool-a") -> list[str]:
        """One pool's tick without tenant admission, ``n`` times; returns the outcomes."""
        cell = self.cell(pool)
        outcomes = []
        for _ in range(n):
            assert self.operator.lease.acquire(), "the test operator lost the trino lease"
            errors: list[BaseException] = []
            try:
                outcomes.append(self._instance_pool_tick(cell, errors))
            except PoolConflict as exc:
                self.operator.end_term(cell.stored_id, fenced=True, reason=str(exc))
                outcomes.append(f"fenced: {exc}")
            self.last_errors = errors
        return outcomes

    def _instance_pool_tick(self, cell: Cell, errors: list[BaseException]) -> str:
        # The operator's own pool tick: without tenant admission on the pool, admission is a
        # no-op, so this is exactly the instance side of the real tick.
        assert not cell.pool.tenant_admission, "instance_tick is for pools without admission"
        return self.operator.pool_tick(self.settings, cell, errors)

    def context(self, pool: str = "pool-a", desired: Any = None) -> PoolContext:
        """A PoolContext of the live term (started if needed), as the tick builds it."""
        cell = self.cell(pool)
        desired = desired or read_desired(self.settings, cell)
        term = self.operator.terms.get(cell.stored_id)
        if term is None:
            trino_operator.seed_pool(cell)
            term = self.operator._begin_term(self.settings, cell)
            assert term is not None
        return PoolContext(
            self.operator.ensure_leading,
            self.settings,
            desired.cell,
            desired,
            term,
            self.operator.gateway(self.settings),
            TrinoPool.objects.get(pool_id=cell.stored_id),
        )

    def run_until(
        self,
        predicate: Callable[[], bool],
        *,
        max_ticks: int = 40,
        pool: str = "pool-a",
        each: Callable[[], None] | None = None,
    ) -> int:
        """Instance ticks until ``predicate()``; returns the ticks used (fails after max)."""
        for used in range(max_ticks + 1):
            if predicate():
                return used
            if each is not None:
                each()
            self.instance_tick(pool=pool)
        raise AssertionError(
            f"not reached after {max_ticks} ticks; rows: "
            + "; ".join(f"{r.instance_id} {r.phase} {r.last_error!r}" for r in self.rows(pool))
        )

    # --- rows ----------------------------------------------------------------------------------
    def rows(self, pool: str = "pool-a") -> list[TrinoPoolInstance]:
        return list(
            TrinoPoolInstance.objects.filter(pool_id=self.cell(pool).stored_id).order_by(
                "created_at", "instance_id"
            )
        )

    def row(self, instance_id: str) -> TrinoPoolInstance:
        return TrinoPoolInstance.objects.get(instance_id=instance_id)

    def phases(self, pool: str = "pool-a") -> dict[str, str]:
        return {r.instance_id: r.phase for r in self.rows(pool)}

    # --- Kubernetes by hand --------------------------------------------------------------------
    def pool_of(self, instance_id: str) -> str:
        """The public id of the pool the instance belongs to."""
        return str(self.row(instance_id).pool_id).removeprefix("registered:")

    def ns_of(self, instance_id: str) -> str:
        """The namespace of the instance's pool (the first pool uses the kube_api namespace)."""
        return self.cell(self.pool_of(instance_id)).namespace

    def worker_replicas(self, instance_id: str) -> int:
        return int(self.blueprint_kwargs.get(self.pool_of(instance_id), {}).get("replicas", 2))

    def set_deployment_ready(
        self, instance_id: str, *, coordinator: int = 1, workers: int | None = None
    ) -> None:
        if workers is None:
            workers = self.worker_replicas(instance_id)
        ns = self.ns_of(instance_id)
        blueprints.set_deployment_ready(
            self.kube.api_client, ns, f"{instance_id}-coordinator", coordinator
        )
        blueprints.set_deployment_ready(self.kube.api_client, ns, f"{instance_id}-worker", workers)

    def create_coordinator_pod(
        self, instance_id: str, *, image: str = blueprints.IMAGE
    ) -> dict[str, Any]:
        """A running coordinator pod (what the Deployment + kubelet would have made)."""
        from kubernetes import client

        ns = self.ns_of(instance_id)
        name = f"{instance_id}-coordinator-{secrets.token_hex(3)}"
        labels = {
            INSTANCE_LABEL: instance_id,
            blueprints.IDENTITY["instance_label"]: instance_id,
            blueprints.IDENTITY["component_label"]: "coordinator",
        }
        body: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "trino", "image": image}]},
        }
        core = client.CoreV1Api(self.kube.api_client)
        pod: Any = core.create_namespaced_pod(ns, body)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "trino",
                    "image": image,
                    "imageID": image,
                    "containerID": f"containerd://{secrets.token_hex(16)}",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        }
        core.patch_namespaced_pod_status(name, ns, {"status": status})
        return {"name": name, "uid": pod.metadata.uid}

    def terminate_coordinator(self, instance_id: str, reason: str = "OOMKilled") -> None:
        """Record a terminated coordinator container (termination evidence)."""
        from kubernetes import client

        core = client.CoreV1Api(self.kube.api_client)
        for pod in self.instance_pods(instance_id):
            name = pod["metadata"]["name"]
            statuses = pod["status"]["containerStatuses"]
            finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for status in statuses:
                status["ready"] = False
                status["state"] = {
                    "terminated": {"exitCode": 137, "reason": reason, "finishedAt": finished}
                }
            core.patch_namespaced_pod_status(
                name, self.ns_of(instance_id), {"status": {"containerStatuses": statuses}}
            )

    def instance_pods(self, instance_id: str) -> list[dict[str, Any]]:
        return k8s.list_pods(self.ns_of(instance_id), f"{INSTANCE_LABEL}={instance_id}")

    def remove_pods(self, instance_id: str) -> None:
        """What the garbage collector and kubelet would do once the Deployments are gone."""
        from kubernetes import client

        core = client.CoreV1Api(self.kube.api_client)
        for pod in self.instance_pods(instance_id):
            core.delete_namespaced_pod(
                pod["metadata"]["name"], self.ns_of(instance_id), grace_period_seconds=0
            )

    def instance_objects(self, instance_id: str) -> dict[str, list[str]]:
        """Kind -> names of the Services, Deployments and ConfigMaps labelled as the instance's."""
        found: dict[str, list[str]] = {}
        for kind in ("Service", "Deployment", "ConfigMap"):
            names = sorted(
                o["metadata"]["name"]
                for o in k8s.list_objects(
                    self.ns_of(instance_id), kind, f"{INSTANCE_LABEL}={instance_id}"
                )
            )
            if names:
                found[kind] = names
        return found

    # --- coordinators and the Gateway's identity -----------------------------------------------
    def coordinator(self, instance_id: str, **kwargs: Any) -> CoordinatorDouble:
        """The instance's stand-in coordinator, reachable at its Service host (created once)."""
        double = self.coordinators.get(instance_id)
        if double is None:
            workers = self.worker_replicas(instance_id)
            double = CoordinatorDouble(
                node_id=f"{instance_id}-coordinator-node",
                workers=workers,
                expected_credential=OBSERVER,
                **kwargs,
            )
            port = self.cell(self.pool_of(instance_id)).pool.coordinator_service_port
            double.host_alias(instance_id, self.ns_of(instance_id), port)
            self.coordinators[instance_id] = double
        return double

    def make_ready(self, instance_id: str, *, identity: bool = True) -> CoordinatorDouble:
        """Deployments ready, a running coordinator pod, a coordinator double answering for it
        and (``identity``) the Gateway told the coordinator's node and coordinator ids, which it
        records at registration like the real Gateway."""
        double = self.coordinator(instance_id)
        self.set_deployment_ready(instance_id)
        self.create_coordinator_pod(instance_id)
        if identity:
            self.gateway.set_identity(
                self.routing_group(self.pool_of(instance_id)),
                instance_id,
                node_id=double.node_id,
                coordinator_id=double.coordinator_id,
            )
        return double

    def close(self) -> None:
        for double in self.coordinators.values():
            double.close()
        self.coordinators.clear()
        for extra in self.extra_namespaces:
            try:
                self.kube.core.delete_collection_namespaced_pod(extra, grace_period_seconds=0)
                self.kube.core.delete_namespace(extra)
            except Exception as exc:  # cleanup is best effort; the name is unique
                print(f"cleanup of {extra}: {exc}")
        self.extra_namespaces = []


def make_world(
    kube_api: Any,
    gateway: GatewayDouble,
    tmp_path: Path,
    django_settings: Any,
    *,
    pools: tuple[str, ...] = ("pool-a",),
    desired_instances: int = 1,
    min_serving: int = 1,
    max_surge: int = 1,
    max_repair: int = 1,
    tenant_admission: bool = False,
    catalog_store: Any = None,
    blueprint: dict[str, Any] | None = None,
) -> PoolWorld:
    """Configure ``pools`` and an Operator. The first pool lives in the kube_api namespace, each
    further pool in its own namespace ``<kube_api namespace>-<n>`` (created here, deleted by
    ``PoolWorld.close``); every pool's ConfigMap is in the kube_api namespace."""
    for key, value in kube_api.settings_overrides().items():
        setattr(django_settings, key, value)
    k8s.api_client.cache_clear()
    from kubernetes import client

    core = client.CoreV1Api(kube_api.api_client)
    ns = kube_api.namespace
    extra_namespaces = [f"{ns}-{i}" for i in range(1, len(pools))]
    for extra in extra_namespaces:
        core.create_namespace(
            client.V1Namespace(
                metadata=client.V1ObjectMeta(name=extra, labels={"duckgres-test": "1"})
            )
        )
    for pool_ns in [ns, *extra_namespaces]:
        core.create_namespaced_secret(
            pool_ns,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="trino-observer"),
                string_data={"username": OBSERVER[0], "password": OBSERVER[1]},
            ),
        )
    cells_docs = []
    for i, pool in enumerate(pools):
        pool_ns = ns if i == 0 else extra_namespaces[i - 1]
        doc = helpers.cell(pool, namespace=pool_ns, routing_group=f"rg-{pool}-{i}")
        doc["pool"].update(
            desired_instances=desired_instances,
            min_serving=min_serving,
            max_surge=max_surge,
            max_repair=max_repair,
            tenant_admission=tenant_admission,
        )
        cells_docs.append(doc)
    registry_text = helpers.registry(*cells_docs)
    cells = parse_registry(registry_text, "test registry")
    token_file = tmp_path / "gateway-token"
    token_file.write_text(gateway.token + "\n", encoding="utf-8")
    settings = TrinoSettings(
        wired=True,
        cells_file=str(tmp_path / "cells.json"),
        cells=cells,
        default_cell=pools[0],
        pool_enabled=True,
        operator_enabled=True,
        catalog_writer_enabled=catalog_store is not None,
        gateway_url=gateway.url,
        rollout_token_file=str(token_file),
        config_configmap_prefix=PREFIX,
        config_namespace=ns,
    )
    if catalog_store is not None:
        import psycopg

        from trino_pools.catalog_store import BOOTSTRAP_DDL

        with psycopg.connect(
            catalog_store.dsn, autocommit=True, options=f"-c search_path={catalog_store.schema}"
        ) as conn:
            conn.execute(BOOTSTRAP_DDL)
        dsn_file = tmp_path / "catalog-dsn"
        dsn_file.write_text(catalog_store.dsn + "\n", encoding="utf-8")
        settings = replace(
            settings, catalog_dsn_file=str(dsn_file), catalog_schema=catalog_store.schema
        )
    (tmp_path / "cells.json").write_text(registry_text, encoding="utf-8")
    _expire_trino_lease()
    from duckgres_admin.lib.gateway import GatewayClient

    op = Operator(
        gateway_factory=lambda s: GatewayClient(s.gateway_url, gateway.token, allow_http=True),
        leader_lease=TrinoLease(holder=f"test-operator.{secrets.token_hex(8)}"),
    )
    world = PoolWorld(
        kube=kube_api,
        gateway=gateway,
        settings=settings,
        operator=op,
        tmp=tmp_path,
        registry_cells=cells_docs,
        extra_namespaces=extra_namespaces,
    )
    for pool in pools:
        world.put_desired(pool, **(blueprint or {}))
    config.install_for_tests(settings)
    return world


@pytest.fixture
def world(
    kube_api: Any, gateway: GatewayDouble, tmp_path: Path, settings: Any
) -> Iterator[PoolWorld]:
    """One pool ``pool-a`` (desired 1, min serving 1, surge 1, repair 1), no tenant admission."""
    built = make_world(kube_api, gateway, tmp_path, settings)
    try:
        yield built
    finally:
        built.operator.end_all_terms("test teardown")
        built.close()
        config.install_for_tests(None)
        k8s.api_client.cache_clear()


def blueprint_json(world: PoolWorld, pool: str = "pool-a") -> dict[str, Any]:
    cell = world.cell(pool)
    cm = k8s.read_config_map(world.namespace, world.settings.configmap_name(cell))
    return dict(json.loads(cm["data"][blueprints.blueprint_key(cell)]))
