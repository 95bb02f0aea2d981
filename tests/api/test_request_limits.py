"""Unauthenticated and oversized requests (the "hostile inputs" issue, item 9), in-process.

A request that proves no identity writes nothing to the config store (it is counted and logged,
rate-limited); JSON bodies are bounded (413); a NUL anywhere in a query or a body answers 400,
never 500; the schema route is authenticated; lists are paged. The slow-client defence of the
shipped gunicorn is tested against a real gunicorn in ``test_request_limits_gunicorn.py``.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from django.conf import settings
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from duckgres_admin.api import auth
from duckgres_admin.api.base import BoundedJSONParser
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import AuditRecord, MetadataStore, ReshardLogEntry, Warehouse
from tests.fixtures.api import error
from tests.fixtures.api_client import ApiClient
from tests.fixtures.rows import new_op, new_store, new_warehouse


def unauthenticated(scope: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "duckgres_api_unauthenticated_requests_total", {"scope": scope, "reason": reason}
    )
    return float(value or 0)


def with_header(name: str, value: str) -> APIClient:
    client = APIClient()
    client.credentials(**{"HTTP_" + name.upper().replace("-", "_"): value})
    return client


# --- no write for a request that failed authentication -----------------------------------------


@pytest.mark.safeguard("reshard-67")
def test_unauthenticated_mutations_write_no_audit_row(clients, monkeypatch, caplog):
    monkeypatch.setattr(auth, "_log_window", {})
    body = {"org_id": "intruder", "database_name": "x"}
    cases = [
        (APIClient(), 401, "authentication required", "no_credentials"),
        (
            with_header("X-Duckgres-Internal-Secret", "x" * 40),
            401,
            "invalid credentials",
            "invalid_secret",
        ),
        (
            with_header("X-Duckgres-Dataplane-Secret", "guessed"),
            403,
            "this secret is not accepted on this route",
            "unverified_foreign_secret",
        ),
    ]
    with caplog.at_level(logging.WARNING, logger="duckgres.api.auth"):
        for client, status, message, reason in cases:
            before = unauthenticated("operator", reason)
            for _ in range(3):
                response = client.post("/api/v1/warehouses", body, format="json")
                assert response.status_code == status
                assert error(response) == message
            assert unauthenticated("operator", reason) == before + 3
    assert AuditRecord.objects.count() == 0
    assert Warehouse.objects.count() == 0
    # Rate-limited: one line per reason for the three requests, naming no secret.
    lines = [r.getMessage() for r in caplog.records if r.name == "duckgres.api.auth"]
    assert len(lines) == 3, lines
    assert lines[0] == (
        "unauthenticated API request refused (operator route, no_credentials): POST "
        "'/api/v1/warehouses' from 127.0.0.1; 0 more refused since the last such line"
    )
    assert all("x" * 40 not in line and "guessed" not in line for line in lines)
    # After the interval, the next line carries the count of those it did not log.
    monkeypatch.setattr(auth, "LOG_INTERVAL_SECONDS", 0.0)
    APIClient().post("/api/v1/warehouses", body, format="json")
    last = [r.getMessage() for r in caplog.records if r.name == "duckgres.api.auth"][-1]
    assert last.endswith("; 2 more refused since the last such line")
    # A caller that proves who it is is still audited when refused (here: a valid data-plane
    # secret on an operator route).
    response = clients.dataplane.post("/api/v1/warehouses", body, format="json")
    assert response.status_code == 403
    [audit] = AuditRecord.objects.all()
    assert (audit.actor, audit.status, audit.action) == (
        "dataplane-secret",
        403,
        "warehouse.create",
    )


@pytest.mark.safeguard("reshard-67")
def test_an_unauthenticated_password_request_writes_no_op_log_line(clients):
    store = new_store(name="pw-unauth")
    warehouse = new_warehouse(
        org_id="pw-unauth-org",
        store=store,
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    op = new_op(warehouse, target_endpoint="h", target_port=5432, target_user="u")
    path = f"/api/v1/reshards/{op.id}/password"
    for header in ("X-Duckgres-Internal-Secret", "X-Duckgres-Dataplane-Secret"):
        for _ in range(5):
            response = with_header(header, "not-the-secret").get(path)
            assert response.status_code == 403
            assert response.json() == {"error": "runner secret required"}
    assert with_header("X-Duckgres-Runner-Secret", "wrong").get(path).status_code == 401
    assert ReshardLogEntry.objects.filter(operation_id=op.id).count() == 0
    # The real internal secret is a known caller on the wrong route: logged on the op.
    assert clients.internal.get(path).status_code == 403
    [line] = ReshardLogEntry.objects.filter(operation_id=op.id).values_list("message", flat=True)
    assert "refused (403 runner secret required)" in line


# --- bounded bodies -------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-67")
def test_bodies_over_the_limit_are_413(clients, settings, trino):
    settings.DUCKGRES_API_MAX_BODY_BYTES = 2048
    big = {"org_id": "big", "data_bucket": "b" * 4096}
    expected = (
        "invalid body: body: larger than 2048 bytes (DUCKGRES_API_MAX_BODY_BYTES); send a "
        "smaller JSON document"
    )
    for method, path in (
        ("post", "/api/v1/warehouses"),
        ("patch", "/api/v1/metadata-stores/x"),
        ("post", "/api/v1/warehouses/x/reshards"),
        ("put", "/api/v1/warehouses/x/trino/cell"),  # a view with DRF's own JSON parser
        ("post", "/api/v1/reshards/1/cancel"),
    ):
        response = getattr(clients.internal, method)(path, big, format="json")
        assert response.status_code == 413, (path, response.content)
        assert error(response) == expected
    response = clients.dataplane.post("/api/v1/warehouses/x/leases", big, format="json")
    assert response.status_code == 413
    assert Warehouse.objects.count() == 0
    # The parser itself never reads more than the limit (a body without a usable length).
    with pytest.raises(ServiceError) as raised:
        BoundedJSONParser().parse(io.BytesIO(b'{"a": "' + b"x" * 4096 + b'"}'))
    assert raised.value.status == 413
    assert BoundedJSONParser().parse(io.BytesIO(b'{"a": 1}')) == {"a": 1}


# --- NUL characters ----------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-67")
def test_a_nul_in_a_query_parameter_is_400(clients):
    clients.internal.raise_request_exception = False
    for path, name in (
        ("/api/v1/reshards?org=a%00b", "org"),
        ("/api/v1/reshards?state=%00", "state"),
        ("/api/v1/warehouses?after=x%00", "after"),
        ("/api/v1/metadata-stores?after=%00", "after"),
        ("/api/v1/reshards/1/log?after=%00", "after"),
        ("/api/v1/reshards?a%00b=1", "a\\0b"),
    ):
        response = clients.internal.get(path)
        assert response.status_code == 400, (path, response.content)
        assert error(response) == f"invalid query: {name}: must not contain a NUL character"
    response = clients.dataplane.get("/api/v1/warehouses/o/leases/1?x=%00")
    assert response.status_code == 400


@pytest.mark.safeguard("reshard-67")
def test_a_nul_anywhere_in_a_body_value_is_400_and_audited(clients):
    clients.internal.raise_request_exception = False
    cases = [
        ("post", "/api/v1/warehouses", {"org_id": "a\x00b"}, "org_id"),
        (
            "post",
            "/api/v1/metadata-stores",
            {"name": "s", "kind": "cnpg", "host": "h\x00"},
            "host",
        ),
        (
            "post",
            "/api/v1/warehouses/o/reshards",
            {"target": {"type": "external", "endpoint": "x\x00:5432"}},
            "target.endpoint",
        ),
        ("post", "/api/v1/warehouses/o/reshards", {"target": {"type": ["\x00"]}}, "target.type[0]"),
        ("patch", "/api/v1/warehouses/o", {"data_bucket": "\x00"}, "data_bucket"),
    ]
    for method, path, body, field in cases:
        response = getattr(clients.internal, method)(path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert error(response) == (
            f"invalid body: {field}: must not contain a NUL character (PostgreSQL text cannot "
            "hold one)"
        )
    response = clients.dataplane.post(
        "/api/v1/warehouses/o/leases", {"holder": "h\x00", "purpose": "query"}, format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith("invalid body: holder: must not contain a NUL")
    audits = list(AuditRecord.objects.order_by("id").values_list("status", "detail"))
    assert len(audits) == len(cases)
    assert all(status == 400 and "NUL character" in detail for status, detail in audits)


# --- the schema route -------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-67")
def test_the_schema_route_needs_an_operator_identity(clients):
    before = unauthenticated("operator", "no_credentials")
    response = clients.anon.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 401
    assert response.json() == {"error": "authentication required"}
    response = clients.anon.get("/api/schema/")  # YAML, the schema's default rendering
    assert response.status_code == 401
    assert b"authentication required" in response.content
    assert unauthenticated("operator", "no_credentials") == before + 2
    response = clients.runner.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 403
    assert response.json() == {"error": "this secret is not accepted on this route"}
    assert clients.disabled.get("/api/schema/").status_code == 403
    for client in (clients.internal, clients.viewer):
        response = client.get("/api/schema/")
        assert response.status_code == 200
        assert b"/api/v1/reshards" in response.content


# --- pagination -------------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-67")
def test_lists_are_paged_with_a_cursor(clients):
    for i in range(5):
        new_store(name=f"page-store-{i}")
        new_warehouse(org_id=f"page-org-{i}")
    pages = []
    query = "limit=2"
    while True:
        body = clients.viewer.get(f"/api/v1/warehouses?{query}").json()
        pages.append([w["org_id"] for w in body["warehouses"]])
        if body["next_after"] is None:
            break
        query = f"limit=2&after={body['next_after']}"
    assert pages == [["page-org-0", "page-org-1"], ["page-org-2", "page-org-3"], ["page-org-4"]]
    body = clients.viewer.get("/api/v1/metadata-stores?limit=3").json()
    assert [s["name"] for s in body["metadata_stores"]] == [f"page-store-{i}" for i in range(3)]
    assert body["next_after"] == "page-store-2"
    body = clients.viewer.get("/api/v1/metadata-stores?after=page-store-2").json()
    assert [s["name"] for s in body["metadata_stores"]] == ["page-store-3", "page-store-4"]
    assert body["next_after"] is None
    warehouse = new_warehouse(
        org_id="page-ops",
        store=MetadataStore.objects.get(name="page-store-0"),
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    ops = [new_op(warehouse, state="failed", target_endpoint="h") for _ in range(3)]
    body = clients.viewer.get("/api/v1/reshards?limit=2").json()
    assert [o["id"] for o in body["operations"]] == [ops[2].id, ops[1].id]
    assert body["next_before"] == ops[1].id
    body = clients.viewer.get(f"/api/v1/reshards?limit=2&before={ops[1].id}").json()
    assert [o["id"] for o in body["operations"]] == [ops[0].id]
    assert body["next_before"] is None
    for bad in ("0", "-1", "x", "1.5", "²"):
        response = clients.viewer.get(f"/api/v1/reshards?before={bad}")
        assert response.status_code == 400, bad
        assert error(response) == (
            "invalid query: before: must be a positive integer (the cursor of a page)"
        )
    # The default page is 100 rows.
    for i in range(5, 105):
        new_warehouse(org_id=f"page-org-{i:03d}")
    body = clients.viewer.get("/api/v1/warehouses").json()
    assert len(body["warehouses"]) == 100
    assert body["next_after"] is not None


@pytest.mark.safeguard("reshard-67")
def test_the_test_client_follows_every_page(live_server: Any):
    for i in range(7):
        new_warehouse(org_id=f"lc-org-{i}")
    client = ApiClient.internal(live_server.url, settings.DUCKGRES_INTERNAL_SECRET)
    first = client.get("warehouses?limit=3").body
    assert [w["org_id"] for w in first["warehouses"]] == ["lc-org-0", "lc-org-1", "lc-org-2"]
    assert first["next_after"] == "lc-org-2"
    got = client.list_all("warehouses?limit=3", "warehouses")
    assert [w["org_id"] for w in got] == [f"lc-org-{i}" for i in range(7)]
