"""The operator's tick and terms on real services (spec trino-pools §4.3, §4.4, §7, §8).

Real kube-apiserver (per-pool ConfigMaps, instance objects), the Gateway double, the config store.
Time-dependent rules (one lease duration without a new term) use the operator's injectable
monotonic clock, never sleeps.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from prometheus_client import generate_latest

from duckgres_admin.lib import k8s
from duckgres_admin.lib.gateway import GatewayClient
from duckgres_admin.models.trino import (
    TrinoPool,
    TrinoPoolInstance,
    TrinoPoolPublication,
    WarehouseTrino,
)
from tests.fixtures.trino import bound_warehouse
from tests.trino.gateway_double import GatewayDouble
from tests.trino.operator_harness import PoolWorld, make_world
from trino_pools import authority, config, operator, term_metrics
from trino_pools import catalog_store as catalog_store_module
from trino_pools.lease import TrinoLease
from trino_pools.metrics import TRINO_REGISTRY
from trino_pools.operator import Operator
from trino_pools.operator import pool as operator_pool

pytestmark = [pytest.mark.kube, pytest.mark.django_db(transaction=True)]

POOL_A = "registered:pool-a"


@pytest.fixture(autouse=True)
def _lease_row(trino_lease_row: None) -> None:
    """Every test here ticks: the ``trino`` lease row must exist."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _epoch(pool_id: str = POOL_A) -> int:
    return int(TrinoPool.objects.get(pool_id=pool_id).authority_epoch)


def _sample(name: str, **labels: str) -> float | None:
    return TRINO_REGISTRY.get_sample_value(name, labels)


def _operator_with_clock(world: PoolWorld, clock: Clock) -> Operator:
    op = Operator(
        gateway_factory=lambda s: GatewayClient(
            s.gateway_url, world.gateway.token, allow_http=True
        ),
        leader_lease=world.operator.lease,
        clock=clock,
    )
    world.operator = op
    return op


@pytest.mark.safeguard("trino-11")
def test_fence_refusal_ends_the_term_and_no_term_starts_for_one_lease_duration(
    world: PoolWorld,
) -> None:
    clock = Clock()
    op = _operator_with_clock(world, clock)
    op.tick(world.settings)
    assert POOL_A in op.terms
    ours = op.terms[POOL_A].auth
    assert authority.HOLDER.get(POOL_A) == ours

    # Another holder takes the pool's authority behind our back.
    theirs = authority.acquire(POOL_A, "someone-else.0123456789abcdef")
    report = op.tick(world.settings)
    assert report.pools["pool-a"].startswith("fenced")
    assert POOL_A not in op.terms
    assert authority.HOLDER.get(POOL_A) is None
    assert _epoch() == theirs.epoch  # we never fought back with a fresher epoch
    # The term's gauges are gone with it.
    assert _sample("duckgres_trino_pool_snapshot_timestamp_seconds", pool="pool-a") is None
    assert _sample("duckgres_trino_pool_reconcile_failures_total", pool="pool-a", reason="fenced")

    # Still leading, but no new term until one full lease duration has passed.
    clock.now += op.lease.duration_seconds() - 1
    assert op.tick(world.settings).pools["pool-a"] == "waiting: fenced recently"
    assert _epoch() == theirs.epoch
    clock.now += 2
    op.tick(world.settings)
    assert op.terms[POOL_A].auth.epoch == theirs.epoch + 1


@pytest.mark.safeguard("trino-11")
def test_a_lower_generation_freezes_the_pool_and_the_term_continues(world: PoolWorld) -> None:
    world.put_desired(generation=7)
    world.tick()
    epoch = _epoch()
    assert TrinoPool.objects.get(pool_id=POOL_A).desired_generation == 7

    world.put_desired(generation=6)
    report = world.tick()[0]
    pool = TrinoPool.objects.get(pool_id=POOL_A)
    assert report.pools["pool-a"].startswith("frozen")
    assert pool.frozen
    assert pool.frozen_reason.startswith("desired configuration is older than the published one")
    assert pool.desired_generation == 7
    assert _epoch() == epoch
    assert world.operator.terms[POOL_A].auth.epoch == epoch

    world.put_desired(generation=8)
    world.tick()
    pool.refresh_from_db()
    assert (pool.frozen, pool.desired_generation, pool.authority_epoch) == (False, 8, epoch)


