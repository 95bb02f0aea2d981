"""Reads, log paging, targets and cancel (spec §5.2)."""

from __future__ import annotations

import pytest

from duckgres_admin.models import AuditRecord, ReshardLogEntry, ReshardOperation
from reshard.start import stash
from tests.fixtures.api import error
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.stores import TEST_SSLMODE


def _warehouse(org: str, store=None, **kw):
    store = store or new_store(name=f"{org}-store")
    return new_warehouse(
        org_id=org,
        store=store,
        metadata_store_database=kw.pop("database", "d"),
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
        **kw,
    )


@pytest.fixture
def target_store(db):
    return new_store(name="target-store")


def test_list_newest_first_with_filters_and_limits(clients, target_store):
    ops = []
    for i in range(3):
        warehouse = _warehouse(f"org-{i}")
        ops.append(new_op(warehouse, to_store=target_store, state="failed" if i else "pending"))
    response = clients.viewer.get("/api/v1/reshards")
    assert response.status_code == 200
    assert [o["id"] for o in response.json()["operations"]] == [o.id for o in reversed(ops)]
    assert [
        o["id"] for o in clients.viewer.get("/api/v1/reshards?org=org-1").json()["operations"]
    ] == [ops[1].id]
    pending = clients.viewer.get("/api/v1/reshards?state=pending").json()["operations"]
    assert [o["id"] for o in pending] == [ops[0].id]
    assert len(clients.viewer.get("/api/v1/reshards?limit=2").json()["operations"]) == 2
    for bad in ("0", "-1", "501", "x"):
        assert len(clients.viewer.get(f"/api/v1/reshards?limit={bad}").json()["operations"]) == 3
    # One page (docs/api.md "Pagination"): next_before is null on the last one.
    assert clients.viewer.get("/api/v1/reshards?org=nobody").json() == {
        "operations": [],
        "next_before": None,
    }


def test_detail_and_404(clients, target_store):
    op = new_op(_warehouse("detail"), to_store=target_store)
    body = clients.internal.get(f"/api/v1/reshards/{op.id}").json()
    # Every column but the local pull credential's verifier (safeguard reshard-79).
    expected = {f.column for f in ReshardOperation._meta.concrete_fields}
    assert "password_pull_digest" in expected
    # ... plus the computed in_place (a restore onto the warehouse's own store, docs/api.md).
    assert set(body) == (expected - {"password_pull_digest"}) | {"in_place"}
    assert body["in_place"] is False
    assert body["compaction_prior"] is None
    assert body["progress"] == {}
    response = clients.internal.get("/api/v1/reshards/999999")
    assert response.status_code == 404
    assert error(response) == "no such reshard operation"
    assert clients.internal.get("/api/v1/reshards/abc").status_code == 404


@pytest.mark.safeguard("reshard-33")
def test_log_paging_2500_lines_over_two_pages(clients, target_store):
    op = new_op(_warehouse("logs"), to_store=target_store)
    other = new_op(_warehouse("logs-other"), to_store=target_store)
    ReshardLogEntry.objects.bulk_create(
        [
            ReshardLogEntry(operation_id=op.id, message=f"line {i}", source="runner", level="info")
            for i in range(2500)
        ]
        + [ReshardLogEntry(operation_id=other.id, message="noise", source="runner")]
    )
    seen: list[str] = []
    after = 0
    pages = 0
    while True:
        body = clients.viewer.get(f"/api/v1/reshards/{op.id}/log?after={after}&limit=2000").json()
        if not body["entries"]:
            assert body["next_after"] == after
            break
        pages += 1
        seen += [e["message"] for e in body["entries"]]
        assert set(body["entries"][0]) == {"id", "operation_id", "ts", "level", "source", "message"}
        after = body["next_after"]
    assert pages == 2
    assert seen == [f"line {i}" for i in range(2500)]
    # Defaults: limit 500 (also for out-of-range values), unparsable after → 0.
    for query in ("", "?limit=0", "?limit=2001", "?after=x"):
        body = clients.viewer.get(f"/api/v1/reshards/{op.id}/log{query}").json()
        assert len(body["entries"]) == 500
        assert body["entries"][0]["message"] == "line 0"
    response = clients.viewer.get("/api/v1/reshards/999999/log")
    assert response.status_code == 404


