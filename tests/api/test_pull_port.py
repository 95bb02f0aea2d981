"""The password-pull port serves the password route only, and the route only there
(``duckgres_admin/api/pullport.py``; safeguard reshard-79)."""

from __future__ import annotations

import pytest

from duckgres_admin.api.pullport import PASSWORD_ROUTE
from duckgres_admin.models import ReshardLogEntry
from tests.fixtures.rows import new_op, new_store, new_warehouse

pytestmark = pytest.mark.safeguard("reshard-79")


@pytest.fixture
def op(db):
    warehouse = new_warehouse(
        org_id="pp-org",
        store=new_store(name="pp-src"),
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    return new_op(
        warehouse,
        state="running",
        runner_id="r",
        runner_epoch=1,
        target_endpoint="h",
        target_port=5432,
    )


HEADERS = {"HTTP_X_DUCKGRES_OP_EPOCH": "1", "HTTP_X_DUCKGRES_RUNNER_ID": "r"}


def test_the_route_refuses_the_main_port_and_the_pull_port_serves_nothing_else(
    clients, settings, op
):
    settings.DUCKGRES_PASSWORD_PULL_PORT = 8081
    path = f"/api/v1/reshards/{op.id}/password"
    on_main = clients.runner.get(path, SERVER_PORT="8080", **HEADERS)
    assert on_main.status_code == 404
    assert on_main.json() == {"error": "not found"}
    # On the pull port the route is reached (here: refused for want of a credential).
    on_pull = clients.runner.get(path, SERVER_PORT="8081", **HEADERS)
    assert on_pull.status_code == 403
    assert on_pull.json() == {"error": "runner identity not proven for this operation"}
    for other in ("/api/v1/reshards", f"/api/v1/reshards/{op.id}", "/admin/", "/readyz"):
        response = clients.internal.get(other, SERVER_PORT="8081")
        assert response.status_code == 404, other
        assert response.json() == {"error": "not found"}
    assert clients.internal.get("/api/v1/reshards", SERVER_PORT="8080").status_code == 200
    # Only the request that reached the route wrote an op-log line.
    assert ReshardLogEntry.objects.filter(operation_id=op.id).count() == 1


def test_without_a_pull_port_nothing_is_checked(clients, settings, op):
    settings.DUCKGRES_PASSWORD_PULL_PORT = 0
    response = clients.runner.get(
        f"/api/v1/reshards/{op.id}/password", SERVER_PORT="8080", **HEADERS
    )
    assert response.status_code == 403  # the route itself answered


def test_the_route_pattern():
    assert PASSWORD_ROUTE.match("/api/v1/reshards/12/password")
    assert not PASSWORD_ROUTE.match("/api/v1/reshards/12/password/x")
    assert not PASSWORD_ROUTE.match("/api/v1/reshards/12/log")
