"""One live warehouse per catalog (the "hostile inputs" issue, item 5).

Two warehouses bound to the same database would share a catalog: a reshard of one would fence
the other's sessions and ``DROP DATABASE … WITH (FORCE)`` its live catalog. The database refuses
a second live binding (unique indexes, migration 0008), the API refuses it with 409 naming the
other warehouse (also across aliases the indexes cannot see), the start refuses a shared source,
and the runner re-checks before the fence (pre-flip failure) and before the drop (skipped).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from reshard.runner.errors import StepError
from reshard.runner.steps import access, blocking, cleanup, fence_source, record_source
from tests.fixtures.api import clients, published  # the API's identities and Celery capture
from tests.fixtures.rows import new_store, new_warehouse, unique
from tests.fixtures.runner import CnpgWorld, op_log, reload, role_can_login

__all__ = ["clients", "published"]


def _external(org: str, host: str, port: int = 5432, database: str = "cat", **extra: Any) -> Any:
    return new_warehouse(
        org_id=org,
        metadata_store_kind="external",
        metadata_store_host=host,
        metadata_store_port=port,
        metadata_store_database=database,
        metadata_store_user=extra.pop("user", org.replace("-", "_")),
        metadata_store_password_ref="env:X",
        **extra,
    )


# --- the database ----------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-64")
def test_the_database_refuses_a_second_live_binding(db):
    store = new_store(name=unique("s"))
    new_warehouse(
        org_id="first",
        store=store,
        metadata_store_database="cat",
        metadata_store_user="first",
        metadata_store_password_ref="env:X",
    )
    with pytest.raises(IntegrityError, match="warehouse_cnpg_binding_unique"), transaction.atomic():
        new_warehouse(
            org_id="second",
            store=store,
            metadata_store_database="cat",
            metadata_store_user="second",
            metadata_store_password_ref="env:X",
        )
    _external("ext-1", "db.example.com")
    for host in ("DB.Example.com", "db.example.com.", " db.example.com"):
        with (
            pytest.raises(IntegrityError, match="warehouse_external_binding_unique"),
            transaction.atomic(),
        ):
            _external(unique("ext"), host)
    # Another port or database is another catalog; a deleted warehouse holds none.
    _external("ext-2", "db.example.com", port=6543)
    _external("ext-3", "db.example.com", database="other")
    Warehouse.objects.filter(org_id="first").update(state="deleted")
    new_warehouse(
        org_id="third",
        store=store,
        metadata_store_database="cat",
        metadata_store_user="third",
        metadata_store_password_ref="env:X",
    )


@pytest.mark.safeguard("reshard-64")
def test_the_migration_stops_on_existing_duplicates_and_changes_nothing(transactional_db):
    executor = MigrationExecutor(connection)
    before = [("duckgres_admin", "0007_trino_publication_revisions_text")]
    latest = executor.loader.graph.leaf_nodes("duckgres_admin")
    executor.migrate(before)
    try:
        # The store row as that schema has it (later migrations added store columns); the
        # warehouses refer to it by name.
        old_store = executor.loader.project_state(before).apps.get_model(
            "duckgres_admin", "MetadataStore"
        )
        old_store.objects.create(
            name="dup-store", kind="cnpg", host="127.0.0.1", port=5433, sslmode="require",
            provisioner_user="provisioner", provisioner_password_ref="env:X",
        )  # fmt: skip
        store = MetadataStore(name="dup-store", kind="cnpg")
        for org in ("dup-a", "dup-b"):
            new_warehouse(
                org_id=org,
                store=store,
                metadata_store_database="shared",
                metadata_store_user=org.replace("-", "_"),
                metadata_store_password_ref="env:X",
            )
        for org in ("ext-a", "ext-b"):
            _external(org, "Pg.Example." if org == "ext-a" else "pg.example")
        executor = MigrationExecutor(connection)
        with pytest.raises(RuntimeError) as raised:
            executor.migrate(latest)
        message = str(raised.value)
        assert message.startswith(
            "cannot add the one-warehouse-per-catalog unique indexes: live warehouses share a "
            "catalog:\n"
            "  - database shared on cnpg store dup-store: warehouses dup-a, dup-b\n"
            "  - database cat on external server pg.example:5432: warehouses ext-a, ext-b\n"
        )
        assert "Nothing was changed." in message
        assert Warehouse.objects.count() == 4  # nothing deleted or re-pointed
    finally:
        Warehouse.objects.filter(org_id__in=["dup-b", "ext-b"]).update(state="deleted")
        MigrationExecutor(connection).migrate(latest)
    with pytest.raises(IntegrityError), transaction.atomic():
        Warehouse.objects.filter(org_id="dup-b").update(state="ready")


# --- the API ---------------------------------------------------------------------------------


def _binding(org: str, store: str, database: str = "cat", user: str = "") -> dict[str, Any]:
    return {
        "org_id": org,
        "state": "ready",
        "metadata_store_kind": "cnpg",
        "metadata_store_name": store,
        "metadata_store_database": database,
        "metadata_store_user": user or org.replace("-", "_"),
        "metadata_store_password_ref": "env:ACME_PW",
    }


@pytest.mark.safeguard("reshard-64")
def test_the_api_refuses_a_second_binding_naming_the_other_warehouse(clients):
    store = new_store(name="shard-a")
    new_store(name="shard-a-alias")  # the same server under another row
    assert (
        clients.internal.post(
            "/api/v1/warehouses", _binding("owner", "shard-a"), format="json"
        ).status_code
        == 201
    )
    cases = [
        _binding("copycat", "shard-a"),
        _binding("alias", "shard-a-alias"),
        {
            "org_id": "ext",
            "metadata_store_kind": "external",
            "metadata_store_host": store.host.upper(),
            "metadata_store_port": store.port,
            "metadata_store_database": "cat",
            "metadata_store_user": "ext",
            "metadata_store_password_ref": "env:ACME_PW",
        },
    ]
    labels = ["store shard-a", "store shard-a-alias", f"{store.host.upper()}:{store.port}"]
    for body, label in zip(cases, labels, strict=True):
        response = clients.internal.post("/api/v1/warehouses", body, format="json")
        assert response.status_code == 409, response.content
        assert response.json() == {
            "code": "binding_in_use",
            "error": f"metadata_store_database: database cat on {label} is already the catalog "
            "of warehouse owner; a catalog belongs to one warehouse (bind this one to its own "
            "database, or move the other first)",
        }
    assert Warehouse.objects.count() == 1
    # A PATCH that would create the duplicate is refused the same way, and changes nothing.
    assert (
        clients.internal.post(
            "/api/v1/warehouses", _binding("mover", "shard-a", database="mine"), format="json"
        ).status_code
        == 201
    )
    response = clients.internal.patch(
        "/api/v1/warehouses/mover", {"metadata_store_database": "cat"}, format="json"
    )
    assert response.status_code == 409
    assert "already the catalog of warehouse owner" in response.json()["error"]
    assert Warehouse.objects.get(org_id="mover").metadata_store_database == "mine"
    # Back from the dead onto a catalog someone else owns now: refused too.
    Warehouse.objects.filter(org_id="owner").update(state="deleted")
    assert (
        clients.internal.patch(
            "/api/v1/warehouses/mover",
            {"metadata_store_database": "cat", "force_empty_binding": True},  # no catalog cat
            format="json",
        ).status_code
        == 200
    )
    response = clients.internal.patch("/api/v1/warehouses/owner", {"state": "ready"}, format="json")
    assert response.status_code == 409
    assert "already the catalog of warehouse mover" in response.json()["error"]


@pytest.mark.safeguard("reshard-64")
def test_a_start_refuses_a_shared_source_catalog(
    clients, published, store_clusters, tenant_catalog
):
    catalog = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source)
    alias = new_store(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = new_warehouse(store=source, catalog=catalog)
    other = new_warehouse(  # a legacy row through an alias (the index cannot see it)
        org_id=unique("other"),
        store=alias,
        metadata_store_database=catalog.database,
        metadata_store_user="someone_else",
        metadata_store_password_ref=catalog.password_ref,
    )
    response = clients.internal.post(
        f"/api/v1/warehouses/{warehouse.org_id}/reshards",
        {"target": {"type": "cnpg", "cnpg_shard": target.name}},
        format="json",
    )
    assert response.status_code == 409
    assert response.json()["error"] == (
        f"source database {catalog.database} on store {source.name} is also the catalog of "
        f"warehouse {other.org_id}: a reshard would fence its sessions and drop it; give each "
        "warehouse its own catalog before resharding"
    )
    # An external source bound to the same server and database as a cnpg binding: refused too.
    external = new_warehouse(
        catalog=catalog, metadata_store_kind="external", metadata_store_user="third_role"
    )
    response = clients.internal.post(
        f"/api/v1/warehouses/{external.org_id}/reshards",
        {"target": {"type": "cnpg", "cnpg_shard": target.name}},
        format="json",
    )
    assert response.status_code == 409
    assert response.json()["error"].startswith(
        f"source database {catalog.database} on {catalog.cluster.host}:{catalog.cluster.port} "
        "is also the catalog of warehouse "
    )
    assert ReshardOperation.objects.count() == 0


# --- the runner ------------------------------------------------------------------------------


def _share_source(world: CnpgWorld) -> Warehouse:
    """Another org bound to the world's source catalog through an alias store row (what the
    API now refuses, created behind its back)."""
    alias = new_store(world.catalog.cluster)
    return new_warehouse(
        org_id=unique("sharer"),
        store=alias,
        metadata_store_database=world.catalog.database,
        metadata_store_user="sharer_role",
        metadata_store_password_ref=world.catalog.password_ref,
    )


@pytest.mark.safeguard("reshard-64")
def test_the_fence_refuses_a_catalog_shared_since_the_submit(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    record_source.run(env)
    access.run(env)
    other = _share_source(cnpg_world)
    tenant = cnpg_world.catalog.tenant_conn()  # the other org's live session, as far as we know
    try:
        with pytest.raises(StepError) as raised:
            fence_source.run(env)
        assert str(raised.value).startswith(
            f"source database {cnpg_world.catalog.database} on store "
            f"{cnpg_world.source_store.name} is also the catalog of warehouse {other.org_id}: "
            f"refusing to fence role {cnpg_world.catalog.role}"
        )
        tenant.execute("SELECT 1")  # not terminated
    finally:
        tenant.close()
    assert role_can_login(cnpg_world.catalog.cluster, cnpg_world.catalog.role) is True
    assert reload(env.op).source_fence_requested_at is None


@pytest.mark.safeguard("reshard-64")
def test_the_drop_is_skipped_for_a_catalog_shared_since_the_submit(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    record_source.run(env)
    other = _share_source(cnpg_world)
    cleanup.drop_source(env)
    with cnpg_world.catalog.cluster.superuser_conn() as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [cnpg_world.catalog.database]
        ).fetchone()
    assert row is not None  # not dropped
    assert reload(env.op).source_dropped_at is None
    [line] = [m for m in op_log(env.op.id) if "must be dropped manually" in m]
    assert line == (
        "source database must be dropped manually once it is no longer shared: source database "
        f"{cnpg_world.catalog.database} on store {cnpg_world.source_store.name} is also the "
        f"catalog of warehouse {other.org_id}, so DROP DATABASE was not sent (nothing was "
        "deleted); decide which warehouse owns it before dropping anything"
    )


@pytest.mark.safeguard("reshard-64")
def test_record_source_checks_the_database_and_user_of_a_cnpg_binding(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    """The drift check used to compare only the store name: a binding re-pointed at another
    database of the same store passed it."""
    ReshardOperation.objects.filter(id=cnpg_world.op.id).update(source_database="elsewhere")
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    with pytest.raises(StepError, match="metadata-store identity drift: the binding now names "):
        record_source.run(env)
    assert reload(env.op).source_endpoint == ""  # nothing recorded
    # The message quotes the binding's database: a hostile one named after the provisioner
    # password is scrubbed, because the scrubber learns the step's secrets before any check.
    password = cnpg_world.catalog.cluster.provisioner_password
    Warehouse.objects.filter(org_id=env.op.org_id).update(metadata_store_database=password)
    env.ctx.scrubber = process_scrubber()  # a fresh runner's: it knows only the shared secrets
    with pytest.raises(StepError) as raised:
        record_source.run(env)
    shown = env.ctx.scrubber.scrub(str(raised.value))
    assert password not in shown
    assert "the binding now names database *** (user" in shown
