"""Trino placement routes (spec trino-pools §4.2, §5) on real PostgreSQL: initial selection,
maintenance move, enable/disable with the enablement gate; roles and audit (spec reshard §5)."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from duckgres_admin.models import AuditRecord, Warehouse, WarehouseTrino
from tests.fixtures.api import error
from tests.fixtures.rows import new_warehouse

SELECTION_CLOSED = (
    "trino cell selection is only available before initial enablement; existing assignments "
    "cannot change"
)
NOT_CONFIGURED = "the assigned Trino cell is not configured"
SELECT_FIRST = "select an initial Trino cell before enabling Trino"
CELL_REQUIRED = "a configured Trino cell is required"


def _row(org: str) -> WarehouseTrino:
    return WarehouseTrino.objects.get(warehouse_id=org)


def _maybe_row(org: str) -> WarehouseTrino | None:
    return WarehouseTrino.objects.filter(warehouse_id=org).first()


def _select(client, org: str, body):
    return client.put(f"/api/v1/warehouses/{org}/trino/cell", body, format="json")


def _set(client, org: str, body):
    return client.post(f"/api/v1/warehouses/{org}/trino", body, format="json")


def _move(client, org: str, body):
    return client.post(f"/api/v1/warehouses/{org}/trino/cell/move", body, format="json")


def _audits(action: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=action).order_by("id"))


# --- PUT /warehouses/<org>/trino/cell ------------------------------------------------------------


class TestSelection:
    def test_select_is_idempotent_and_never_enables(self, clients, trino):
        new_warehouse(org_id="sel-org")
        for _ in range(2):
            response = _select(clients.admin, "sel-org", {"cell": "pool-b"})
            assert response.status_code == 200
            assert response.json() == {
                "cell": "pool-b",
                "assigned": True,
                "trino_cell_id": "registered:pool-b",
            }
        row = _row("sel-org")
        assert (row.trino_cell_id, row.enabled, row.state) == (
            "registered:pool-b",
            False,
            "pending",
        )
        audits = _audits("trino.cell_select")
        assert [(a.status, a.org_id, a.actor, a.method) for a in audits] == [
            (200, "sel-org", "admin@example.com", "PUT")
        ] * 2
        assert audits[0].path == "/api/v1/warehouses/sel-org/trino/cell"

    @pytest.mark.parametrize(
        "body",
        [{"cell": ""}, {"cell": "pool-z"}, {"cell": "registered:pool-a"}, {}, {"cell": None}],
    )
    def test_a_configured_cell_is_required(self, clients, trino, body):
        new_warehouse(org_id="sel-400")
        response = _select(clients.admin, "sel-400", body)
        assert (response.status_code, response.json()) == (400, {"error": CELL_REQUIRED})
        assert _maybe_row("sel-400") is None

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ({"cell": "pool-a", "enabled": True}, "invalid body: enabled: unknown field"),
            ({"cell": 7}, "invalid body: cell: must be a string"),
            (["pool-a"], "invalid body: body: must be a JSON object"),
        ],
    )
    def test_malformed_bodies(self, clients, trino, body, message):
        new_warehouse(org_id="sel-bad")
        response = _select(clients.admin, "sel-bad", body)
        assert (response.status_code, error(response)) == (400, message)

    def test_missing_warehouse(self, clients, trino):
        response = _select(clients.admin, "nobody", {"cell": "pool-a"})
        assert (response.status_code, response.json()) == (
            404,
            {"error": "managed warehouse not found"},
        )

    @pytest.mark.parametrize(
        "row",
        [
            {"trino_cell_id": "registered:pool-a"},
            {"trino_cell_id": "legacy"},
            {"enabled": True},
            {"state": "ready"},
            {"state": "failed"},
            {"ready_at": timezone.now()},
            {"failed_at": timezone.now()},
        ],
        ids=[
            "other-owner",
            "unconfigured-owner",
            "enabled",
            "ready",
            "failed",
            "ready_at",
            "failed_at",
        ],
    )
    @pytest.mark.safeguard("trino-7")
    def test_selection_closed(self, clients, trino, row):
        WarehouseTrino.objects.create(warehouse=new_warehouse(org_id="sel-409"), **row)
        before = WarehouseTrino.objects.filter(warehouse_id="sel-409").values().get()
        response = _select(clients.admin, "sel-409", {"cell": "pool-b"})
        assert (response.status_code, response.json()) == (409, {"error": SELECTION_CLOSED})
        assert WarehouseTrino.objects.filter(warehouse_id="sel-409").values().get() == before
        [audit] = _audits("trino.cell_select")
        assert audit.status == 409
        assert audit.detail == SELECTION_CLOSED


# --- POST /warehouses/<org>/trino/cell/move ------------------------------------------------------


class TestMove:
    def test_move_resets_the_row_and_repeats_as_a_no_op(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="mv-org"),
            trino_cell_id="registered:pool-a",
            enabled=True,
            state="ready",
            status_message="serving",
            ready_at=timezone.now(),
            catalog_name="org_mv_org",
            backend="hoglake",
            tier="scale",
        )
        for _ in range(2):
            response = _move(clients.internal, "mv-org", {"from": "pool-a", "to": "pool-b"})
            assert response.status_code == 200
            assert response.json() == {
                "org_id": "mv-org",
                "enabled": True,
                "tier": "scale",
                "state": "pending",
                "cell": "pool-b",
                "trino_cell_id": "registered:pool-b",
                "assigned": True,
            }
        row = _row("mv-org")
        assert (row.trino_cell_id, row.state, row.status_message) == (
            "registered:pool-b",
            "pending",
            "",
        )
        assert (row.ready_at, row.failed_at, row.catalog_name) == (None, None, "")
        assert (row.backend, row.enabled, row.tier) == ("hoglake", True, "scale")
        audits = _audits("trino.cell_move")
        assert [(a.status, a.actor, a.source) for a in audits] == [
            (200, "internal-secret", "internal-secret")
        ] * 2

    def test_move_refusals(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="mv-409"), trino_cell_id="registered:pool-a"
        )
        response = _move(clients.admin, "mv-409", {"from": "pool-b", "to": "pool-a"})
        assert response.status_code == 200  # already on pool-a: the finished move's no-op
        trino.install("pool-a", "pool-b", "pool-c")
        response = _move(clients.admin, "mv-409", {"from": "pool-b", "to": "pool-c"})
        assert (response.status_code, response.json()) == (
            409,
            {"error": "the warehouse's Trino cell is not pool-b"},
        )
        new_warehouse(org_id="mv-none")
        response = _move(clients.admin, "mv-none", {"from": "pool-a", "to": "pool-b"})
        assert (response.status_code, response.json()) == (
            409,
            {"error": "the warehouse has no Trino cell assignment on pool-a"},
        )
        response = _move(clients.admin, "nobody", {"from": "pool-a", "to": "pool-b"})
        assert (response.status_code, response.json()) == (
            404,
            {"error": "managed warehouse not found"},
        )
        assert _row("mv-409").trino_cell_id == "registered:pool-a"

    @pytest.mark.parametrize(
        ("body", "status", "message"),
        [
            ({"from": "pool-a", "to": "pool-z"}, 400, CELL_REQUIRED),
            ({"from": "legacy", "to": "pool-b"}, 400, CELL_REQUIRED),
            ({"to": "pool-b"}, 400, "invalid body: from: required"),
            ({"from": "pool-a"}, 400, "invalid body: to: required"),
            ({"from": "pool-a", "to": "pool-b", "x": 1}, 400, "invalid body: x: unknown field"),
        ],
    )
    def test_both_pools_must_be_configured(self, clients, trino, body, status, message):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="mv-400"), trino_cell_id="registered:pool-a"
        )
        response = _move(clients.admin, "mv-400", body)
        assert (response.status_code, error(response)) == (status, message)
        assert _row("mv-400").trino_cell_id == "registered:pool-a"

    def test_a_removed_pool_can_only_be_left_by_disabling(self, clients, trino):
        """An owner whose pool left the registry fails closed: a move needs both pools."""
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="mv-gone"),
            trino_cell_id="registered:pool-b",
            enabled=True,
        )
        trino.install("pool-a")
        response = _move(clients.admin, "mv-gone", {"from": "pool-b", "to": "pool-a"})
        assert (response.status_code, error(response)) == (400, CELL_REQUIRED)
        response = _set(clients.admin, "mv-gone", {"enabled": False})
        assert response.status_code == 202
        assert _row("mv-gone").trino_cell_id == "registered:pool-b"  # the owner is kept


# --- POST /warehouses/<org>/trino -----------------------------------------------------------------


class TestEnable:
    @pytest.mark.safeguard("trino-7")
    def test_default_placement_on_first_enable(self, clients, trino):
        new_warehouse(org_id="en-org")
        response = _set(clients.admin, "en-org", {"enabled": True, "tier": "growth"})
        assert response.status_code == 202
        assert response.json() == {
            "org_id": "en-org",
            "enabled": True,
            "tier": "growth",
            "state": "pending",
            "cell": "pool-a",
            "trino_cell_id": "registered:pool-a",
            "assigned": True,
        }
        row = _row("en-org")
        assert (row.enabled, row.trino_cell_id, row.tier, row.backend_selected) == (
            True,
            "registered:pool-a",
            "growth",
            True,
        )
        [audit] = _audits("trino.enable")
        assert (audit.status, audit.org_id, audit.method) == (202, "en-org", "POST")
        assert audit.detail == "trino enabled on registered:pool-a (tier growth)"

    @pytest.mark.safeguard("trino-7")
    def test_selected_owner_is_kept_and_changing_the_default_moves_nobody(self, clients, trino):
        new_warehouse(org_id="en-sel")
        assert _select(clients.admin, "en-sel", {"cell": "pool-b"}).status_code == 200
        assert _set(clients.admin, "en-sel", {"enabled": True}).status_code == 202
        assert _row("en-sel").trino_cell_id == "registered:pool-b"
        trino.install("pool-a", "pool-b", default="pool-b")
        new_warehouse(org_id="en-other")
        assert _set(clients.admin, "en-other", {"enabled": True}).status_code == 202
        trino.install("pool-a", "pool-b", default="pool-a")
        assert _set(clients.admin, "en-other", {"enabled": True}).status_code == 202
        assert _row("en-other").trino_cell_id == "registered:pool-b"

    def test_tier_is_kept_when_omitted_and_a_ready_row_stays_ready(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="en-tier"),
            trino_cell_id="registered:pool-a",
            enabled=True,
            tier="scale",
            state="ready",
            ready_at=timezone.now(),
        )
        response = _set(clients.admin, "en-tier", {"enabled": True})
        assert response.status_code == 202
        row = _row("en-tier")
        assert (row.tier, row.state, row.enabled) == ("scale", "ready", True)
        assert row.ready_at is not None
        assert _set(clients.admin, "en-tier", {"enabled": True, "tier": ""}).status_code == 202
        assert _row("en-tier").tier == ""

    @pytest.mark.safeguard("trino-42")
    @pytest.mark.parametrize("state", ["pending", "resharding", "failed", "deleting"])
    def test_enabling_needs_a_ready_warehouse(self, clients, trino, state):
        new_warehouse(org_id="en-nr", state=state)
        response = _set(clients.admin, "en-nr", {"enabled": True})
        assert response.status_code == 409
        assert response.json() == {
            "code": "warehouse_not_ready",
            "error": f"Trino can only be enabled on a ready warehouse (currently {state})",
        }
        assert _maybe_row("en-nr") is None  # no row, no owner
        assert Warehouse.objects.get(org_id="en-nr").state == state

    @pytest.mark.safeguard("trino-42")
    def test_enabling_a_resharding_warehouse_leaves_its_row_unchanged(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="en-rs", state="resharding"),
            trino_cell_id="registered:pool-b",
            tier="free",
        )
        before = WarehouseTrino.objects.filter(warehouse_id="en-rs").values().get()
        response = _set(clients.admin, "en-rs", {"enabled": True, "tier": "scale"})
        assert response.json()["code"] == "warehouse_not_ready"
        assert WarehouseTrino.objects.filter(warehouse_id="en-rs").values().get() == before

    def test_no_owner_and_no_default(self, clients, trino):
        trino.install("pool-a", "pool-b", default=None)
        new_warehouse(org_id="en-nd")
        response = _set(clients.admin, "en-nd", {"enabled": True})
        assert (response.status_code, response.json()) == (409, {"error": SELECT_FIRST})
        assert _maybe_row("en-nd") is None
        assert _select(clients.admin, "en-nd", {"cell": "pool-b"}).status_code == 200
        assert _set(clients.admin, "en-nd", {"enabled": True}).status_code == 202

    @pytest.mark.parametrize("owner", ["legacy", "cell-001", "registered:unknown"])
    def test_unconfigured_owner_fails_closed(self, clients, trino, owner):
        WarehouseTrino.objects.create(warehouse=new_warehouse(org_id="en-x"), trino_cell_id=owner)
        response = _set(clients.admin, "en-x", {"enabled": True})
        assert (response.status_code, response.json()) == (409, {"error": NOT_CONFIGURED})
        row = _row("en-x")
        assert (row.enabled, row.trino_cell_id) == (False, owner)  # never re-homed

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ({}, "invalid body: enabled: required"),
            ({"enabled": "true"}, "invalid body: enabled: must be a boolean"),
            ({"enabled": None}, "invalid body: enabled: must be a boolean"),
            (
                {"enabled": True, "tier": "gold"},
                'invalid body: tier: must be one of "", free, growth, scale',
            ),
            ({"enabled": True, "tier": 3}, "invalid body: tier: must be a string"),
            (
                {"enabled": False, "tier": "free"},
                "invalid body: tier: accepted only with enabled true",
            ),
            ({"enabled": True, "cell": "pool-a"}, "invalid body: cell: unknown field"),
            (
                {"enabled": True, "dry_run": True},
                "invalid body: dry_run: accepted only on POST /api/v1/warehouses/<org>/reshards",
            ),
        ],
    )
    def test_invalid_bodies(self, clients, trino, body, message):
        new_warehouse(org_id="en-bad")
        response = _set(clients.admin, "en-bad", body)
        assert (response.status_code, error(response)) == (400, message)
        assert _maybe_row("en-bad") is None

    def test_malformed_json_and_missing_warehouse(self, clients, trino):
        response = clients.admin.post(
            "/api/v1/warehouses/x/trino", "{not json", content_type="application/json"
        )
        assert (response.status_code, error(response)) == (
            400,
            "invalid body: body: malformed JSON",
        )
        for body in ({"enabled": True}, {"enabled": False}):
            response = _set(clients.admin, "nobody", body)
            assert (response.status_code, response.json()) == (
                404,
                {"error": "managed warehouse not found"},
            )
        assert [a.action for a in AuditRecord.objects.order_by("id")] == [
            "trino.enable",
            "trino.enable",
            "trino.disable",
        ]


class TestDisable:
    def test_disable_keeps_the_owner(self, clients, trino):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="dis-org"),
            trino_cell_id="registered:pool-b",
            enabled=True,
            state="failed",
            status_message="boom",
            failed_at=timezone.now(),
            ready_at=timezone.now(),
            tier="growth",
        )
        response = _set(clients.admin, "dis-org", {"enabled": False})
        assert response.status_code == 202
        assert response.json() == {
            "org_id": "dis-org",
            "enabled": False,
            "tier": "growth",
            "state": "pending",
            "cell": "pool-b",
            "trino_cell_id": "registered:pool-b",
            "assigned": True,
        }
        row = _row("dis-org")
        assert (row.enabled, row.state, row.status_message, row.failed_at) == (
            False,
            "pending",
            "",
            None,
        )
        assert row.trino_cell_id == "registered:pool-b"
        [audit] = _audits("trino.disable")
        assert (audit.status, audit.detail) == (
            202,
            "trino disabled (owner registered:pool-b kept)",
        )

    def test_disable_without_a_row_and_on_any_warehouse_state(self, clients, trino):
        new_warehouse(org_id="dis-none", state="resharding")
        response = _set(clients.admin, "dis-none", {"enabled": False})
        assert response.status_code == 202
        assert response.json()["enabled"] is False
        assert response.json()["assigned"] is False
        assert _maybe_row("dis-none") is None

    @pytest.mark.parametrize("owner", ["legacy", "registered:unknown"])
    def test_an_unconfigured_owner_can_be_disabled(self, clients, trino, owner):
        WarehouseTrino.objects.create(
            warehouse=new_warehouse(org_id="dis-x"), trino_cell_id=owner, enabled=True
        )
        response = _set(clients.admin, "dis-x", {"enabled": False})
        assert response.status_code == 202
        assert response.json()["cell"] == ""
        assert response.json()["trino_cell_id"] == owner
        assert _row("dis-x").enabled is False

    def test_the_reshard_start_follows_enablement(self, clients, trino):
        """Enabled → the reshard start refuses with trino_enabled; disabled → it gets past it."""
        new_warehouse(org_id="dis-rs")
        assert _set(clients.admin, "dis-rs", {"enabled": True}).status_code == 202
        start = {"target": {"type": "cnpg", "cnpg_shard": "shard-002"}}
        response = clients.admin.post("/api/v1/warehouses/dis-rs/reshards", start, format="json")
        assert response.status_code == 409
        assert response.json()["code"] == "trino_enabled"
        assert _set(clients.admin, "dis-rs", {"enabled": False}).status_code == 202
        response = clients.admin.post("/api/v1/warehouses/dis-rs/reshards", start, format="json")
        assert response.json().get("code") != "trino_enabled"


# --- roles and audit ----------------------------------------------------------------------------

MUTATIONS = [
    ("put", "/api/v1/warehouses/role-org/trino/cell", {"cell": "pool-a"}, "trino.cell_select"),
    ("post", "/api/v1/warehouses/role-org/trino", {"enabled": True}, "trino.enable"),
    ("post", "/api/v1/warehouses/role-org/trino", {"enabled": False}, "trino.disable"),
    (
        "post",
        "/api/v1/warehouses/role-org/trino/cell/move",
        {"from": "pool-a", "to": "pool-b"},
        "trino.cell_move",
    ),
]


@pytest.mark.safeguard("reshard-50")
@pytest.mark.parametrize(("method", "path", "body", "action"), MUTATIONS)
def test_mutations_need_admin_and_are_audited_without_bodies(
    clients, trino, method, path, body, action
):
    warehouse = new_warehouse(org_id="role-org")
    if action == "trino.cell_move":
        WarehouseTrino.objects.create(warehouse=warehouse, trino_cell_id="registered:pool-a")
    before = list(WarehouseTrino.objects.values())
    marker = {**body, "note-never-audited": "marker-9f2c"}
    refusals = [
        (clients.viewer, 403, "admin role required"),
        (clients.superuser, 403, "admin role required"),  # no operator row: a viewer
        (clients.disabled, 403, "operator disabled"),
        (clients.runner, 403, "this secret is not accepted on this route"),
        (clients.dataplane, 403, "this secret is not accepted on this route"),
        (clients.anon, 401, "authentication required"),
    ]
    for client, status, message in refusals:
        response = getattr(client, method)(path, marker, format="json")
        assert (response.status_code, error(response)) == (status, message)
    # An admin's bad body (the marker key is unknown) is refused and audited, never echoed.
    response = getattr(clients.admin, method)(path, marker, format="json")
    assert response.status_code == 400
    assert error(response) == "invalid body: note-never-audited: unknown field"
    assert list(WarehouseTrino.objects.values()) == before
    ok = 202 if path.endswith("/trino") else 200
    for client in (clients.internal, clients.admin):
        response = getattr(client, method)(path, body, format="json")
        assert response.status_code == ok, response.json()
    audits = list(AuditRecord.objects.order_by("id"))
    assert {a.action for a in audits} == {action}
    # The unauthenticated (401) request proved no identity: it writes nothing (reshard-68).
    assert [a.status for a in audits] == [403, 403, 403, 403, 403, 400, ok, ok]
    assert [a.actor for a in audits][-2:] == ["internal-secret", "admin@example.com"]
    assert [a.source for a in audits][-2:] == ["internal-secret", "django"]
    assert [a.role for a in audits][-2:] == ["admin", "admin"]
    for audit in audits:
        assert audit.org_id == "role-org"
        assert audit.path == path
        assert audit.method == method.upper()
        assert "marker-9f2c" not in audit.detail


# --- the gate under the per-org lock ------------------------------------------------------------


@pytest.mark.safeguard("trino-42")
def test_the_ready_check_runs_under_the_per_org_lock(transactional_db, clients, trino):
    """An enable queued behind a holder of the per-org advisory lock (the reshard block step's)
    sees the state that holder commits: the block wins, the enable is 409, the row untouched."""
    from duckgres_admin.platform.orglock import org_lock_key

    new_warehouse(org_id="lock-org")
    db = connection.settings_dict
    conninfo = {
        "dbname": db["NAME"],
        "host": db.get("HOST") or "127.0.0.1",
        "port": db.get("PORT") or 5432,
        "user": db.get("USER") or "postgres",
    }
    if db.get("PASSWORD"):
        conninfo["password"] = db["PASSWORD"]
    outcome: dict[str, object] = {}
    with psycopg.connect(**conninfo) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [org_lock_key("lock-org")])

        def enable() -> None:
            try:
                response = _set(clients.internal, "lock-org", {"enabled": True})
                outcome["status"] = response.status_code
                outcome["body"] = response.json()
            finally:
                connection.close()

        thread = threading.Thread(target=enable)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive(), "the enable did not wait for the per-org lock"
        holder.execute(
            "UPDATE duckgres_managed_warehouses SET state = 'resharding' WHERE org_id = %s",
            ["lock-org"],
        )
        holder.commit()
        thread.join(timeout=30)
    assert outcome["status"] == 409
    assert outcome["body"] == {
        "code": "warehouse_not_ready",
        "error": "Trino can only be enabled on a ready warehouse (currently resharding)",
    }
    assert _maybe_row("lock-org") is None


def _reshard_block(org: str) -> str:
    """The reshard block transaction (reshard spec §4.4 A) with the reshard domain's own lock
    and Trino re-check."""
    from django.db import transaction

    from duckgres_admin.platform.orglock import lock_org
    from reshard.runner.steps.blocking import _trino_enabled

    try:
        with transaction.atomic():
            lock_org(org)
            if _trino_enabled(org):
                return "refused"
            moved = Warehouse.objects.filter(org_id=org, state="ready").update(state="resharding")
            return "blocked" if moved == 1 else "not ready"
    finally:
        connection.close()


def _race(workers: list[Callable[[], Any]]) -> list[Any]:
    barrier = threading.Barrier(len(workers))
    outcomes: list[object] = [None] * len(workers)

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            outcomes[i] = fn()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


@pytest.mark.safeguard("trino-42")
def test_an_api_enable_racing_a_reshard_block_exactly_one_wins(transactional_db, clients, trino):
    for i in range(6):
        org = f"race-block-{i}"
        new_warehouse(org_id=org)

        def enable(org: str = org) -> tuple[int, dict[str, object]]:
            response = _set(clients.internal, org, {"enabled": True})
            return response.status_code, response.json()

        enabled, blocked = _race([enable, functools.partial(_reshard_block, org)])
        state = Warehouse.objects.get(org_id=org).state
        row = _maybe_row(org)
        assert isinstance(enabled, tuple)
        if enabled[0] == 202:
            assert blocked == "refused"
            assert (state, row is not None and row.enabled) == ("ready", True)
        else:
            assert enabled[0] == 409
            assert enabled[1]["code"] == "warehouse_not_ready"
            assert blocked == "blocked"
            assert state == "resharding"
            assert row is None


@pytest.mark.safeguard("trino-7")
def test_twenty_concurrent_api_selections_and_default_enables_keep_one_owner(
    transactional_db, clients, trino
):
    from rest_framework.test import APIClient

    org = "race-owner"
    new_warehouse(org_id=org)

    def client() -> APIClient:
        c = APIClient()
        c.credentials(HTTP_X_DUCKGRES_INTERNAL_SECRET=django_settings.DUCKGRES_INTERNAL_SECRET)
        return c

    def select() -> tuple[int, str]:
        response = _select(client(), org, {"cell": "pool-b"})
        return response.status_code, json.dumps(response.json())

    def enable() -> tuple[int, str]:
        response = _set(client(), org, {"enabled": True})
        return response.status_code, json.dumps(response.json())

    outcomes = _race([select if i % 2 else enable for i in range(20)])
    owner = _row(org).trino_cell_id
    assert owner in ("registered:pool-a", "registered:pool-b")
    for status, body in outcomes:
        if status == 409:
            assert json.loads(body) == {"error": SELECTION_CLOSED}
        else:
            assert status in (200, 202)
            assert json.loads(body)["trino_cell_id"] == owner
    # Preserved afterwards: no path claims the owned row.
    other = "pool-b" if owner == "registered:pool-a" else "pool-a"
    assert _select(clients.internal, org, {"cell": other}).status_code == 409
    assert _set(clients.internal, org, {"enabled": True}).status_code == 202
    assert _row(org).trino_cell_id == owner
    assert AuditRecord.objects.filter(action__startswith="trino.").count() == 22


def test_a_config_store_error_is_cannot_verify(clients, trino, monkeypatch):
    """Spec §4.2: a DB error while checking the assignment → 500 "cannot verify Trino cell
    assignment" (PUT cell and enable), never the driver's text."""
    from django.db import DatabaseError

    from trino_pools import placement

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("connection to 10.0.0.9 lost")

    new_warehouse(org_id="db-err")
    monkeypatch.setattr(placement, "select_cell", broken)
    monkeypatch.setattr(placement, "enable_trino", broken)
    for response in (
        _select(clients.admin, "db-err", {"cell": "pool-a"}),
        _set(clients.admin, "db-err", {"enabled": True}),
    ):
        assert (response.status_code, response.json()) == (
            500,
            {"error": "cannot verify Trino cell assignment"},
        )
    assert [a.status for a in AuditRecord.objects.order_by("id")] == [500, 500]
