"""A NUL in a body key or a path segment is an ordinary refusal, never a 500: PostgreSQL text
cannot hold NUL, so neither the audit row nor a lookup may receive one raw."""

from __future__ import annotations

from django.conf import settings

from duckgres_admin.models import AuditRecord
from tests.fixtures.api import error


def _internal() -> dict[str, str]:
    return {"HTTP_X_DUCKGRES_INTERNAL_SECRET": settings.DUCKGRES_INTERNAL_SECRET}


def test_a_nul_in_a_body_key_is_a_400_and_still_audited(client, db):
    client.raise_request_exception = False
    response = client.post(
        "/api/v1/metadata-stores",
        data='{"a\\u0000b": 1}',
        content_type="application/json",
        **_internal(),
    )
    assert response.status_code == 400
    assert error(response) == "invalid body: a\x00b: unknown field"
    [audit] = AuditRecord.objects.all()
    assert (audit.action, audit.status) == ("metadata_store.create", 400)
    assert audit.detail == "invalid body: a\\0b: unknown field"


def test_a_nul_in_the_path_is_a_404_and_still_audited(client, db, trino):
    client.raise_request_exception = False
    for method, path in (
        ("get", "/api/v1/warehouses/a%00b"),
        ("get", "/api/v1/warehouses/a%00b/trino"),
        ("put", "/api/v1/warehouses/a%00b/trino/cell"),
        ("patch", "/api/v1/warehouses/a%00b"),
    ):
        if method == "get":
            response = client.get(path, **_internal())
        else:
            response = getattr(client, method)(
                path, data='{"cell": "pool-a"}', content_type="application/json", **_internal()
            )
        assert response.status_code == 404, (method, path, response.content)
        assert error(response) == "not found: the path contains a NUL character"
    audits = list(AuditRecord.objects.order_by("id"))
    assert [(a.action, a.status, a.org_id) for a in audits] == [
        ("trino.cell_select", 404, "a\\0b"),
        ("warehouse.update", 404, "a\\0b"),
    ]
    assert audits[0].path == "/api/v1/warehouses/a\\0b/trino/cell"