@pytest.mark.safeguard("reshard-29")
def test_targets_list_empty_stores_and_external_bindings(clients):
    used = new_store(name="shard-used")
    new_store(name="shard-empty")
    new_store(name="ext-registered", kind="external", host="b.example", port=6543)
    _warehouse("t1", store=used)
    _warehouse("t2", store=used, database="d2")
    _warehouse("t3", store=used, database="d3", state="deleted")
    new_warehouse(
        org_id="ext-1",
        metadata_store_kind="external",
        metadata_store_host="a.example",
        metadata_store_port=5432,
        metadata_store_sslmode="require",
        metadata_store_database="cat",
        metadata_store_user="u",
        metadata_store_password_ref="env:EXT_PW",
    )
    body = clients.viewer.get("/api/v1/reshards/targets").json()
    assert body["shards"] == [
        {"name": "shard-empty", "tenants": 0},
        {"name": "shard-used", "tenants": 2},
    ]
    assert body["external_stores"] == [
        {
            "host": "a.example",
            "port": 5432,
            "sslmode": "require",
            "user": "u",
            "database": "cat",
            "password_secret_ref": "env:EXT_PW",
        },
        {
            "host": "b.example",
            "port": 6543,
            "sslmode": TEST_SSLMODE,  # new_store's default
            "user": "",
            "database": "",
            "password_secret_ref": "",
        },
    ]


def test_targets_with_nothing_registered(clients):
    assert clients.viewer.get("/api/v1/reshards/targets").json() == {
        "shards": [],
        "external_stores": [],
    }


def test_cancel_pending_running_terminal_unknown(clients, target_store):
    pending = new_op(_warehouse("c1"), to_store=target_store)
    stash.put(pending.id, "some-stashed-password")
    response = clients.admin.post(f"/api/v1/reshards/{pending.id}/cancel")
    assert response.status_code == 200
    assert response.json() == {"state": "cancelled"}
    pending.refresh_from_db()
    assert (pending.state, pending.error) == ("cancelled", "cancelled before start")
    assert pending.finished_at is not None
    assert stash.held_ids() == []
    line = ReshardLogEntry.objects.get(operation_id=pending.id)
    assert (line.level, line.message) == (
        "warn",
        "cancelled by admin@example.com before the runner claimed it",
    )

    running = new_op(_warehouse("c2"), to_store=target_store, state="running", runner_id="r")
    response = clients.internal.post(f"/api/v1/reshards/{running.id}/cancel")
    assert response.status_code == 202
    assert response.json() == {"cancel_requested": True}
    running.refresh_from_db()
    assert running.cancel_requested is True
    assert running.state == "running"
    assert ReshardLogEntry.objects.get(operation_id=running.id).message == (
        "cancel requested by internal-secret"
    )

    response = clients.internal.post(f"/api/v1/reshards/{pending.id}/cancel")
    assert response.status_code == 409
    assert error(response) == "operation already cancelled"
    response = clients.internal.post("/api/v1/reshards/999999/cancel")
    assert response.status_code == 404
    response = clients.viewer.post(f"/api/v1/reshards/{running.id}/cancel")
    assert response.status_code == 403

    audits = list(AuditRecord.objects.order_by("id").values_list("action", "status", "org_id"))
    assert audits == [
        ("reshard.cancel", 200, "c1"),
        ("reshard.cancel", 202, "c2"),
        ("reshard.cancel", 409, "c1"),
        ("reshard.cancel", 404, ""),
        ("reshard.cancel", 403, ""),
    ]


@pytest.mark.safeguard("reshard-107")
def test_a_cancel_past_the_point_of_no_return_answers_409_and_records_nothing(
    clients, target_store
):
    """The answer says when a cancel can no longer be honoured (each kind's cutoff), instead of
    a 202 ``cancel_requested: true`` the runner would only log as late."""
    import datetime as dt

    reshard = new_op(
        _warehouse("p1"), to_store=target_store, state="running", runner_id="r", step="cutover",
        target_login_ready_at=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    response = clients.internal.post(f"/api/v1/reshards/{reshard.id}/cancel")
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "past_point_of_no_return"
    assert body["cancel_requested"] is False
    assert "past its point of no return (the target login was ready)" in body["error"]
    assert "will complete" in body["error"]
    reshard.refresh_from_db()
    assert reshard.cancel_requested is False
    assert ReshardLogEntry.objects.get(operation_id=reshard.id).message.startswith(
        "cancel by internal-secret refused: "
    )

    restore = new_op(
        _warehouse("p2"), to_store=target_store, state="running", runner_id="r",
        kind="restore", restore_backup_key="_reshard_catalog_backups/op-1-20260101T000000Z.dump",
        step="copying", target_login_ready_at=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    response = clients.internal.post(f"/api/v1/reshards/{restore.id}/cancel")
    assert response.status_code == 202, "a restore onto another store: until cleaning_up"
    ReshardOperation.objects.filter(pk=restore.id).update(
        step="cleaning_up", cancel_requested=False
    )
    response = clients.internal.post(f"/api/v1/reshards/{restore.id}/cancel")
    assert response.status_code == 409
    assert "past its point of no return (cleaning_up)" in error(response)
    assert "until cleaning_up, when the replaced catalog is dropped" in error(response)
