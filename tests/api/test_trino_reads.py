"""Trino read routes (spec trino-pools §5): the fleet-wide ``/trino/…`` reads and
``GET /warehouses/<org>/trino``, with every identity (spec reshard §5)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from duckgres_admin.models import AuditRecord, TrinoPool, TrinoPoolInstance, WarehouseTrino
from tests.fixtures.api import error
from tests.fixtures.rows import new_warehouse

CELL_SCOPED = ["/api/v1/trino/orgs", "/api/v1/trino/instances"]


def _cells(client: Any) -> Any:
    return client.get("/api/v1/trino/cells")


def test_cells_sorted_by_id(clients, trino):
    trino.install("pool-b", "pool-a")
    response = _cells(clients.viewer)
    assert response.status_code == 200
    assert response.json() == {
        "cells": [
            {
                "id": "pool-a",
                "stored_id": "registered:pool-a",
                "client_url": "https://pool-a.trino.example.com",
                "namespace": "trino-pool-a",
                "routing_group": "rg-pool-a",
            },
            {
                "id": "pool-b",
                "stored_id": "registered:pool-b",
                "client_url": "https://pool-b.trino.example.com",
                "namespace": "trino-pool-b",
                "routing_group": "rg-pool-b",
            },
        ]
    }


@pytest.mark.safeguard("reshard-50")
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/trino/cells",
        "/api/v1/trino/orgs?cell=pool-a",
        "/api/v1/warehouses/ident-org/trino",
    ],
)
def test_reads_accept_internal_and_every_staff_role_only(clients, trino, path):
    new_warehouse(org_id="ident-org")
    for name in ("internal", "admin", "viewer", "superuser"):
        assert getattr(clients, name).get(path).status_code == 200, name
    for other in (clients.runner, clients.dataplane):
        response = other.get(path)
        assert response.status_code == 403
        assert error(response) == "this secret is not accepted on this route"
    assert clients.anon.get(path).status_code == 401
    response = clients.disabled.get(path)
    assert (response.status_code, error(response)) == (403, "operator disabled")
    assert not AuditRecord.objects.exists()  # reads are never audited


@pytest.mark.parametrize("path", CELL_SCOPED)
@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("", 400, "explicit Trino cell selection is required"),
        ("?cell=", 400, "explicit Trino cell selection is required"),
        ("?cell=pool-z", 404, "unknown Trino cell"),
        ("?cell=registered:pool-a", 404, "unknown Trino cell"),
    ],
)
def test_cell_scoped_reads_need_an_explicit_known_cell(
    clients, trino, path, query, status, message
):
    response = clients.admin.get(path + query)
    assert response.status_code == status
    assert response.json() == {"error": message}


def test_org_rows_of_one_pool(clients, trino):
    for org, owner, enabled in (
        ("org-b", "registered:pool-a", True),
        ("org-a", "registered:pool-a", False),
        ("org-c", "registered:pool-b", True),
    ):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id=org), trino_cell_id=owner, enabled=enabled, tier="free"
        )
    body = clients.viewer.get("/api/v1/trino/orgs?cell=pool-a").json()
    assert body["cell"] == "pool-a"
    assert [row["org_id"] for row in body["orgs"]] == ["org-a", "org-b"]
    assert body["orgs"][1] == {
        "org_id": "org-b",
        "enabled": True,
        "tier": "free",
        "state": "pending",
        "status_message": "",
        "ready_at": None,
        "failed_at": None,
        "backend": "ducklake",
        "catalog_name": "",
    }


def test_instances_non_terminal_sorted_with_valid_node_replacement_only(clients, trino):
    pool = TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a")
    now = timezone.now()
    for instance_id, phase, evidence in (
        ("cell-0000000b", "SERVING", {"node": "n1", "reason": "drain"}),
        ("cell-0000000a", "PENDING", None),
        ("cell-0000000c", "RETIRED", None),
        ("cell-0000000d", "FAILURE_RETIRED", None),
        ("cell-0000000e", "DRAINING", "not an object"),
    ):
        TrinoPoolInstance.objects.create(
            instance_id=instance_id,
            pool=pool,
            phase=phase,
            phase_changed_at=now,
            gateway_state="ACTIVE" if phase == "SERVING" else "",
            node_replacement_evidence=evidence,
        )
    response = clients.admin.get("/api/v1/trino/instances?cell=pool-a")
    assert response.status_code == 200
    body = response.json()
    assert body["cell"] == "pool-a"
    assert [i["instance_id"] for i in body["instances"]] == [
        "cell-0000000a",
        "cell-0000000b",
        "cell-0000000e",
    ]
    serving = body["instances"][1]
    assert serving["phase"] == "SERVING"
    assert serving["gateway_state"] == "ACTIVE"
    assert serving["node_replacement"] == {"node": "n1", "reason": "drain"}
    assert serving["phase_changed_at"]
    assert "node_replacement" not in body["instances"][0]
    assert "node_replacement" not in body["instances"][2]


def test_instances_unknown_shared_pool(clients, trino):
    response = clients.admin.get("/api/v1/trino/instances?cell=pool-a")
    assert (response.status_code, response.json()) == (404, {"error": "unknown shared Trino pool"})
    TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a", api_mode="legacy")
    response = clients.admin.get("/api/v1/trino/instances?cell=pool-a")
    assert (response.status_code, response.json()) == (404, {"error": "unknown shared Trino pool"})


def test_instances_need_an_admin_with_an_email(clients, trino, django_user_model):
    from rest_framework.test import APIClient

    from duckgres_admin.models import Operator

    TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a")
    path = "/api/v1/trino/instances?cell=pool-a"
    assert clients.admin.get(path).status_code == 200
    response = clients.viewer.get(path)
    assert (response.status_code, error(response)) == (403, "admin role required")
    response = clients.superuser.get(path)  # no operator row: a viewer
    assert (response.status_code, error(response)) == (403, "admin role required")
    response = clients.internal.get(path)  # admin, but no identity email
    assert (response.status_code, error(response)) == (
        403,
        "an admin identity with an email is required",
    )
    # A staff admin whose user has no email (the operator row is keyed by the username).
    user = django_user_model.objects.create_user(username="noemail", email="", is_staff=True)
    Operator.objects.create(email="noemail", role="admin")
    client = APIClient()
    client.force_login(user)
    response = client.get(path)
    assert (response.status_code, error(response)) == (
        403,
        "an admin identity with an email is required",
    )
    for other in (clients.runner, clients.dataplane):
        assert other.get(path).status_code == 403
    assert clients.anon.get(path).status_code == 401


class TestWarehouseTrinoDetail:
    def test_unassigned(self, clients, trino):
        new_warehouse(org_id="org-un")
        response = clients.viewer.get("/api/v1/warehouses/org-un/trino")
        assert response.status_code == 200
        assert response.json() == {
            "cell": {},
            "enabled": False,
            "assigned": False,
            "available": False,
        }

    def test_enabled_without_owner_says_so(self, clients, trino):
        WarehouseTrino.objects.create(warehouse=new_warehouse(org_id="org-en"), enabled=True)
        body = clients.viewer.get("/api/v1/warehouses/org-en/trino").json()
        assert body["assigned"] is False
        assert body["available"] is False
        assert body["enabled"] is True
        assert body["cell"] == {}
        assert body["status"].startswith("No Trino cell is assigned")

    def test_follows_the_persisted_owner_never_the_default(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="org-b"),
            trino_cell_id="registered:pool-b",
            enabled=True,
            state="ready",
            tier="growth",
        )
        body = clients.viewer.get("/api/v1/warehouses/org-b/trino").json()
        assert body["assigned"] is True
        assert body["available"] is True
        assert body["cell"]["id"] == "pool-b"  # the default is pool-a
        assert body["cell"]["stored_id"] == "registered:pool-b"
        assert body["tier"] == "growth"

    @pytest.mark.parametrize("owner", ["legacy", "cell-001", "registered:unknown"])
    def test_unconfigured_owner_fails_closed(self, clients, trino, owner):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="org-x"), trino_cell_id=owner, enabled=True
        )
        response = clients.viewer.get("/api/v1/warehouses/org-x/trino")
        assert response.status_code == 409
        assert response.json() == {
            "error": "the assigned Trino cell is not configured",
            "assigned": True,
        }

    def test_removed_pool_fails_closed(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="org-rm"), trino_cell_id="registered:pool-b"
        )
        trino.install("pool-a")  # pool-b removed from the registry
        response = clients.viewer.get("/api/v1/warehouses/org-rm/trino")
        assert response.status_code == 409
        assert response.json()["error"] == "the assigned Trino cell is not configured"

    def test_missing_warehouse(self, clients, trino):
        response = clients.viewer.get("/api/v1/warehouses/nobody/trino")
        assert (response.status_code, response.json()) == (
            404,
            {"error": "managed warehouse not found"},
        )


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/api/v1/trino/cells", None),
        ("get", "/api/v1/trino/orgs?cell=pool-a", None),
        ("get", "/api/v1/trino/instances?cell=pool-a", None),
        ("get", "/api/v1/warehouses/org-nw/trino", None),
        ("post", "/api/v1/warehouses/org-nw/trino", {"enabled": True}),
        ("put", "/api/v1/warehouses/org-nw/trino/cell", {"cell": "pool-a"}),
        ("post", "/api/v1/warehouses/org-nw/trino/cell/move", {"from": "pool-a", "to": "pool-b"}),
    ],
)
def test_without_trino_wired_there_are_no_trino_routes(clients, trino, method, path, body):
    new_warehouse(org_id="org-nw")
    trino.unwire()
    response = getattr(clients.admin, method)(path, body, format="json")
    assert (response.status_code, response.json()) == (404, {"error": "Trino is not configured"})
    assert not WarehouseTrino.objects.exists()


@pytest.mark.safeguard("trino-42")
def test_the_old_org_routes_do_not_exist(clients, trino):
    """Safeguard trino-42: only ``/warehouses/<org>/trino…``; ``/orgs/<org>/…`` is gone."""
    new_warehouse(org_id="org-old")
    for path in ("/api/v1/orgs/org-old/trino", "/api/v1/orgs/org-old/trino/cell"):
        assert clients.admin.get(path).status_code == 404
        assert clients.admin.post(path, {"enabled": True}, format="json").status_code == 404
    assert not WarehouseTrino.objects.exists()


def test_the_schema_documents_every_trino_route():
    from drf_spectacular.generators import SchemaGenerator

    generator = SchemaGenerator()  # type: ignore[no-untyped-call]
    schema = generator.get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
    paths = schema["paths"]
    expected = {
        "/api/v1/trino/cells": {"get"},
        "/api/v1/trino/orgs": {"get"},
        "/api/v1/trino/instances": {"get"},
        "/api/v1/warehouses/{org}/trino": {"get", "post"},
        "/api/v1/warehouses/{org}/trino/cell": {"put"},
        "/api/v1/warehouses/{org}/trino/cell/move": {"post"},
    }
    for path, methods in expected.items():
        assert set(paths[path]) >= methods, path
    [cell] = [p for p in paths["/api/v1/trino/orgs"]["get"]["parameters"] if p["name"] == "cell"]
    assert cell["required"] is True
