"""Safeguard 72: a warehouse PATCH repoints the binding only to a database holding a DuckLake
catalog (``reshard/warehouses/binding_catalog.py``), unless the caller sends
``"force_empty_binding": true``, which is audited with the old and the new binding. Real stores
(5433/5434)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from duckgres_admin.models import AuditRecord, MetadataStore, Warehouse
from reshard.warehouses import rules
from tests.fixtures.api import error
from tests.fixtures.rows import new_store, new_warehouse, unique
from tests.fixtures.stores import StoreClusters, TenantCatalog

FIX = (
    "bind the database that holds this warehouse's catalog, or, to repoint anyway (you know "
    'the catalog will be created or restored there) send "force_empty_binding": true'
)


@dataclass
class World:
    clusters: StoreClusters
    home: TenantCatalog  # the warehouse's catalog, on the source cluster
    source: MetadataStore
    target: MetadataStore  # the target cluster as a cnpg store
    warehouse: Warehouse

    @property
    def path(self) -> str:
        return f"/api/v1/warehouses/{self.warehouse.org_id}"

    def binding(self) -> dict[str, Any]:
        warehouse = Warehouse.objects.get(org_id=self.warehouse.org_id)
        return rules._warehouse_values(warehouse)


@pytest.fixture
def world(clients: Any, store_clusters: StoreClusters, tenant_catalog: Any) -> World:
    home = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source, name=unique("src"))
    target = new_store(store_clusters.target, name=unique("tgt"))
    warehouse = new_warehouse(store=source, catalog=home)
    return World(store_clusters, home, source, target, warehouse)


def _cnpg(store: MetadataStore, catalog: TenantCatalog) -> dict[str, Any]:
    return {
        "metadata_store_name": store.name,
        "metadata_store_database": catalog.database,
        "metadata_store_user": catalog.role,
        "metadata_store_password_ref": catalog.password_ref,
    }


def _external(catalog: TenantCatalog) -> dict[str, Any]:
    return {
        "metadata_store_kind": "external",
        "metadata_store_name": "",
        "metadata_store_host": catalog.cluster.host,
        "metadata_store_port": catalog.cluster.port,
        "metadata_store_sslmode": "verify-full",
        "metadata_store_database": catalog.database,
        "metadata_store_user": catalog.role,
        "metadata_store_password_ref": catalog.password_ref,
    }


def _no_secret(response: Any, *passwords: str) -> None:
    texts = [response.content.decode(), *AuditRecord.objects.values_list("detail", flat=True)]
    for password in passwords:
        assert all(password not in text for text in texts)


@pytest.mark.safeguard("reshard-72")
def test_a_repoint_to_a_database_without_catalog_is_refused_and_changes_nothing(
    clients, world, tenant_catalog
):
    before = world.binding()
    target = world.clusters.target
    empty = tenant_catalog(target, with_tables=False)
    provisioner = target.provisioner_password
    # The warehouse's database does not exist on the target store.
    response = clients.admin.patch(
        world.path, {"metadata_store_name": world.target.name}, format="json"
    )
    assert response.status_code == 409, response.content
    assert response.json() == {
        "code": "binding_without_catalog",
        "error": f"metadata_store_database: database {world.home.database} does not exist on "
        f"store {world.target.name}, so it holds no DuckLake catalog; {FIX}",
    }
    # It exists, without a ducklake_* table (cnpg: read with the store's provisioner).
    response = clients.admin.patch(world.path, _cnpg(world.target, empty), format="json")
    assert response.status_code == 409, response.content
    assert response.json() == {
        "code": "binding_without_catalog",
        "error": f"metadata_store_database: store {world.target.name} has no DuckLake catalog in "
        f"database {empty.database} (no ducklake_* tables in its public schema); {FIX}",
    }
    # External: read with the binding's own tenant credentials.
    response = clients.admin.patch(world.path, _external(empty), format="json")
    assert response.status_code == 409, response.content
    assert response.json() == {
        "code": "binding_without_catalog",
        "error": f"metadata_store_database: external server 127.0.0.1:{target.port} has no "
        f"DuckLake catalog in database {empty.database} (no ducklake_* tables in its public "
        f"schema); {FIX}",
    }
    # An explicit false is the normal path.
    response = clients.admin.patch(
        world.path, {**_cnpg(world.target, empty), "force_empty_binding": False}, format="json"
    )
    assert response.status_code == 409
    assert world.binding() == before
    audits = list(AuditRecord.objects.values_list("action", "status", "actor").order_by("id"))
    assert audits == [("warehouse.update", 409, "admin@example.com")] * 4
    _no_secret(response, provisioner, empty.password, world.home.password)


@pytest.mark.safeguard("reshard-72")
def test_a_forced_repoint_is_applied_and_audited_as_overridden(clients, world, tenant_catalog):
    empty = tenant_catalog(world.clusters.target, with_tables=False)
    body = {**_cnpg(world.target, empty), "force_empty_binding": True}
    response = clients.admin.patch(world.path, body, format="json")
    assert response.status_code == 200, response.content
    assert "force_empty_binding" not in response.json()
    assert response.json()["metadata_store_name"] == world.target.name
    assert response.json()["metadata_store_database"] == empty.database
    row = Warehouse.objects.get(org_id=world.warehouse.org_id)
    assert (row.metadata_store_id, row.metadata_store_database) == (
        world.target.name,
        empty.database,
    )
    [audit] = AuditRecord.objects.all()
    home, src, tgt = world.home, world.source.name, world.target.name
    assert (audit.action, audit.status, audit.actor) == (
        "warehouse.update",
        200,
        "admin@example.com",
    )
    assert audit.detail == (
        "updated metadata_store, metadata_store_database, metadata_store_password_ref, "
        f"metadata_store_user (metadata_store_name '{src}' → '{tgt}', metadata_store_database "
        f"'{home.database}' → '{empty.database}', metadata_store_user '{home.role}' → "
        f"'{empty.role}', metadata_store_password_ref '{home.password_ref}' → "
        f"'{empty.password_ref}'); catalog check overridden (force_empty_binding): binding "
        f"cnpg store {src} database {home.database} user {home.role} → cnpg store {tgt} "
        f"database {empty.database} user {empty.role}, not checked for a DuckLake catalog"
    )
    _no_secret(response, world.clusters.target.provisioner_password, empty.password)
    # The flag is never stored: the next repoint is checked again.
    response = clients.admin.patch(world.path, _cnpg(world.source, world.home), format="json")
    assert response.status_code == 200, response.content
    response = clients.admin.patch(
        world.path, {"metadata_store_name": world.target.name}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "binding_without_catalog"


@pytest.mark.safeguard("reshard-72")
def test_a_repoint_to_a_catalog_needs_no_flag(clients, world, tenant_catalog):
    target = world.clusters.target
    empty = tenant_catalog(target, with_tables=False)
    there = tenant_catalog(target)  # a DuckLake catalog on the target cluster
    assert (
        clients.admin.patch(world.path, _cnpg(world.target, empty), format="json").status_code
        == 409
    )
    response = clients.admin.patch(world.path, _cnpg(world.target, there), format="json")
    assert response.status_code == 200, response.content
    assert response.json()["metadata_store_database"] == there.database
    # External binding to the same catalog, read with the tenant's own login.
    response = clients.admin.patch(world.path, _external(there), format="json")
    assert response.status_code == 200, response.content
    row = Warehouse.objects.get(org_id=world.warehouse.org_id)
    assert (row.metadata_store_kind, row.metadata_store_port) == ("external", target.port)
    details = list(AuditRecord.objects.filter(status=200).values_list("detail", flat=True))
    assert len(details) == 2
    assert all("overridden" not in d for d in details)
    assert details[0].startswith("updated metadata_store, metadata_store_database, ")


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, None, [], {}])
def test_the_flag_must_be_a_json_boolean(clients, value):
    warehouse = new_warehouse(
        store=new_store(name=unique("s")),
        metadata_store_database="cat",
        metadata_store_user="tenant_a",
        metadata_store_password_ref="env:ACME_PW",
    )
    other = new_store(name=unique("t"))
    body = {"metadata_store_name": other.name, "force_empty_binding": value}
    response = clients.admin.patch(f"/api/v1/warehouses/{warehouse.org_id}", body, format="json")
    assert response.status_code == 400, response.content
    assert error(response) == (
        "invalid body: force_empty_binding: must be a JSON boolean (true: repoint the binding "
        "without checking that it holds a DuckLake catalog; false or absent: check it)"
    )
    assert (
        Warehouse.objects.get(org_id=warehouse.org_id).metadata_store_id
        == warehouse.metadata_store_id
    )
    # A create has no catalog check to override.
    response = clients.admin.post(
        "/api/v1/warehouses", {"org_id": unique("org"), "force_empty_binding": True}, format="json"
    )
    assert response.status_code == 400
    assert error(response) == (
        "invalid body: force_empty_binding: accepted only on PATCH /api/v1/warehouses/<org> (a "
        "create's binding is not checked for a catalog); remove it"
    )


class CountingListener:
    """A TCP port on loopback that counts the connections it accepts and closes each at once
    (a metadata store that cannot be checked; the count shows whether a PATCH probed it)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.sock.settimeout(0.1)
        self.accepted = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            conn.close()

    @property
    def count(self) -> int:
        with self._lock:
            return self.accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    found = CountingListener()
    yield found
    found.close()


