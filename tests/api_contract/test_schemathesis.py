"""API contract (issue 6 item 3): the drf-spectacular schema has no warnings, and schemathesis
fuzzes every operation of the live API with bounded examples and a request timeout. Every
response must match the schema (status code, content type, body) and no 5xx may appear except
where the schema declares it (spec §5.1: 500/502/503 on the start; §5.4: 503 on lease grants).

Operator routes run with the internal secret; the connection-lease routes (§5.4) with the
data-plane secret, the only identity they accept. The run uses the schemathesis CLI in a
subprocess against pytest-django's ``live_server`` (the test database)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from tests.fixtures.processes import ROOT
from tests.fixtures.rows import new_op, new_store, new_warehouse

pytestmark = pytest.mark.timeout(900)

MAX_EXAMPLES = os.environ.get("DUCKGRES_SCHEMATHESIS_EXAMPLES", "5")
REQUEST_TIMEOUT = "20"
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "response_schema_conformance",
        "api_content_type",  # content_type_conformance for routable paths (st_hooks.py)
    )
)
LEASE_PATHS = r"/leases"


def test_the_schema_generates_without_warnings(tmp_path: Path):
    out = tmp_path / "schema.json"
    call_command("spectacular", "--fail-on-warn", "--format", "openapi-json", "--file", str(out))
    schema = json.loads(out.read_text())
    assert "/api/v1/reshards/{op_id}/log" in schema["paths"]


def _st(schema: Path, base_url: str, header: str, *filters: str, report: Path) -> str:
    st = Path(sys.executable).with_name("st")
    command = [
        str(st),
        "run",
        str(schema),
        "--url",
        base_url,
        "--header",
        header,
        "--checks",
        CHECKS,
        "--max-examples",
        MAX_EXAMPLES,
        "--request-timeout",
        REQUEST_TIMEOUT,
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",  # concurrent workers race in Python 3.11's ast.parse (hypothesis lambda repr)
        "--seed",
        "6",
        "--no-shrink",
        "--suppress-health-check",
        "all",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
        *filters,
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.api_contract.st_hooks",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.run(
        command, cwd=report.parent, capture_output=True, text=True, timeout=600, env=env
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-20000:]
    return output


@pytest.fixture
def api_world(transactional_db: None) -> dict[str, Any]:
    """A few rows so reads and the cancel route meet real objects, not only 404s."""
    store = new_store(name="shard-001")
    new_store(name="shard-002")
    warehouse = new_warehouse(
        org_id="org-contract",
        store=store,
        metadata_store_database="cat",
        metadata_store_user="tenant",
        metadata_store_password_ref="env:CONTRACT_TENANT_PASSWORD",
    )
    op = new_op(warehouse, to_store=store, state="failed")
    return {"op": op, "warehouse": warehouse}


def test_schemathesis_against_the_live_api(live_server: Any, api_world, tmp_path: Path):
    schema = tmp_path / "schema.json"
    call_command("spectacular", "--fail-on-warn", "--format", "openapi-json", "--file", str(schema))
    internal = f"X-Duckgres-Internal-Secret: {settings.DUCKGRES_INTERNAL_SECRET}"
    dataplane = f"X-Duckgres-Dataplane-Secret: {settings.DUCKGRES_DATAPLANE_SECRET}"
    out_operator = _st(
        schema,
        live_server.url,
        internal,
        "--exclude-path-regex",
        LEASE_PATHS,
        report=tmp_path / "operator.xml",
    )
    out_leases = _st(
        schema,
        live_server.url,
        dataplane,
        "--include-path-regex",
        LEASE_PATHS,
        report=tmp_path / "leases.xml",
    )
    for output in (out_operator, out_leases):
        assert "No issues found" in output or " passed" in output, output[-5000:]
