"""The config-store Trino tables (spec trino-pools §2) on real PostgreSQL: defaults, CHECKs,
partial unique indexes and the database-level cascade from the warehouse row."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from duckgres_admin.models import (
    TrinoPool,
    TrinoPoolInstance,
    TrinoPoolOperation,
    TrinoPoolOperationStep,
    TrinoPoolPublication,
    WarehouseTrino,
    clip_status_message,
)

pytestmark = pytest.mark.django_db


def _run(sql: str, params: list[Any]) -> None:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # foreign keys are deferred by default
        cur.execute(sql, params)


def _fails(sql: str, params: list[Any] | None = None) -> None:
    with pytest.raises(IntegrityError):
        _run(sql, params or [])


def test_warehouse_trino_defaults_come_from_the_database(make_warehouse):
    wh = make_warehouse()
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO duckgres_managed_warehouse_trino (org_id) VALUES (%s)", [wh.org_id]
        )
    row = WarehouseTrino.objects.get(pk=wh.org_id)
    assert row.enabled is False
    assert row.state == "pending"
    assert row.trino_cell_id == ""
    assert row.backend == "ducklake"
    assert row.backend_selected is True
    assert row.catalog_name == ""
    assert row.tier == ""


def test_warehouse_trino_checks(make_warehouse):
    wh = make_warehouse()
    base = "INSERT INTO duckgres_managed_warehouse_trino (org_id, {col}) VALUES (%s, %s)"
    _fails(base.format(col="tier"), [wh.org_id, "platinum"])
    _fails(base.format(col="state"), [wh.org_id, "resharding"])
    _fails(base.format(col="backend"), [wh.org_id, "iceberg"])
    _fails(base.format(col="status_message"), [wh.org_id, "x" * 1025])
    _fails(base.format(col="tier"), ["no-such-org", "free"])  # FK to the warehouse


def test_status_message_clip():
    assert clip_status_message("ok") == "ok"
    assert clip_status_message("x" * 1024) == "x" * 1024
    clipped = clip_status_message("y" * 2000)
    assert len(clipped) == 1024
    assert clipped.endswith("y...")


def test_catalog_name_is_unique_per_pool_only(make_warehouse):
    a, b, c = make_warehouse(), make_warehouse(), make_warehouse()
    WarehouseTrino.objects.create(
        warehouse=a, trino_cell_id="registered:pool-a", catalog_name="org_acme"
    )
    WarehouseTrino.objects.create(
        warehouse=c, trino_cell_id="registered:pool-b", catalog_name="org_acme"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        WarehouseTrino.objects.create(
            warehouse=b, trino_cell_id="registered:pool-a", catalog_name="org_acme"
        )
    # Empty catalog names never collide.
    WarehouseTrino.objects.filter(pk=c.org_id).update(catalog_name="")
    WarehouseTrino.objects.create(warehouse=b, trino_cell_id="registered:pool-b")


def test_deleting_the_warehouse_by_sql_cascades(make_warehouse):
    wh = make_warehouse()
    WarehouseTrino.objects.create(warehouse=wh, enabled=True, trino_cell_id="registered:p")
    with connection.cursor() as cur:
        cur.execute("DELETE FROM duckgres_managed_warehouses WHERE org_id = %s", [wh.org_id])
    assert not WarehouseTrino.objects.filter(pk=wh.org_id).exists()


def test_pool_bounds():
    pool = TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a")
    pool.refresh_from_db()
    assert (pool.desired_instances, pool.min_serving, pool.max_surge, pool.max_repair) == (
        3,
        3,
        1,
        1,
    )
    assert pool.api_mode == "shared-pool"
    ins = "INSERT INTO duckgres_trino_pools (pool_id, public_id, {col}) VALUES (%s, 'x', %s)"
    _fails(ins.format(col="desired_instances"), ["registered:b", 0])
    _fails(ins.format(col="min_serving"), ["registered:b", 4])  # > desired (3)
    _fails(ins.format(col="min_serving"), ["registered:b", 0])
    _fails(ins.format(col="max_surge"), ["registered:b", -1])
    _fails(ins.format(col="max_repair"), ["registered:b", -1])
    _fails(ins.format(col="desired_generation"), ["registered:b", -1])
    _fails(ins.format(col="authority_epoch"), ["registered:b", -1])
    _fails(ins.format(col="api_mode"), ["registered:b", "blue-green"])
    _fails("INSERT INTO duckgres_trino_pools (pool_id, public_id) VALUES ('pool-b', 'pool-b')")


def test_instance_phase_id_and_live_endpoint_uniqueness():
    pool = TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a")
    first = TrinoPoolInstance.objects.create(
        instance_id="cell-0000000a", pool=pool, endpoint_url="https://10.0.0.1:8080"
    )
    first.refresh_from_db()
    assert first.phase == "PENDING"
    assert first.blueprint_snapshot == {}
    # Instances whose endpoint is not known yet never collide.
    TrinoPoolInstance.objects.create(instance_id="cell-0000000b", pool=pool)
    TrinoPoolInstance.objects.create(instance_id="cell-0000000c", pool=pool)
    with pytest.raises(IntegrityError), transaction.atomic():
        TrinoPoolInstance.objects.create(
            instance_id="cell-0000000d", pool=pool, endpoint_url="https://10.0.0.1:8080"
        )
    TrinoPoolInstance.objects.filter(pk="cell-0000000a").update(phase="RETIRED")
    TrinoPoolInstance.objects.create(
        instance_id="cell-0000000d", pool=pool, endpoint_url="https://10.0.0.1:8080"
    )
    _fails(
        "INSERT INTO duckgres_trino_pool_instances (instance_id, pool_id, phase) "
        "VALUES ('cell-0000000e', 'registered:pool-a', 'UNKNOWN')"
    )
    _fails(
        "INSERT INTO duckgres_trino_pool_instances (instance_id, pool_id) "
        "VALUES ('pool-a-1', 'registered:pool-a')"
    )


def test_operations_steps_and_publications():
    pool = TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a")
    op = TrinoPoolOperation.objects.create(
        operation_id="op-1", pool=pool, kind="publish", intent_hash="h", owner_epoch=1
    )
    TrinoPoolOperationStep.objects.create(
        operation=op, step_id="principals.a1", payload_hash="p", payload='{"a": 1}', owner_epoch=1
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        TrinoPoolOperationStep.objects.create(
            operation=op, step_id="principals.a1", payload_hash="p", owner_epoch=1
        )
    step = TrinoPoolOperationStep.objects.get(operation=op, step_id="principals.a1")
    assert step.outcome == "pending"
    assert step.payload == '{"a": 1}'
    _fails(
        "INSERT INTO duckgres_trino_pool_operations (operation_id, pool_id, kind, intent_hash, "
        "owner_epoch) VALUES ('op-2', 'registered:pool-a', 'rollback', 'h', 1)"
    )
    TrinoPoolPublication.objects.create(pool=pool, org_id="org-a")
    with pytest.raises(IntegrityError), transaction.atomic():
        TrinoPoolPublication.objects.create(pool=pool, org_id="org-a")
    pub = TrinoPoolPublication.objects.get(pool=pool, org_id="org-a")
    assert pub.state == "pending"
    assert pub.pending_intent == ""
    _fails(
        "UPDATE duckgres_trino_pool_publications SET pending_intent = 'delete' "
        "WHERE org_id = 'org-a'"
    )
    _fails("UPDATE duckgres_trino_pool_publications SET state = 'gone' WHERE org_id = 'org-a'")


def test_reserved_and_retired_names_are_not_created():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name IN "
            "('duckgres_trino_pool_projection', 'duckgres_trino_pool_recoveries', "
            "'duckgres_trino_cell_lifecycle', 'trino_catalogs', 'trino_catalog_journal', "
            "'trino_catalog_writer_state')"
        )
        assert cur.fetchall() == []
        cur.execute(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_name = 'duckgres_trino_cluster_bootstrap'"
        )
        assert cur.fetchone() == (1,)