@pytest.mark.safeguard("reshard-72")
def test_only_a_repoint_probes_and_an_unreachable_store_is_refused(clients, listener):
    dark = new_store(name=unique("dark"), host="127.0.0.1", port=listener.port)
    warehouse = new_warehouse(
        store=dark,
        metadata_store_database="cat",
        metadata_store_user="tenant_a",
        metadata_store_password_ref="env:ACME_PW",
    )
    path = f"/api/v1/warehouses/{warehouse.org_id}"
    for body in (
        {"data_bucket": "b"},
        {"compaction_enabled": True, "state": "failed"},
        {"metadata_store_user": "tenant_b", "metadata_store_password_ref": "env:TENANT_PW"},
        {"metadata_store_name": dark.name, "metadata_store_database": "cat"},  # unchanged
        {"metadata_store_kind": "cnpg", "force_empty_binding": True},  # nothing to override
    ):
        response = clients.admin.patch(path, body, format="json")
        assert response.status_code == 200, (body, response.content)
    assert listener.count == 0
    assert all("overridden" not in d for d in AuditRecord.objects.values_list("detail", flat=True))
    # A repoint is probed; a store that cannot be checked refuses it (503), changing nothing.
    response = clients.admin.patch(path, {"metadata_store_database": "elsewhere"}, format="json")
    assert response.status_code == 503, response.content
    assert listener.count >= 1
    body = response.json()
    assert body["code"] == "catalog_check_unavailable"
    assert body["error"].startswith(
        f"metadata_store_name: cannot check store {dark.name} for a DuckLake catalog in "
        "database elsewhere: as provisioner: "
    )
    assert body["error"].endswith(
        "; a binding is never repointed unchecked: retry when the store accepts connections, or, "
        "to repoint anyway (you know the catalog will be created or restored there) send "
        '"force_empty_binding": true'
    )
    assert Warehouse.objects.get(org_id=warehouse.org_id).metadata_store_database == "cat"
    # Forced: applied without a probe.
    probes = listener.count
    response = clients.admin.patch(
        path, {"metadata_store_database": "elsewhere", "force_empty_binding": True}, format="json"
    )
    assert response.status_code == 200, response.content
    assert listener.count == probes
    assert Warehouse.objects.get(org_id=warehouse.org_id).metadata_store_database == "elsewhere"
    audit = AuditRecord.objects.order_by("-id").first()
    assert audit is not None
    assert audit.detail.endswith(
        f"catalog check overridden (force_empty_binding): binding cnpg store {dark.name} "
        f"database cat user tenant_b → cnpg store {dark.name} database elsewhere user tenant_b, "
        "not checked for a DuckLake catalog"
    )
