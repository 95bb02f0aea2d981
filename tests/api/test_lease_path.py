"""The lease path's cost and its config-store connections (issue 15 item 1).

Query counts (safeguard reshard-82): a new request is the per-org lock and one statement,
whatever it is answered; a renew and a release one guarded ``UPDATE``. Connections (safeguard
reshard-84): the API as shipped (gunicorn, ``duckgres_admin.gunicorn_conf``) keeps one
config-store connection per thread, bounded by its threads, and a connection the server
killed between requests is replaced by the next request, never answered as a 5xx.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from duckgres_admin.models import ConnectionLease, Warehouse
from tests.fixtures.gunicorn import Gunicorn, run_gunicorn
from tests.fixtures.leases import make_org, post
from tests.fixtures.processes import child_config_store_dsn, process_env

LOCK_SQL = "SELECT pg_advisory_xact_lock("


def _sql(captured: CaptureQueriesContext) -> list[str]:
    """The statements sent, without the savepoints of the test's own transaction (``db``)."""
    return [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]


def _grant_queries(clients: Any, org: str, **body: Any) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = post(clients, org, **body)
    return response.status_code, _sql(captured)


@pytest.mark.safeguard("reshard-82")
@pytest.mark.parametrize(
    ("state", "cap", "held", "body", "status", "row_state"),
    [
        ("ready", None, 0, {}, 201, "granted"),
        ("ready", 3, 2, {}, 201, "granted"),
        ("ready", 2, 2, {}, 429, "refused"),
        ("ready", 2, 2, {"wait_seconds": 30}, 202, "queued"),
        ("resharding", None, 0, {}, 503, "refused"),
        ("provisioning", None, 0, {}, 409, "refused"),
    ],
)
def test_a_request_is_the_lock_and_one_statement_in_one_round_trip(
    clients, state, cap, held, body, status, row_state
):
    org = f"q-{state}-{cap or 0}-{held}-{len(body)}"
    make_org(org, cap=cap)
    for _ in range(held):
        assert post(clients, org).status_code == 201
    if state != "ready":
        Warehouse.objects.filter(org_id=org).update(state=state)
    code, sql = _grant_queries(clients, org, **body)
    assert code == status
    # One round trip: the lock first, in a statement of its own (the decision's snapshot must
    # start after it is held), then the one statement that reads, decides and inserts, sent as
    # one query string (one implicit transaction); no BEGIN, no COMMIT of its own.
    assert len(sql) == 1, sql
    lock, grant = sql[0].split(";\n", 1)
    assert lock.startswith(LOCK_SQL), sql
    assert "INSERT INTO duckgres_connection_leases" in grant
    newest = ConnectionLease.objects.filter(org_id=org).latest("id")
    assert newest.state == row_state
    if row_state == "granted":
        assert newest.granted_at is not None
        assert newest.expires_at is not None
        assert 59 <= (newest.expires_at - newest.granted_at).total_seconds() <= 61
    else:
        assert newest.granted_at is None


@pytest.mark.safeguard("reshard-82")
def test_an_unknown_org_inserts_nothing_in_the_same_round_trip(clients):
    code, sql = _grant_queries(clients, "nobody-here")
    assert code == 404
    assert len(sql) == 1
    assert ConnectionLease.objects.count() == 0


@pytest.mark.safeguard("reshard-82")
def test_the_count_does_not_grow_with_the_fleet_or_the_org_s_leases(clients):
    make_org("small", cap=500)
    _, first = _grant_queries(clients, "small")
    for i in range(60):
        make_org(f"fleet-{i:03d}", cap=4)
    for _ in range(40):
        assert post(clients, "small").status_code == 201
    code, later = _grant_queries(clients, "small")
    assert code == 201
    assert len(first) == len(later) == 1


@pytest.mark.safeguard("reshard-82")
def test_on_the_api_s_autocommit_connection_a_grant_is_one_round_trip(transactional_db):
    """As the API runs it (no test transaction around it): no BEGIN and no COMMIT of its own,
    the lock held by the string's implicit transaction; then a second grant of the org, which
    only the committed first one can count, meets the cap."""
    from rest_framework.test import APIClient

    make_org("autocommit", cap=1)
    client = APIClient()
    client.credentials(HTTP_X_DUCKGRES_DATAPLANE_SECRET=settings.DUCKGRES_DATAPLANE_SECRET)
    url = "/api/v1/warehouses/autocommit/leases"
    body = {"holder": "h", "purpose": "query"}
    with CaptureQueriesContext(connection) as captured:
        assert client.post(url, body, format="json").status_code == 201
    sent = [q["sql"] for q in captured.captured_queries]
    assert len(sent) == 1, sent
    assert sent[0].startswith(LOCK_SQL)
    assert connection.get_autocommit()
    assert client.post(url, body, format="json").status_code == 429