def _serving_outdated_instance(world: PoolWorld) -> TrinoPoolInstance:
    """A SERVING instance whose release is no longer desired: the planner would replace it."""
    operator.seed_pool(world.cell())
    return TrinoPoolInstance.objects.create(
        instance_id="cell-0000aaaa",
        pool_id=POOL_A,
        release_id="rel-old",
        phase="SERVING",
        endpoint_url="http://cell-0000aaaa.example:8080",
    )


@pytest.mark.safeguard("trino-13")
@pytest.mark.parametrize("how", ["configmap deleted", "pool vanished"])
def test_missing_configuration_freezes_and_issues_no_drain_or_delete(
    world: PoolWorld, how: str
) -> None:
    _serving_outdated_instance(world)
    world.tick(3)  # the planner surges a replacement of the outdated instance
    before = world.phases()
    objects_before = {i: world.instance_objects(i) for i in before}
    assert len(before) == 2
    cell = world.cell()
    name = world.settings.configmap_name(cell)
    if how == "configmap deleted":
        world.kube.core.delete_namespaced_config_map(name, world.namespace)
    else:
        other = dict(world.registry_cells[0], id="pool-z", namespace="ns-z", routing_group="rg-z")
        world.registry_cells = [other]
        world.put_desired()
    world.gateway.requests.clear()
    for _ in range(3):
        world.tick()
    pool = TrinoPool.objects.get(pool_id=POOL_A)
    assert pool.frozen
    expected = "desired configuration is unreadable" if how == "configmap deleted" else "vanished"
    assert expected in pool.frozen_reason
    assert world.phases() == before  # no create, drain or retirement
    assert {i: world.instance_objects(i) for i in before} == objects_before  # no delete
    mutations = [r for r in world.gateway.requests if r.method != "GET"]
    assert mutations == []


@pytest.mark.safeguard("trino-39")
def test_two_workers_ticking_concurrently_make_one_term_and_one_epoch_bump(
    world: PoolWorld,
) -> None:
    def make() -> Operator:
        return Operator(
            gateway_factory=lambda s: GatewayClient(
                s.gateway_url, world.gateway.token, allow_http=True
            ),
            leader_lease=TrinoLease(holder=f"worker-{len(ops)}.{'0' * 16}"),
        )

    ops: list[Operator] = []
    ops.append(make())
    ops.append(make())
    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def run(op: Operator) -> None:
        try:
            barrier.wait()
            for _ in range(3):
                op.tick(world.settings)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(op,)) for op in ops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    leaders = [op for op in ops if POOL_A in op.terms]
    assert len(leaders) == 1
    assert _epoch() == 1
    for op in ops:
        op.end_all_terms("test teardown")


