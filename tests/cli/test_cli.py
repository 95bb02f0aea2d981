"""The ``duckgres`` console script against the live API (a real HTTP server): start, list,
show, follow, cancel, ``--output json``, exit codes, and no secret in any output."""

from __future__ import annotations

import json
import time

import pytest
from django.utils import timezone

from duckgres_admin.models import LogSource, ReshardLogEntry, ReshardOperation
from tests.fixtures.cli import WRONG_SECRET, Cli


@pytest.fixture
def reshardable(transactional_db, store_clusters, tenant_catalog, make_store, make_warehouse):
    catalog = tenant_catalog(store_clusters.source, rows=1)
    source = make_store(store_clusters.source)
    target = make_store(store_clusters.target)
    warehouse = make_warehouse(store=source, catalog=catalog)
    return warehouse, target


@pytest.mark.safeguard("reshard-90")
def test_start_list_show_cancel_follow_and_exit_codes(cli, reshardable):
    warehouse, target = reshardable
    org = warehouse.org_id

    started = cli(
        "reshard", "start", org, "--to-shard", target.name, "--copy-mode", "online",
        "--output", "json",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    op = json.loads(started.stdout)
    assert op["state"] == "pending"
    assert op["to_shard"] == target.name
    assert (op["copy_mode"], op["copy_mode_reason"]) == ("online", "online (requested)")
    op_id = op["id"]

    listed = cli("reshard", "list", "--org", org)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].startswith("id\torg\tkind\tstate")
    assert f"{op_id}\t{org}\treshard\tpending" in listed.stdout
    listed_json = cli("-o", "json", "reshard", "list", "--org", org, "--state", "pending")
    assert [o["id"] for o in json.loads(listed_json.stdout)["operations"]] == [op_id]

    shown = cli("reshard", "show", str(op_id))
    assert shown.returncode == 0
    assert f"to_shard: {target.name}" in shown.stdout
    assert "state: pending" in shown.stdout
    assert json.loads(cli("reshard", "show", str(op_id), "-o", "json").stdout)["id"] == op_id

    # A second start for the same org is refused by the API: exit 1 with its message.
    again = cli("reshard", "start", org, "--to-shard", target.name)
    assert again.returncode == 1
    assert "HTTP 409: org already has an active reshard operation" in again.stderr

    cancelled = cli("reshard", "cancel", str(op_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled (before its runner started)" in cancelled.stdout
    refused = cli("reshard", "cancel", str(op_id), "-o", "json")
    assert refused.returncode == 1
    assert json.loads(refused.stdout) == {
        "error": f"POST /api/v1/reshards/{op_id}/cancel: HTTP 409: operation already cancelled",
        "exit_code": 1,
        "status": 409,
    }

    # follow prints the whole op log, then the outcome: cancelled is exit 4.
    followed = cli("reshard", "follow", str(op_id))
    assert followed.returncode == 4, followed.stderr
    lines = followed.stdout.splitlines()
    assert any("[api/info] operation created by internal-secret" in line for line in lines)
    assert any("cancelled by internal-secret before the runner claimed it" in ln for ln in lines)
    assert lines[-1] == f"reshard {op_id} cancelled: cancelled before start"
    as_json = cli("reshard", "follow", str(op_id), "-o", "json")
    assert as_json.returncode == 4
    documents = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert all("log" in d for d in documents[:-1])
    assert documents[-1]["operation"]["state"] == "cancelled"

    # Refusals and usage.
    missing = cli("reshard", "show", "99999999")
    assert missing.returncode == 1
    assert "HTTP 404: no such reshard operation" in missing.stderr
    assert cli("reshard", "start", "no-such-org-x", "--to-shard", target.name).returncode == 1
    assert cli("reshard", "show", "not-a-number").returncode == 2
    assert cli("reshard", "start", org).returncode == 2  # no target
    assert cli("reshard", "frobnicate").returncode == 2
    cli.assert_no_secret()


@pytest.mark.safeguard("reshard-90")
def test_follow_tails_new_lines_until_succeeded_and_honours_its_deadline(
    cli, make_store, make_warehouse, make_op, transactional_db
):
    store = make_store()
    warehouse = make_warehouse(
        store=store,
        database_name="db_follow",
        metadata_store_database="db_follow",
        metadata_store_user="user_follow",
        metadata_store_password_ref="env:DUCKGRES_TEST_TENANT_FOLLOW",
    )
    op = make_op(warehouse, to_store=make_store(), state="running")

    timed_out = cli("reshard", "follow", str(op.id), "--deadline", "1.5", "--interval", "0.3")
    assert timed_out.returncode == 6
    assert f"reshard {op.id} is still running" in timed_out.stderr

    proc = cli.popen("reshard", "follow", str(op.id), "--interval", "0.3", "--deadline", "60")
    time.sleep(1.5)
    ReshardLogEntry.objects.create(
        operation_id=op.id, level="info", source=LogSource.RUNNER, message="step copying started"
    )
    time.sleep(1.0)
    ReshardLogEntry.objects.create(
        operation_id=op.id, level="info", source=LogSource.RUNNER, message="reshard report"
    )
    ReshardOperation.objects.filter(pk=op.id).update(state="succeeded", finished_at=timezone.now())
    stdout, stderr = proc.communicate(timeout=60)
    cli.outputs += [stdout, stderr]
    assert proc.returncode == 0, stderr
    lines = stdout.splitlines()
    assert "[runner/info] step copying started" in lines[0]
    assert "[runner/info] reshard report" in lines[1]
    assert lines[-1] == f"reshard {op.id} succeeded"
    cli.assert_no_secret()


@pytest.mark.safeguard("reshard-91")
def test_routes_this_api_does_not_offer_transport_and_identity_errors(cli, transactional_db):
    # An API build without the route (here: a URL where no API is mounted) answers Django's
    # plain 404, not the API's JSON error: exit 5, the feature named.
    for args, feature, route in (
        (("reshard", "list"), "GET /api/v1/reshards", "GET /api/v1/reshards"),
        (("restore", "start", "acme", "--backup", "s3://b/k", "--to-shard", "s"),
         "restore start", "POST /api/v1/warehouses/acme/restores"),
    ):  # fmt: skip
        result = cli(*args, DUCKGRES_API_URL=f"{cli.url}/no-api-here")
        assert result.returncode == 5, (args, result.stdout, result.stderr)
        assert f"this API does not offer {feature} yet ({route} answered 404)" in result.stderr
        assert result.stdout == ""

    # A wrong secret: the API's 401, exit 1, and the value never printed.
    wrong = cli("reshard", "list", DUCKGRES_INTERNAL_SECRET=WRONG_SECRET)
    assert wrong.returncode == 1
    assert "HTTP 401: invalid credentials" in wrong.stderr
    # No identity at all, or both forms of it: usage (2) before any request.
    no_identity = Cli(cli.url, "")
    assert no_identity("reshard", "list").returncode == 2
    both = cli("reshard", "list", DUCKGRES_INTERNAL_SECRET_FILE="/nonexistent")
    assert both.returncode == 2
    assert "DUCKGRES_INTERNAL_SECRET and DUCKGRES_INTERNAL_SECRET_FILE" in both.stderr
    # Nobody listening: transport, exit 3.
    down = cli("reshard", "list", DUCKGRES_API_URL="http://127.0.0.1:1")
    assert down.returncode == 3
    assert "cannot reach the API at http://127.0.0.1:1" in down.stderr
    # A token is sent as a bearer credential; this API build answers 401 to it.
    token = cli("reshard", "list", DUCKGRES_INTERNAL_SECRET="", DUCKGRES_API_TOKEN=WRONG_SECRET)
    assert token.returncode == 1
    cli.assert_no_secret()
