"""Tenant role identity (the "hostile inputs" issue, item 4).

A reshard acts on two roles: the source role it fences (NOLOGIN), un-fences (LOGIN) and drops
as, and the target role it creates or adopts (``ALTER ROLE … LOGIN PASSWORD``) and may set
NOLOGIN on rollback. Neither may be the provisioner, ``postgres``, a ``pg_*`` or privileged
role, a member of another role, a role another warehouse uses, or one owning other databases.
One function (``reshard.engines.identity.tenant_role_message``) decides, at submit and again in the
runner right before each role statement.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.utils import timezone
from psycopg import sql

from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from reshard.engines import identity
from reshard.runner import connections
from reshard.runner.errors import StepError
from reshard.runner.execute import reconstruct
from reshard.runner.rollback import rollback
from reshard.runner.steps import access, blocking, cutover, fence_source, record_source
from tests.fixtures.api import clients, published  # the API's identities and Celery capture
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.runner import CnpgWorld, op_log, reload, role_can_login
from tests.fixtures.stores import StoreCluster, drop_tenant

__all__ = ["clients", "published"]


@pytest.fixture
def make_role(store_clusters: Any) -> Iterator[Callable[..., str]]:
    """``make_role(cluster, *attributes, password=None, name=None)`` as the superuser; dropped
    (with what it owns) on both clusters after the test."""
    made: list[str] = []

    def factory(
        cluster: StoreCluster, *attributes: str, password: str | None = None, name: str = ""
    ) -> str:
        role = name or f"r_{secrets.token_hex(5)}"
        options = " ".join(("LOGIN", *attributes))
        with cluster.superuser_conn() as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} " + options + " PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password or secrets.token_urlsafe(18))
                )
            )
        made.append(role)
        return role

    yield factory
    for role in made:
        for cluster in store_clusters:
            drop_tenant(cluster, role)


def password_hash(cluster: StoreCluster, role: str) -> str:
    with cluster.superuser_conn() as conn:
        row = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role]
        ).fetchone()
    assert row is not None
    return str(row[0])


def check(
    store: MetadataStore,
    cluster: StoreCluster,
    role: str,
    *,
    org: str = "org-x",
    database: str = "",
) -> str | None:
    with cluster.provisioner_conn() as conn:
        return identity.tenant_role_message(
            conn, org_id=org, role=role, database=database or role, store=store
        )


# --- the rule --------------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-63")
def test_reserved_and_provisioner_roles_are_refused(db, store_clusters):
    store = new_store(store_clusters.target)
    assert "is the provisioner of store" in str(check(store, store_clusters.target, "provisioner"))
    for role in ("postgres", "pg_monitor", "pg_write_server_files"):
        message = check(store, store_clusters.target, role)
        assert message == (
            f"tenant role {role} on store {store.name} is a reserved PostgreSQL role: a "
            "reshard never alters it; bind the warehouse to a role of its own"
        )
    # Without a connection (submit, store unreachable) the name rules still hold.
    assert identity.tenant_role_message(
        None, org_id="o", role="provisioner", database="d", store=store
    )


@pytest.mark.safeguard("reshard-63")
@pytest.mark.parametrize(
    ("attribute", "label"),
    [
        ("SUPERUSER", "superuser"),
        ("CREATEROLE", "createrole"),
        ("CREATEDB", "createdb"),
        ("REPLICATION", "replication"),
        ("BYPASSRLS", "bypassrls"),
    ],
)
def test_privileged_roles_are_refused(db, store_clusters, make_role, attribute, label):
    store = new_store(store_clusters.target)
    role = make_role(store_clusters.target, attribute)
    assert check(store, store_clusters.target, role) == (
        f"tenant role {role} on store {store.name} has {label}: a tenant role is never "
        "privileged, and a reshard never alters a privileged role"
    )


@pytest.mark.safeguard("reshard-63")
def test_a_member_of_another_role_is_refused(db, store_clusters, make_role, tenant_catalog):
    store = new_store(store_clusters.target)
    other = tenant_catalog(store_clusters.target)  # another tenant's role
    role = make_role(store_clusters.target)
    with store_clusters.target.superuser_conn() as conn:
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(other.role), sql.Identifier(role))
        )
    assert check(store, store_clusters.target, role) == (
        f"tenant role {role} on store {store.name} is a member of {other.role}: a tenant role "
        "inherits nothing (REVOKE the membership, or use another role)"
    )
    # The tenant's own role, of which the provisioner is a member, is fine.
    assert check(store, store_clusters.target, other.role) is None


@pytest.mark.safeguard("reshard-63")
def test_a_role_owning_another_database_is_refused(db, store_clusters, tenant_catalog):
    store = new_store(store_clusters.target)
    other = tenant_catalog(store_clusters.target)
    assert check(store, store_clusters.target, other.role, database="acme_new") == (
        f"tenant role {other.role} on store {store.name} owns other databases ({other.database}), "
        "not only the tenant's acme_new: it is not this warehouse's role alone"
    )
    assert check(store, store_clusters.target, other.role, database=other.database) is None
    assert check(store, store_clusters.target, "no_such_role_yet") is None


@pytest.mark.safeguard("reshard-63")
def test_a_role_another_warehouse_uses_on_the_server_is_refused(db, store_clusters):
    store = new_store(store_clusters.target)
    alias = new_store(store_clusters.target)  # another row for the same server
    new_warehouse(
        org_id="owner-org",
        store=alias,
        metadata_store_database="owner_db",
        metadata_store_user="shared_role",
        metadata_store_password_ref="env:X",
    )
    assert check(store, store_clusters.target, "shared_role") == (
        f"tenant role shared_role on store {store.name} is also the role of warehouse "
        "owner-org: a reshard never alters a role another warehouse uses"
    )
    assert check(store, store_clusters.target, "shared_role", org="owner-org") is None
    Warehouse.objects.filter(org_id="owner-org").update(state="deleted")
    assert check(store, store_clusters.target, "shared_role") is None


@pytest.mark.safeguard("reshard-63")
def test_a_role_another_org_is_moving_to_is_refused(db, store_clusters):
    store = new_store(store_clusters.target)
    other = new_warehouse(  # bound elsewhere (the source cluster), moving onto the target
        org_id="mover",
        store=new_store(store_clusters.source),
        metadata_store_database="incoming",
        metadata_store_user="incoming",
        metadata_store_password_ref="env:X",
    )
    op = new_op(
        other,
        target_kind="cnpg",
        to_shard=store.name,
        target_user="incoming",
        target_database="incoming",
        state="running",
    )
    assert check(store, store_clusters.target, "incoming") == (
        f"tenant role incoming on store {store.name} is the target role of reshard operation "
        f"{op.id} of warehouse mover: a role is never shared by two warehouses"
    )


# --- at submit (the API) -----------------------------------------------------------------------


def _external_to_cnpg(tenant_catalog: Any, store_clusters: Any) -> tuple[Warehouse, MetadataStore]:
    catalog = tenant_catalog(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = new_warehouse(catalog=catalog, metadata_store_kind="external")
    return warehouse, target


@pytest.mark.safeguard("reshard-63")
def test_an_external_start_naming_the_provisioner_never_rotates_its_password(
    clients, published, store_clusters, tenant_catalog
):
    warehouse, target = _external_to_cnpg(tenant_catalog, store_clusters)
    before = password_hash(store_clusters.target, "provisioner")
    ref = "env:DUCKGRES_TEST_PW_CHOSEN"
    os.environ["DUCKGRES_TEST_PW_CHOSEN"] = "a-password-the-requester-chose"
    try:
        for dry_run in (True, False):
            response = clients.internal.post(
                f"/api/v1/warehouses/{warehouse.org_id}/reshards",
                {
                    "target": {
                        "type": "cnpg",
                        "cnpg_shard": target.name,
                        "user": "provisioner",
                        "database": "anything",
                        "password_secret_ref": ref,
                    },
                    "dry_run": dry_run,
                },
                format="json",
            )
            expected = (
                f"target tenant role provisioner is the provisioner of store {target.name}: a "
                "reshard never logs in as, alters or fences the provisioner; bind the warehouse "
                "to its own role"
            )
            if dry_run:
                entry = {e["check"]: e for e in response.json()["preflight"]}
                assert entry["target_database_owner"] == {
                    "check": "target_database_owner",
                    "ok": False,
                    "detail": f"{expected} (start would answer 400)",
                }
            else:
                assert response.status_code == 400
                assert response.json()["error"] == expected
    finally:
        os.environ.pop("DUCKGRES_TEST_PW_CHOSEN", None)
    assert ReshardOperation.objects.count() == 0
    assert password_hash(store_clusters.target, "provisioner") == before


@pytest.mark.safeguard("reshard-63")
def test_an_external_start_adopting_a_privileged_or_foreign_role_is_refused(
    clients, published, store_clusters, tenant_catalog, make_role
):
    warehouse, target = _external_to_cnpg(tenant_catalog, store_clusters)
    privileged = make_role(store_clusters.target, "CREATEDB")
    foreign = tenant_catalog(store_clusters.target)  # owns its database on the target
    for role, fragment in (
        (privileged, "has createdb"),
        (foreign.role, "owns other databases"),
    ):
        response = clients.internal.post(
            f"/api/v1/warehouses/{warehouse.org_id}/reshards",
            {
                "target": {
                    "type": "cnpg",
                    "cnpg_shard": target.name,
                    "user": role,
                    "database": unique("db").replace("-", "_"),
                    "password_secret_ref": warehouse.metadata_store_password_ref,
                }
            },
            format="json",
        )
        assert response.status_code == 400, response.content
        assert fragment in response.json()["error"]
    assert ReshardOperation.objects.count() == 0


@pytest.mark.safeguard("reshard-63")
def test_a_source_role_shared_with_another_warehouse_is_refused(
    clients, published, store_clusters, tenant_catalog
):
    catalog = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = new_warehouse(store=source, catalog=catalog)
    # A legacy row (the API refuses it now): another org bound to the same role on the store.
    new_warehouse(
        org_id=unique("other"),
        store=source,
        metadata_store_database="other_db",
        metadata_store_user=catalog.role,
        metadata_store_password_ref=catalog.password_ref,
    )
    response = clients.internal.post(
        f"/api/v1/warehouses/{warehouse.org_id}/reshards",
        {"target": {"type": "cnpg", "cnpg_shard": target.name}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"source tenant role {catalog.role} on store")
    assert "is also the role of warehouse other-" in response.json()["error"]
    assert ReshardOperation.objects.count() == 0


@pytest.mark.safeguard("reshard-63")
def test_a_binding_to_the_provisioner_or_a_shared_role_is_refused(clients):
    store = new_store(name=unique("s"))
    body = {
        "org_id": unique("org"),
        "metadata_store_kind": "cnpg",
        "metadata_store_name": store.name,
        "metadata_store_database": "acme",
        "metadata_store_user": "provisioner",
        "metadata_store_password_ref": "env:ACME_PW",
    }
    response = clients.internal.post("/api/v1/warehouses", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "invalid body: metadata_store_user: tenant role provisioner is the provisioner of store"
    )
    body["metadata_store_user"] = "acme"
    assert clients.internal.post("/api/v1/warehouses", body, format="json").status_code == 201
    second = {**body, "org_id": unique("org"), "metadata_store_database": "other"}
    response = clients.internal.post("/api/v1/warehouses", second, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "binding_in_use"
    assert f"is also the role of warehouse {body['org_id']}" in response.json()["error"]


# --- in the runner, right before each role statement -----------------------------------------


@pytest.mark.safeguard("reshard-63")
def test_cutover_never_adopts_a_role_that_became_privileged(
    cnpg_world: CnpgWorld, claimed_env: Any, store_clusters: Any, make_role: Any
) -> None:
    """The role did not exist at submit; by the cutover an equally named role with CREATEDB
    exists on the target: the runner refuses before ``ALTER ROLE``; its password and
    attributes are unchanged."""
    role = cnpg_world.catalog.role
    make_role(store_clusters.target, "CREATEDB", name=role)
    before = password_hash(store_clusters.target, role)
    env = claimed_env(cnpg_world.op)
    prov = connections.provisioner(env.ctx, cnpg_world.target_store.name)
    with pytest.raises(StepError, match=rf"target tenant role {role} on store .* has createdb"):
        cutover.render_target(env, prov, cnpg_world.catalog.password)
    assert password_hash(store_clusters.target, role) == before
    with store_clusters.target.superuser_conn() as conn:
        row = conn.execute(
            "SELECT rolcreatedb, pg_has_role('provisioner', %s, 'MEMBER') FROM pg_roles "
            "WHERE rolname = %s",
            [role, role],
        ).fetchone()
    assert row == (True, False)  # no GRANT either


@pytest.mark.safeguard("reshard-63")
def test_cutover_never_touches_the_provisioner_named_by_an_old_operation(
    cnpg_world: CnpgWorld, claimed_env: Any, store_clusters: Any
) -> None:
    ReshardOperation.objects.filter(id=cnpg_world.op.id).update(target_user="provisioner")
    before = password_hash(store_clusters.target, "provisioner")
    env = claimed_env(cnpg_world.op)
    prov = connections.provisioner(env.ctx, cnpg_world.target_store.name)
    with pytest.raises(StepError, match="is the provisioner of store"):
        cutover.render_target(env, prov, "the-requesters-password")
    assert password_hash(store_clusters.target, "provisioner") == before
    store_clusters.target.provisioner_conn().close()  # still logs in with its own password


@pytest.mark.safeguard("reshard-63")
def test_the_fence_refuses_a_role_another_warehouse_came_to_use(
    cnpg_world: CnpgWorld, claimed_env: Any
) -> None:
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    record_source.run(env)
    access.run(env)
    # After submit (and after the block), another org is bound to the same role on the store.
    new_warehouse(
        org_id=unique("late"),
        store=cnpg_world.source_store,
        metadata_store_database="late_db",
        metadata_store_user=cnpg_world.catalog.role,
        metadata_store_password_ref=cnpg_world.catalog.password_ref,
    )
    with pytest.raises(StepError, match=r"is also the role of warehouse late-.*refusing to fence"):
        fence_source.run(env)
    assert role_can_login(cnpg_world.catalog.cluster, cnpg_world.catalog.role) is True
    assert reload(env.op).source_fence_requested_at is None
    assert not any("NOLOGIN sent" in line for line in op_log(env.op.id))


@pytest.mark.safeguard("reshard-63")
def test_rollback_never_sets_a_foreign_role_nologin(
    cnpg_world: CnpgWorld, claimed_env: Any, store_clusters: Any, make_role: Any
) -> None:
    """The op recorded a rendered target; the role on the target is now another warehouse's:
    the rollback leaves it LOGIN and says why."""
    role = cnpg_world.catalog.role
    make_role(store_clusters.target, name=role)
    new_warehouse(
        org_id=unique("taken"),
        store=cnpg_world.target_store,
        metadata_store_database="taken_db",
        metadata_store_user=role,
        metadata_store_password_ref=cnpg_world.catalog.password_ref,
    )
    ReshardOperation.objects.filter(id=cnpg_world.op.id).update(target_rendered_at=timezone.now())
    env = claimed_env(cnpg_world.op)
    env.ctx.progress = reconstruct(reload(env.op))
    rollback(env)
    assert role_can_login(store_clusters.target, role) is True
    assert any(
        "rollback: could not set the target tenant role NOLOGIN: target tenant role" in line
        and "is also the role of warehouse taken-" in line
        for line in op_log(env.op.id)
    ), op_log(env.op.id)


@pytest.mark.safeguard("reshard-63")
def test_the_source_role_check_runs_on_the_store(
    cnpg_world: CnpgWorld, claimed_env: Any, store_clusters: Any
) -> None:
    """recordSource (the block step) reads the role on the source store: a source role that
    was given CREATEDB since the submit fails the operation before any fence."""
    with store_clusters.source.superuser_conn() as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(cnpg_world.catalog.role))
        )
    env = claimed_env(cnpg_world.op)
    blocking.block_warehouse(env)
    with pytest.raises(
        StepError, match=r"source tenant role .* has createdb: .*; refusing to proceed"
    ):
        record_source.run(env)