@pytest.mark.safeguard("trino-31")
def test_a_failed_instance_listing_changes_no_sample_and_a_later_success_refreshes(
    world: PoolWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.tick()
    serving = TrinoPoolInstance.objects.create(
        instance_id="cell-0000bbbb",
        pool_id=POOL_A,
        release_id="rel-old",
        phase="SERVING",
        endpoint_url="http://cell-0000bbbb.example:8080",
        coordinator_deployment_name="cell-0000bbbb-coordinator",
        worker_deployment_name="cell-0000bbbb-worker",
    )
    world.tick()
    stamp = _sample("duckgres_trino_pool_snapshot_timestamp_seconds", pool="pool-a")
    assert stamp is not None
    before = generate_latest(TRINO_REGISTRY).decode()
    assert 'pool_instance="cell-0000bbbb"' in before

    # Hold the instance table: the bounded listing fails, so the tick stops before any sample.
    monkeypatch.setattr(operator_pool, "LISTING_TIMEOUT", "300ms")
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=db["USER"]
    ) as blocker:
        blocker.execute("LOCK TABLE duckgres_trino_pool_instances IN ACCESS EXCLUSIVE MODE")
        report = world.tick()[0]
        assert report.pools["pool-a"].startswith("failed")
        assert _sample("duckgres_trino_pool_snapshot_timestamp_seconds", pool="pool-a") == stamp
        serving_lines = [
            line
            for line in generate_latest(TRINO_REGISTRY).decode().splitlines()
            if "serving_instance_info{" in line
        ]
        assert serving_lines == [
            line for line in before.splitlines() if "serving_instance_info{" in line
        ]
        blocker.rollback()

    # A later successful read refreshes the snapshot even when the instance step then fails
    # (a DRAINING instance the Gateway does not know: reading its obligations is refused).
    TrinoPoolInstance.objects.filter(pk=serving.pk).update(phase="DRAINING")
    world.tick()
    after = _sample("duckgres_trino_pool_snapshot_timestamp_seconds", pool="pool-a")
    assert after is not None
    assert after > stamp
    assert _sample("duckgres_trino_pool_members", pool="pool-a", phase="DRAINING") == 1
    assert TrinoPoolInstance.objects.get(pk=serving.pk).last_error != ""  # the step failed


def test_read_only_operator_ticks_make_no_rows_and_no_calls(
    kube_api: Any,
    gateway: GatewayDouble,
    tmp_path: Path,
    settings: Any,
) -> None:
    built = make_world(kube_api, gateway, tmp_path, settings)
    try:
        from dataclasses import replace

        read_only = replace(built.settings, operator_enabled=False)
        config.install_for_tests(read_only)
        gateway.requests.clear()
        report = built.operator.tick(read_only)
        assert not report.leader
        assert not TrinoPool.objects.exists()
        assert gateway.requests == []
        assert term_metrics.current_token("pool-a") is None
    finally:
        built.operator.end_all_terms("teardown")
        built.close()
        config.install_for_tests(None)
        k8s.api_client.cache_clear()


def test_worker_shutdown_ends_every_term(world: PoolWorld) -> None:
    with operator.installed(world.operator):
        world.tick()
        assert world.operator.terms
        operator.shutdown()
    assert world.operator.terms == {}
    assert authority.HOLDER.get(POOL_A) is None
    assert term_metrics.current_token("pool-a") is None


@pytest.mark.safeguard("trino-28")
def test_a_permanently_failing_tenant_does_not_stop_instance_progress(
    kube_api: Any,
    gateway: GatewayDouble,
    tmp_path: Path,
    settings: Any,
    catalog_store: Any,
    make_warehouse: Any,
) -> None:
    """Every admission step of the pool fails (the tenant's principals are always refused),
    and the pool's candidate still walks PENDING → CREATING → PREPARING on the same ticks."""
    built = make_world(
        kube_api, gateway, tmp_path, settings, tenant_admission=True, catalog_store=catalog_store
    )
    try:
        warehouse = make_warehouse(state="ready", database_name="stuck_wh")
        WarehouseTrino.objects.create(
            warehouse=warehouse, trino_cell_id=POOL_A, enabled=True, state="ready"
        )
        for _ in range(40):
            gateway.fail_next("PUT", r"/principals$", refuse="POOL_PRINCIPAL_CONFLICT")
        metric = "duckgres_trino_pool_reconcile_failures_total"
        failures_before = _sample(metric, pool="pool-a", reason="gateway_refused") or 0.0
        phases: list[str] = []
        for _ in range(12):
            built.tick()
            rows = built.rows()
            if rows:
                phases.append(rows[0].phase)
                if rows[0].phase == "CREATING":
                    built.make_ready(rows[0].instance_id)
            if "PREPARING" in phases:
                break
            TrinoPoolPublication.objects.filter(pool_id=POOL_A).update(next_attempt_at=None)
        assert "PREPARING" in phases, phases
        refused = gateway.requests_to("PUT", r"/tenants/.+/principals$")
        assert refused, "the tenant was never attempted"
        failures = _sample(metric, pool="pool-a", reason="gateway_refused") or 0.0
        assert failures > failures_before  # counted, never blocking
    finally:
        built.operator.end_all_terms("teardown")
        built.close()
        config.install_for_tests(None)
        k8s.api_client.cache_clear()


