"""Identities (spec §5): three secrets, each only on its routes; staff roles; audit rows."""

from __future__ import annotations

import pytest

from duckgres_admin.models import AuditRecord, ReshardLogEntry
from tests.fixtures.api import error
from tests.fixtures.rows import new_op, new_store, new_warehouse

OPERATOR_GETS = [
    "/api/v1/reshards",
    "/api/v1/reshards/targets",
    "/api/v1/warehouses",
    "/api/v1/metadata-stores",
]


@pytest.mark.safeguard("reshard-50")
@pytest.mark.parametrize("path", OPERATOR_GETS)
def test_operator_routes_accept_internal_and_staff_only(clients, path):
    assert clients.internal.get(path).status_code == 200
    assert clients.admin.get(path).status_code == 200
    assert clients.viewer.get(path).status_code == 200
    assert clients.superuser.get(path).status_code == 200  # no operator row: viewer
    for other in (clients.runner, clients.dataplane):
        response = other.get(path)
        assert response.status_code == 403
        assert error(response) == "this secret is not accepted on this route"
    assert clients.anon.get(path).status_code == 401
    response = clients.disabled.get(path)
    assert response.status_code == 403
    assert error(response) == "operator disabled"


@pytest.mark.safeguard("reshard-50")
def test_a_foreign_secret_never_falls_through_to_a_valid_session(clients, settings):
    # An admin session plus the runner secret header: refused, not treated as the admin.
    clients.admin.credentials(HTTP_X_DUCKGRES_RUNNER_SECRET=settings.DUCKGRES_RUNNER_SECRET)
    assert clients.admin.get("/api/v1/reshards").status_code == 403
    # The internal secret on the lease route, even together with the data-plane header value.
    clients.internal.credentials(
        HTTP_X_DUCKGRES_INTERNAL_SECRET=settings.DUCKGRES_INTERNAL_SECRET,
        HTTP_X_DUCKGRES_DATAPLANE_SECRET=settings.DUCKGRES_DATAPLANE_SECRET,
    )
    response = clients.internal.post(
        "/api/v1/warehouses/o/leases", {"holder": "h", "purpose": "query"}, format="json"
    )
    assert response.status_code == 403
    assert error(response) == "data-plane secret required"


@pytest.mark.safeguard("reshard-50")
def test_wrong_secret_value_is_unauthenticated(db):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_X_DUCKGRES_INTERNAL_SECRET="x" * 40)
    response = client.get("/api/v1/reshards")
    assert response.status_code == 401
    assert "x" * 40 not in response.content.decode()


@pytest.mark.safeguard("reshard-50")
def test_lease_routes_accept_only_the_dataplane_secret(clients):
    store = new_store(name="lease-auth")
    new_warehouse(
        org_id="lease-auth-org",
        store=store,
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    path = "/api/v1/warehouses/lease-auth-org/leases"
    body = {"holder": "h", "purpose": "query"}
    for name in ("internal", "runner", "admin", "superuser", "viewer"):
        response = getattr(clients, name).post(path, body, format="json")
        assert response.status_code == 403, name
        assert error(response) == "data-plane secret required"
    assert clients.anon.post(path, body, format="json").status_code == 401
    assert clients.dataplane.post(path, body, format="json").status_code == 201
    for name in ("internal", "admin"):
        assert getattr(clients, name).get(f"{path}/1").status_code == 403
        assert getattr(clients, name).delete(f"{path}/1").status_code == 403
        assert getattr(clients, name).post(f"{path}/1/renew", {}, format="json").status_code == 403


@pytest.mark.safeguard("reshard-50")
@pytest.mark.safeguard("reshard-39")
def test_password_route_accepts_only_the_runner_secret(clients):
    store = new_store(name="pw-auth")
    warehouse = new_warehouse(
        org_id="pw-auth-org",
        store=store,
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    op = new_op(warehouse, target_endpoint="h", target_port=5432, target_user="u")
    path = f"/api/v1/reshards/{op.id}/password"
    for name in ("internal", "dataplane", "admin", "superuser", "viewer"):
        response = getattr(clients, name).get(path)
        assert response.status_code == 403, name
        assert response.json() == {"error": "runner secret required"}
        assert response["Cache-Control"] == "no-store"
    assert clients.anon.get(path).status_code == 401
    lines = list(
        ReshardLogEntry.objects.filter(operation_id=op.id).values_list("message", flat=True)
    )
    assert len(lines) == 5
    assert all("refused (403" in line for line in lines)
    assert any("staff user root@example.com" in line for line in lines)
    assert any("internal secret" in line for line in lines)


@pytest.mark.safeguard("reshard-50")
def test_runner_secret_on_every_other_route_is_403(clients):
    for path in (*OPERATOR_GETS, "/api/v1/reshards/1", "/api/v1/warehouses/x"):
        assert clients.runner.get(path).status_code == 403, path
    response = clients.runner.post("/api/v1/warehouses", {"org_id": "x"}, format="json")
    assert response.status_code == 403
    response = clients.dataplane.post("/api/v1/metadata-stores", {}, format="json")
    assert response.status_code == 403


def test_mutations_need_admin_and_are_audited(clients):
    body = {"org_id": "audit-org", "database_name": "audit_org"}
    response = clients.viewer.post("/api/v1/warehouses", body, format="json")
    assert response.status_code == 403
    assert error(response) == "admin role required"
    response = clients.admin.post("/api/v1/warehouses", body, format="json")
    assert response.status_code == 201
    response = clients.internal.patch(
        "/api/v1/warehouses/audit-org", {"data_bucket": "b"}, format="json"
    )
    assert response.status_code == 200
    rows = list(AuditRecord.objects.order_by("id"))
    assert [(r.actor, r.role, r.source, r.status, r.action) for r in rows] == [
        ("viewer@example.com", "viewer", "django", 403, "warehouse.create"),
        ("admin@example.com", "admin", "django", 201, "warehouse.create"),
        ("internal-secret", "admin", "internal-secret", 200, "warehouse.update"),
    ]
    assert rows[1].org_id == "audit-org"
    assert rows[2].path == "/api/v1/warehouses/audit-org"
    assert rows[2].method == "PATCH"
    assert rows[2].client_ip == "127.0.0.1"
    # Reads are never audited.
    clients.admin.get("/api/v1/warehouses")
    assert AuditRecord.objects.count() == 3


def test_session_mutations_need_the_csrf_token(clients):
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    client = APIClient(enforce_csrf_checks=True)
    client.force_login(get_user_model().objects.get(email="admin@example.com"))
    response = client.post("/api/v1/warehouses", {"org_id": "csrf"}, format="json")
    assert response.status_code == 403
    assert error(response) == "CSRF check failed"
    # Secret-authenticated automation has no session and no CSRF token to carry.
    assert (
        clients.internal.post("/api/v1/warehouses", {"org_id": "csrf"}, format="json").status_code
        == 201
    )


def test_unexpected_errors_are_json_500_and_audited(clients, monkeypatch, settings):
    from reshard.warehouses import writes

    def boom(**kwargs):
        raise RuntimeError(f"exploded near {settings.DUCKGRES_INTERNAL_SECRET}")

    monkeypatch.setattr(writes, "warehouse_create", boom)
    response = clients.internal.post("/api/v1/warehouses", {"org_id": "boom"}, format="json")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error (RuntimeError)"}
    audit = AuditRecord.objects.get()
    assert audit.status == 500
    assert settings.DUCKGRES_INTERNAL_SECRET not in audit.detail
