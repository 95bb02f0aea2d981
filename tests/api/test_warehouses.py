"""Warehouses and metadata stores (spec §5.5; safeguard 43)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from duckgres_admin.models import AuditRecord, MetadataStore, Warehouse
from duckgres_admin.platform.orglock import lock_org
from tests.fixtures.api import error
from tests.fixtures.rows import new_store, new_warehouse

CNPG_BINDING = {
    "metadata_store_kind": "cnpg",
    "metadata_store_name": "shard-001",
    "metadata_store_database": "acme",
    "metadata_store_user": "acme",
    "metadata_store_password_ref": "env:ACME_PW",
}


@pytest.fixture
def shard(db):
    return new_store(name="shard-001")


def create(clients: Any, **body: Any) -> Any:
    return clients.internal.post("/api/v1/warehouses", body, format="json")


def test_create_read_list(clients, shard):
    response = create(clients, org_id="acme", database_name="acme", state="ready", **CNPG_BINDING)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["org_id"] == "acme"
    assert body["metadata_store_name"] == "shard-001"
    assert body["writable"] is True
    assert body["compaction_enabled"] is None
    assert clients.viewer.get("/api/v1/warehouses/acme").json() == body
    create(clients, org_id="aaa")
    listing = clients.viewer.get("/api/v1/warehouses").json()["warehouses"]
    assert [w["org_id"] for w in listing] == ["aaa", "acme"]
    assert listing[0]["state"] == "pending"
    response = clients.viewer.get("/api/v1/warehouses/nobody")
    assert response.status_code == 404
    assert error(response) == "org has no managed warehouse"
    response = create(clients, org_id="acme")
    assert response.status_code == 409
    actions = list(AuditRecord.objects.values_list("action", "status", "org_id").order_by("id"))
    assert actions == [
        ("warehouse.create", 201, "acme"),
        ("warehouse.create", 201, "aaa"),
        ("warehouse.create", 409, "acme"),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"state": "resharding"}, "state resharding is set only by a reshard"),
        ({"state": "sleeping"}, "invalid body: state: must be one of"),
        ({"password": "hunter2-secret"}, "invalid body: password: unknown field"),
        ({"provisioner_password": "x"}, "invalid body: provisioner_password: unknown field"),
        (
            {**CNPG_BINDING, "metadata_store_database": ""},
            "invalid body: metadata_store_database: required for cnpg bindings",
        ),
        (
            {**CNPG_BINDING, "metadata_store_name": "nope"},
            "invalid body: metadata_store_name: must name a registered cnpg store",
        ),
        (
            {**CNPG_BINDING, "metadata_store_password_ref": "plain"},
            "invalid body: metadata_store_password_ref: must be a secret reference",
        ),
        (
            {"metadata_store_kind": "external", "metadata_store_host": "h"},
            "invalid body: metadata_store_database: required for external bindings",
        ),
        ({"metadata_store_port": 70000}, "invalid body: metadata_store_port: must be <= 65535"),
        ({"max_connection_leases": -1}, "invalid body: max_connection_leases: must be >= 0"),
        ({"compaction_enabled": "yes"}, "invalid body: compaction_enabled: must be a boolean"),
    ],
)
def test_create_validation(clients, shard, body, message):
    response = create(clients, org_id="bad", **body)
    assert response.status_code == 400
    assert error(response).startswith(message)
    assert "hunter2-secret" not in response.content.decode()
    assert not Warehouse.objects.filter(org_id="bad").exists()


def test_external_store_cannot_back_a_cnpg_binding(clients):
    new_store(name="shard-001", kind="external")
    response = create(clients, org_id="x", **CNPG_BINDING)
    assert response.status_code == 400


@pytest.mark.safeguard("reshard-43")
def test_patch_refuses_binding_compaction_and_state_while_resharding(clients, shard):
    create(clients, org_id="acme", state="ready", **CNPG_BINDING)
    new_store(name="shard-002")
    Warehouse.objects.filter(org_id="acme").update(state="resharding")
    path = "/api/v1/warehouses/acme"
    for change in (
        {"metadata_store_name": "shard-002"},
        {"metadata_store_database": "other"},
        {"compaction_enabled": False},
        {"state": "ready"},
    ):
        response = clients.internal.patch(path, change, format="json")
        assert response.status_code == 409, change
        assert response.json() == {
            "code": "warehouse_resharding",
            "error": "a metadata-store reshard owns this warehouse until it finishes",
        }
    response = clients.internal.patch(path, {"state": "resharding"}, format="json")
    assert response.status_code == 400
    assert error(response) == "state resharding is set only by a reshard"
    # Columns outside the binding, compaction and state stay editable; unchanged values pass.
    response = clients.internal.patch(
        path, {"data_bucket": "b", "metadata_store_database": "acme"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["writable"] is False
    warehouse = Warehouse.objects.get(org_id="acme")
    assert (warehouse.metadata_store_id, warehouse.state) == ("shard-001", "resharding")
    assert warehouse.compaction_enabled is None
    response = clients.internal.patch(path, {"org_id": "x"}, format="json")
    assert response.status_code == 400
    assert error(response) == "invalid body: org_id: immutable"
    assert AuditRecord.objects.filter(action="warehouse.update", status=409).count() == 4


def test_patch_when_ready(clients, shard):
    create(clients, org_id="acme", state="ready", **CNPG_BINDING)
    new_store(name="shard-002")
    # shard-002 holds no catalog acme (tests/api/test_binding_catalog.py): forced here.
    response = clients.admin.patch(
        "/api/v1/warehouses/acme",
        {
            "metadata_store_name": "shard-002",
            "compaction_enabled": True,
            "force_empty_binding": True,
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["metadata_store_name"] == "shard-002"
    assert response.json()["compaction_enabled"] is True
    assert clients.viewer.patch("/api/v1/warehouses/acme", {}, format="json").status_code == 403
    assert clients.admin.patch("/api/v1/warehouses/none", {}, format="json").status_code == 404


@pytest.mark.safeguard("reshard-43")
def test_patch_racing_the_block_never_lands_after_it(transactional_db, clients):
    new_store(name="shard-001")
    new_store(name="shard-002")
    new_warehouse(
        org_id="acme",
        state="ready",
        store=MetadataStore.objects.get(name="shard-001"),
        metadata_store_database="acme",
        metadata_store_user="acme",
        metadata_store_password_ref="env:ACME_PW",
    )
    holding = threading.Event()

    def block() -> None:
        try:
            with transaction.atomic():
                lock_org("acme")
                Warehouse.objects.filter(org_id="acme", state="ready").update(state="resharding")
                holding.set()
                time.sleep(1.0)  # the PATCH arrives while the block holds the lock
        finally:
            connection.close()

    blocker = threading.Thread(target=block)
    blocker.start()
    assert holding.wait(10)
    # Forced: the catalog check (which runs before the lock) is not what refuses it here.
    response = clients.internal.patch(
        "/api/v1/warehouses/acme",
        {"metadata_store_name": "shard-002", "force_empty_binding": True},
        format="json",
    )
    blocker.join(10)
    assert response.status_code == 409
    assert response.json()["code"] == "warehouse_resharding"
    assert Warehouse.objects.get(org_id="acme").metadata_store_id == "shard-001"


# --- metadata stores -----------------------------------------------------------------------

STORE = {
    "name": "shard-009",
    "kind": "cnpg",
    "host": "localhost",  # a name that resolves (an unresolvable one is refused: reshard-125)
    "port": 5432,
    "sslmode": "verify-full",
    "provisioner_user": "provisioner",
    "provisioner_password_ref": "k8s:duckgres/shard-009#password",
}


def test_store_create_read_patch(clients):
    response = clients.internal.post("/api/v1/metadata-stores", STORE, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["provisioner_password_ref"] == STORE["provisioner_password_ref"]
    assert body["pooler_port"] is None
    response = clients.internal.post("/api/v1/metadata-stores", STORE, format="json")
    assert response.status_code == 409
    assert error(response) == "metadata store shard-009 already exists"
    assert clients.viewer.get("/api/v1/metadata-stores/shard-009").json() == body
    assert clients.viewer.get("/api/v1/metadata-stores/none").status_code == 404
    listing = clients.viewer.get("/api/v1/metadata-stores").json()["metadata_stores"]
    assert [s["name"] for s in listing] == ["shard-009"]
    response = clients.admin.patch(
        "/api/v1/metadata-stores/shard-009",
        {"pooler_host": "localhost", "pooler_port": 6432, "pooler_sslmode": "require"},
        format="json",
    )
    assert response.status_code == 400  # a weaker mode needs the opt-in (reshard-122)
    assert "tls_policy allow-weaker" in error(response)
    response = clients.admin.patch(
        "/api/v1/metadata-stores/shard-009",
        {
            "pooler_host": "localhost", "pooler_port": 6432, "pooler_sslmode": "require",
            "tls_policy": "allow-weaker", "tls_policy_reason": "the pooler's cert names no host",
        },
        format="json",
    )  # fmt: skip
    assert response.status_code == 200
    assert response.json()["pooler_port"] == 6432
    for immutable in ("name", "kind"):
        response = clients.admin.patch(
            "/api/v1/metadata-stores/shard-009", {immutable: "x"}, format="json"
        )
        assert response.status_code == 400
        assert error(response) == f"invalid body: {immutable}: immutable"
    response = clients.admin.patch(
        "/api/v1/metadata-stores/shard-009", {"provisioner_user": ""}, format="json"
    )
    assert response.status_code == 400
    actions = list(AuditRecord.objects.values_list("action", "status").order_by("id"))
    assert actions[:4] == [
        ("metadata_store.create", 201),
        ("metadata_store.create", 409),
        ("metadata_store.update", 400),
        ("metadata_store.update", 200),
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"name": "Shard_9"}, "invalid body: name: must match"),
        ({"kind": "rds"}, "invalid body: kind: must be one of cnpg, external"),
        ({"port": 0}, "invalid body: port: must be >= 1"),
        ({"sslmode": "sometimes"}, "invalid body: sslmode: must be one of"),
        ({"provisioner_user": ""}, "invalid body: provisioner_user: required for cnpg stores"),
        ({"provisioner_password_ref": "secret"}, "invalid body: provisioner_password_ref: must"),
        ({"provisioner_password": "hunter2-secret"}, "invalid body: provisioner_password: unknown"),
        ({"pooler_port": 6432}, "invalid body: pooler_port: requires pooler_host"),
    ],
)
def test_store_validation(clients, override, message):
    response = clients.internal.post(
        "/api/v1/metadata-stores", {**STORE, **override}, format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith(message)
    assert "hunter2-secret" not in response.content.decode()
    assert MetadataStore.objects.count() == 0


def test_env_refs_need_the_local_launcher(clients, settings):
    settings.DUCKGRES_RESHARD_LAUNCHER = "pod"
    response = clients.internal.post(
        "/api/v1/metadata-stores",
        {**STORE, "provisioner_password_ref": "env:PROV_PW"},
        format="json",
    )
    assert response.status_code == 400
    assert "DUCKGRES_RESHARD_LAUNCHER=local" in error(response)