def _writer_store(catalog_store: Any) -> None:
    with psycopg.connect(catalog_store.dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {catalog_store.schema}")
        conn.execute(catalog_store_module.BOOTSTRAP_DDL)


@pytest.mark.safeguard("trino-11")
def test_a_fence_refusal_while_a_term_starts_is_not_retried_for_a_lease_duration(
    kube_api: Any, gateway: GatewayDouble, tmp_path: Path, settings: Any, catalog_store: Any
) -> None:
    """The catalog store is held at a higher epoch: the writer takeover at term start is
    refused; the operator does not come back with epoch + 1 on the next tick."""
    _writer_store(catalog_store)
    with psycopg.connect(catalog_store.dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {catalog_store.schema}.trino_catalog_writer_state "
            "(pool_key, writer_epoch, writer_identity) VALUES (%s, 50, 'elsewhere.0')",
            [POOL_A],
        )
    built = make_world(kube_api, gateway, tmp_path, settings, catalog_store=catalog_store)
    clock = Clock()
    op = _operator_with_clock(built, clock)
    try:
        first = op.tick(built.settings).pools["pool-a"]
        assert first.startswith("fenced"), first
        epoch = _epoch()
        assert op.tick(built.settings).pools["pool-a"] == "waiting: fenced recently"
        assert _epoch() == epoch  # no fight: the epoch was not bumped again
        assert POOL_A not in op.terms
    finally:
        op.end_all_terms("teardown")
        built.close()
        config.install_for_tests(None)
        k8s.api_client.cache_clear()


def test_terms_never_span_a_lost_and_retaken_lease(world: PoolWorld) -> None:
    world.tick()
    before = world.operator.terms[POOL_A]
    # Another task of this process lost the lease and took it again (a new lease epoch).
    with connection.cursor() as cursor:
        cursor.execute("UPDATE duckgres_leases SET expires_at = now() WHERE name = 'trino'")
    assert world.operator.lease.acquire()
    world.tick()
    after = world.operator.terms[POOL_A]
    assert after is not before
    assert after.auth.epoch == before.auth.epoch + 1
    assert after.metrics_token is not before.metrics_token


@pytest.mark.safeguard("trino-11")
def test_a_fence_refusal_in_an_org_reconcile_ends_the_pools_term(
    kube_api: Any,
    gateway: GatewayDouble,
    tmp_path: Path,
    settings: Any,
    catalog_store: Any,
    make_warehouse: Any,
) -> None:
    from trino_pools import reconcile

    _writer_store(catalog_store)
    built = make_world(kube_api, gateway, tmp_path, settings, catalog_store=catalog_store)
    try:
        with operator.installed(built.operator):
            built.tick()
            assert POOL_A in built.operator.terms
            warehouse = bound_warehouse(make_warehouse, "fenced_wh")
            WarehouseTrino.objects.create(warehouse=warehouse, trino_cell_id=POOL_A, enabled=True)
            # Another control plane's writer takes the catalog store over at a higher epoch.
            with psycopg.connect(catalog_store.dsn, autocommit=True) as conn:
                conn.execute(
                    f"UPDATE {catalog_store.schema}.trino_catalog_writer_state SET "
                    "writer_epoch = writer_epoch + 10, writer_identity = 'elsewhere.0' "
                    "WHERE pool_key = %s",
                    [POOL_A],
                )
            assert reconcile.reconcile_org(warehouse.org_id) == "fenced"
            assert POOL_A not in built.operator.terms
            assert authority.HOLDER.get(POOL_A) is None
            assert built.operator.tick(built.settings).pools["pool-a"] == (
                "waiting: fenced recently"
            )
    finally:
        built.operator.end_all_terms("teardown")
        built.close()
        config.install_for_tests(None)
        k8s.api_client.cache_clear()
