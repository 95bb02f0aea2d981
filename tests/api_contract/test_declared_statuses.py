"""Every status the API answers is declared in the schema, for the requests schemathesis does
not vary: a mutating request with a non-JSON Content-Type (DRF's JSONParser → 415)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

pytestmark = pytest.mark.django_db

FILL = {"op_id": "1", "lease_id": "1", "org": "org-x", "name": "shard-x", "drain_id": "1"}


def _schema(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "schema.json"
    call_command("spectacular", "--format", "openapi-json", "--file", str(out))
    return dict(json.loads(out.read_text()))


def test_a_non_json_body_answers_a_declared_status(client, tmp_path: Path):
    undeclared = []
    for path, operations in _schema(tmp_path)["paths"].items():
        for method, operation in operations.items():
            if method not in ("post", "put", "patch"):
                continue
            url = path.format(**FILL)
            header = (
                {"HTTP_X_DUCKGRES_DATAPLANE_SECRET": settings.DUCKGRES_DATAPLANE_SECRET}
                if "/leases" in path
                else {"HTTP_X_DUCKGRES_INTERNAL_SECRET": settings.DUCKGRES_INTERNAL_SECRET}
            )
            response = client.generic(
                method.upper(), url, data="a=b", content_type="text/plain", **header
            )
            if str(response.status_code) not in operation["responses"]:
                undeclared.append(f"{method.upper()} {path} -> {response.status_code}")
    assert not undeclared, "\n".join(undeclared)