@pytest.mark.safeguard("reshard-82")
def test_renew_and_release_are_one_statement_each(clients):
    make_org("rr", cap=2)
    lease_id = post(clients, "rr").json()["lease_id"]
    base = f"/api/v1/warehouses/rr/leases/{lease_id}"
    with CaptureQueriesContext(connection) as renew:
        response = clients.dataplane.post(f"{base}/renew", {"ttl_seconds": 300}, format="json")
    assert response.status_code == 200
    assert len(_sql(renew)) == 1
    expires_at = ConnectionLease.objects.get(pk=lease_id).expires_at
    assert expires_at is not None
    assert response.json() == {
        "lease_id": lease_id,
        "expires_at": expires_at.isoformat().replace("+00:00", "Z"),
    }
    with CaptureQueriesContext(connection) as release:
        assert clients.dataplane.delete(base).status_code == 204
    assert len(_sql(release)) == 1
    assert ConnectionLease.objects.get(pk=lease_id).state == "released"
    # The refusals read once more to tell 404 from 410 / the idempotent 204.
    with CaptureQueriesContext(connection) as again:
        assert clients.dataplane.delete(base).status_code == 204
    assert len(_sql(again)) == 2
    assert clients.dataplane.post(f"{base}/renew", {}, format="json").status_code == 410
    missing = "/api/v1/warehouses/rr/leases/987654321"
    assert clients.dataplane.post(f"{missing}/renew", {}, format="json").status_code == 404
    assert clients.dataplane.delete(missing).status_code == 404


# --- connections of the API as shipped -------------------------------------------------------


def test_persistent_connections_are_configured_with_health_checks():
    db = settings.DATABASES["default"]
    assert db["CONN_MAX_AGE"] == settings.DUCKGRES_CONFIG_STORE_CONN_MAX_AGE
    assert db["CONN_MAX_AGE"] > 0
    assert db["CONN_HEALTH_CHECKS"] is True
    assert db["OPTIONS"]["target_session_attrs"] == "read-write"


def _request(server: Gunicorn, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"X-Duckgres-Dataplane-Secret": settings.DUCKGRES_DATAPLANE_SECRET}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    response = server.request(method, path, headers=headers, body=data)
    return response.status, json.loads(response.body) if response.body else None


def _api_backends(app: str) -> list[int]:
    with psycopg.connect(child_config_store_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [app]
        ).fetchall()
    return [int(r[0]) for r in rows]


def _terminate(app: str) -> int:
    with psycopg.connect(child_config_store_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [app],
        ).fetchall()
        # Until the server has closed them: the next request must meet a dead connection.
        for _ in range(100):
            left = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app]
            ).fetchone()
            if left == (0,):
                break
            conn.execute("SELECT pg_sleep(0.05)")
    return len(rows)


def _grant_and_release(server: Gunicorn, org: str) -> list[int]:
    base = f"/api/v1/warehouses/{org}/leases"
    status, body = _request(server, "POST", base, {"holder": "h", "purpose": "query"})
    statuses = [status]
    if status == 201:
        statuses.append(_request(server, "DELETE", f"{base}/{body['lease_id']}")[0])
    return statuses


@pytest.mark.safeguard("reshard-84")
def test_the_shipped_api_reuses_its_connections_and_survives_their_termination(
    transactional_db, tmp_path: Path
):
    make_org("failover", cap=5)
    app = f"lease-failover-{secrets.token_hex(3)}"
    dsn = child_config_store_dsn() + f"&application_name={app}"
    env = process_env(DUCKGRES_CONFIG_STORE=dsn, DUCKGRES_API_METRICS_PORT="0")
    with run_gunicorn(env, tmp_path / "gunicorn.log") as server:
        statuses: list[int] = []
        seen: set[int] = set()
        for _ in range(24):
            statuses += _grant_and_release(server, "failover")
            seen.update(_api_backends(app))
        assert set(statuses) == {201, 204}, server.log_text()[-3000:]
        # Reused and bounded: at most one connection per thread (16), still open between
        # requests (a connection per request would leave none and show ~48 backends).
        open_now = _api_backends(app)
        assert open_now, "no persistent config-store connection between requests"
        assert len(seen) <= 16, seen
        # Failover: every connection of the API is killed between requests.
        assert _terminate(app) == len(open_now)
        after: list[int] = []
        for _ in range(40):
            after += _grant_and_release(server, "failover")
        assert set(after) == {201, 204}, (after, server.log_text()[-3000:])
        assert "unhandled API error" not in server.log_text()
        assert _api_backends(app), "the API did not reconnect"
    assert ConnectionLease.objects.filter(org_id="failover", state="released").count() == 64


@pytest.mark.safeguard("reshard-84")
def test_conn_max_age_zero_still_means_a_connection_per_request(transactional_db, tmp_path):
    """The escape hatch: ``DUCKGRES_CONFIG_STORE_CONN_MAX_AGE=0`` is the old behaviour."""
    make_org("no-reuse")
    app = f"lease-noreuse-{secrets.token_hex(3)}"
    env = process_env(
        DUCKGRES_CONFIG_STORE=child_config_store_dsn() + f"&application_name={app}",
        DUCKGRES_CONFIG_STORE_CONN_MAX_AGE="0",
        DUCKGRES_API_METRICS_PORT="0",
    )
    with run_gunicorn(env, tmp_path / "gunicorn.log") as server:
        for _ in range(5):
            assert _grant_and_release(server, "no-reuse") == [201, 204]
        with psycopg.connect(child_config_store_dsn(), autocommit=True) as conn:
            for _ in range(100):
                left = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app]
                ).fetchone()
                if left == (0,):
                    break
                conn.execute("SELECT pg_sleep(0.05)")
        assert left == (0,)
