"""The warehouse create/update endpoints with ``"trino": {"enabled", "tier"}`` (spec reshard
§5.5, trino-pools §4.2): Trino is provisioned in the request's own transaction, so any refusal
or later failure leaves neither an enabled row nor a placement."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.api import warehouse_views as views
from duckgres_admin.models import AuditRecord, Warehouse, WarehouseTrino
from tests.fixtures.api import error
from tests.fixtures.rows import new_warehouse


def _create(client: Any, **body: Any) -> Any:
    return client.post("/api/v1/warehouses", body, format="json")


def _patch(client: Any, org: str, **body: Any) -> Any:
    return client.patch(f"/api/v1/warehouses/{org}", body, format="json")


def _row(org: str) -> WarehouseTrino | None:
    return WarehouseTrino.objects.filter(warehouse_id=org).first()


def _explode(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected failure after the Trino enable")


class TestCreate:
    @pytest.mark.safeguard("trino-7")
    def test_create_ready_with_trino_places_on_the_default(self, clients, trino):
        response = _create(
            clients.internal,
            org_id="wc-org",
            state="ready",
            trino={"enabled": True, "tier": "free"},
        )
        assert response.status_code == 201, response.content
        assert response.json()["org_id"] == "wc-org"
        row = _row("wc-org")
        assert row is not None
        assert (row.enabled, row.trino_cell_id, row.tier) == (True, "registered:pool-a", "free")
        [audit] = AuditRecord.objects.all()
        assert (audit.action, audit.status, audit.org_id) == ("warehouse.create", 201, "wc-org")
        assert audit.detail == (
            "warehouse wc-org created; trino enabled on registered:pool-a (tier free)"
        )

    @pytest.mark.safeguard("trino-42")
    def test_create_not_ready_with_trino_creates_nothing(self, clients, trino):
        response = _create(clients.internal, org_id="wc-pending", trino={"enabled": True})
        assert response.status_code == 409
        assert response.json() == {
            "code": "warehouse_not_ready",
            "error": "Trino can only be enabled on a ready warehouse (currently pending)",
        }
        assert not Warehouse.objects.filter(org_id="wc-pending").exists()
        assert _row("wc-pending") is None
        [audit] = AuditRecord.objects.all()
        assert (audit.action, audit.status) == ("warehouse.create", 409)

    def test_create_without_a_default_needs_a_selection_first(self, clients, trino):
        trino.install("pool-a", "pool-b", default=None)
        response = _create(clients.internal, org_id="wc-nd", state="ready", trino={"enabled": True})
        assert (response.status_code, response.json()) == (
            409,
            {"error": "select an initial Trino cell before enabling Trino"},
        )
        assert not Warehouse.objects.filter(org_id="wc-nd").exists()

    def test_create_with_trino_disabled_writes_no_row(self, clients, trino):
        response = _create(clients.internal, org_id="wc-off", trino={"enabled": False})
        assert response.status_code == 201
        assert _row("wc-off") is None

    @pytest.mark.safeguard("trino-7")
    def test_a_failure_after_the_enable_rolls_back_warehouse_row_and_placement(
        self, clients, trino, monkeypatch
    ):
        monkeypatch.setattr(views, "warehouse_json", _explode)
        response = _create(
            clients.internal, org_id="wc-boom", state="ready", trino={"enabled": True}
        )
        assert response.status_code == 500
        assert error(response) == "internal error (RuntimeError)"
        assert not Warehouse.objects.filter(org_id="wc-boom").exists()
        assert not WarehouseTrino.objects.filter(warehouse_id="wc-boom").exists()


class TestUpdate:
    @pytest.mark.safeguard("trino-42")
    def test_ready_as_the_request_leaves_it(self, clients, trino):
        new_warehouse(org_id="wu-org", state="pending")
        response = _patch(clients.admin, "wu-org", state="ready", trino={"enabled": True})
        assert response.status_code == 200, response.content
        assert response.json()["state"] == "ready"
        row = _row("wu-org")
        assert row is not None
        assert (row.enabled, row.trino_cell_id) == (True, "registered:pool-a")
        [audit] = AuditRecord.objects.all()
        assert audit.action == "warehouse.update"
        assert audit.detail == "updated state; trino enabled on registered:pool-a (tier none)"

    @pytest.mark.safeguard("trino-42")
    def test_leaving_ready_while_enabling_changes_nothing(self, clients, trino):
        new_warehouse(org_id="wu-down", state="ready", database_name="before")
        response = _patch(
            clients.admin,
            "wu-down",
            state="pending",
            database_name="after",
            trino={"enabled": True},
        )
        assert response.status_code == 409
        assert response.json()["code"] == "warehouse_not_ready"
        warehouse = Warehouse.objects.get(org_id="wu-down")
        assert (warehouse.state, warehouse.database_name) == ("ready", "before")
        assert _row("wu-down") is None

    @pytest.mark.safeguard("trino-42")
    def test_resharding_warehouse_cannot_be_enabled(self, clients, trino):
        new_warehouse(org_id="wu-rs", state="resharding")
        response = _patch(clients.admin, "wu-rs", trino={"enabled": True})
        assert response.status_code == 409
        assert response.json() == {
            "code": "warehouse_not_ready",
            "error": "Trino can only be enabled on a ready warehouse (currently resharding)",
        }
        assert _row("wu-rs") is None

    def test_disable_keeps_the_owner_and_tier_rules(self, clients, trino):
        new_warehouse(org_id="wu-off")
        response = _patch(clients.admin, "wu-off", trino={"enabled": True, "tier": "scale"})
        assert response.status_code == 200
        response = _patch(clients.admin, "wu-off", trino={"enabled": True})
        assert response.status_code == 200
        row = _row("wu-off")
        assert row is not None
        assert row.tier == "scale"  # omitted tier keeps the stored one
        response = _patch(clients.admin, "wu-off", trino={"enabled": False})
        assert response.status_code == 200
        row = _row("wu-off")
        assert row is not None
        assert (row.enabled, row.trino_cell_id, row.state) == (
            False,
            "registered:pool-a",
            "pending",
        )
        assert AuditRecord.objects.order_by("-id").first().detail == (  # type: ignore[union-attr]
            "no change; trino disabled (owner registered:pool-a kept)"
        )

    @pytest.mark.safeguard("trino-7")
    def test_a_failure_after_the_enable_leaves_no_enabled_row_and_no_placement(
        self, clients, trino, monkeypatch
    ):
        new_warehouse(org_id="wu-boom", state="pending")
        monkeypatch.setattr(views, "warehouse_json", _explode)
        response = _patch(clients.admin, "wu-boom", state="ready", trino={"enabled": True})
        assert response.status_code == 500
        assert _row("wu-boom") is None
        assert Warehouse.objects.get(org_id="wu-boom").state == "pending"
        # An existing unowned, disabled row is left exactly as it was, too.
        WarehouseTrino.objects.create(warehouse_id="wu-boom", tier="free")
        before = WarehouseTrino.objects.filter(warehouse_id="wu-boom").values().get()
        response = _patch(clients.admin, "wu-boom", state="ready", trino={"enabled": True})
        assert response.status_code == 500
        assert WarehouseTrino.objects.filter(warehouse_id="wu-boom").values().get() == before

    def test_unconfigured_owner_fails_the_whole_update(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="wu-x", database_name="before"), trino_cell_id="legacy"
        )
        response = _patch(clients.admin, "wu-x", database_name="after", trino={"enabled": True})
        assert (response.status_code, response.json()) == (
            409,
            {"error": "the assigned Trino cell is not configured"},
        )
        assert Warehouse.objects.get(org_id="wu-x").database_name == "before"

    def test_viewer_cannot_enable_through_the_warehouse(self, clients, trino):
        new_warehouse(org_id="wu-view")
        response = _patch(clients.viewer, "wu-view", trino={"enabled": True})
        assert (response.status_code, error(response)) == (403, "admin role required")
        assert _row("wu-view") is None


@pytest.mark.parametrize(
    ("trino_value", "message"),
    [
        (True, "invalid body: trino: must be a JSON object"),
        ({}, "invalid body: trino.enabled: required"),
        ({"enabled": "yes"}, "invalid body: trino.enabled: must be a boolean"),
        (
            {"enabled": True, "tier": "gold"},
            'invalid body: trino.tier: must be one of "", free, growth, scale',
        ),
        (
            {"enabled": False, "tier": "free"},
            "invalid body: trino.tier: accepted only with enabled true",
        ),
        ({"enabled": True, "cell": "pool-b"}, "invalid body: trino.cell: unknown field"),
    ],
)
def test_invalid_trino_key(clients, trino, trino_value, message):
    response = _create(clients.internal, org_id="wk-bad", state="ready", trino=trino_value)
    assert (response.status_code, error(response)) == (400, message)
    assert not Warehouse.objects.filter(org_id="wk-bad").exists()
    new_warehouse(org_id="wk-bad2")
    response = _patch(clients.internal, "wk-bad2", trino=trino_value)
    assert (response.status_code, error(response)) == (400, message)
    assert _row("wk-bad2") is None


def test_trino_key_without_trino_wired(clients, trino):
    trino.unwire()
    message = "invalid body: trino: Trino is not configured on this control plane"
    response = _create(clients.internal, org_id="wk-nw", state="ready", trino={"enabled": True})
    assert (response.status_code, error(response)) == (400, message)
    assert not Warehouse.objects.filter(org_id="wk-nw").exists()
    new_warehouse(org_id="wk-nw2")
    response = _patch(clients.internal, "wk-nw2", trino={"enabled": False})
    assert (response.status_code, error(response)) == (400, message)
    # Without the key the warehouse routes work as before.
    assert _patch(clients.internal, "wk-nw2", database_name="d").status_code == 200
