"""Store drains through the API (issue 13 item 3; docs/drains.md): the plan and its items, the
refusals that name the field and the fix, pause/resume/cancel by compare-and-set, a store
being drained accepting no new warehouses (safeguard reshard-97), a cancel that asks the
active children in its own transaction and says which were past their point of no return
(issue 29; safeguard reshard-111), and the drain's times in RFC 3339 ``Z``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from duckgres_admin.models import (
    AuditRecord,
    ReshardLogEntry,
    ReshardOperation,
    StoreDrain,
    StoreDrainItem,
    Warehouse,
)
from reshard.control import drains
from tests.fixtures.api import error
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique

pytestmark = pytest.mark.django_db

BAD = "invalid body: "


def _drain(clients: Any, store: str, who: str = "internal", **body: Any) -> Any:
    client = getattr(clients, who)
    return client.post(f"/api/v1/metadata-stores/{store}/drain", body, format="json")


def _bound(store: Any, n: int) -> list[str]:
    orgs = []
    for _ in range(n):
        name = unique("cat")
        wh = new_warehouse(
            store=store,
            metadata_store_database=name,
            metadata_store_user=name,
            metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name.replace('-', '_')}",
        )
        orgs.append(wh.org_id)
    return sorted(orgs)


def _create_on(clients: Any, store: str) -> Any:
    name = unique("new")
    return clients.internal.post(
        "/api/v1/warehouses",
        {
            "org_id": name,
            "database_name": "n",
            "state": "ready",
            "metadata_store_kind": "cnpg",
            "metadata_store_name": store,
            "metadata_store_database": name.replace("-", "_"),
            "metadata_store_user": name.replace("-", "_"),
            "metadata_store_password_ref": "env:TENANT_PW",
        },
        format="json",
    )


def test_a_drain_plans_one_item_per_bound_warehouse_and_launches_nothing(clients):
    source, target = new_store(), new_store()
    orgs = _bound(source, 3)
    _bound(new_store(), 1)  # another store's warehouse is not part of it
    resp = _drain(clients, source.name, "admin", target_stores=[target.name], max_concurrent=2)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["store"], body["target_stores"], body["max_concurrent"]) == (
        source.name,
        [target.name],
        2,
    )
    assert body["state"] == "running"
    assert [i["org_id"] for i in body["items"]] == orgs
    assert {i["state"] for i in body["items"]} == {"waiting"}
    assert body["progress"] == {
        "waiting": 3,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "skipped": 0,
    }
    assert ReshardOperation.objects.filter(org_id__in=orgs).count() == 0, "the janitor launches"
    audit = AuditRecord.objects.filter(action="metadata_store.drain").latest("id")
    assert f"drain {body['id']} of store {source.name}" in audit.detail
    listed = clients.viewer.get(f"/api/v1/metadata-stores/{source.name}/drains").json()
    assert [d["id"] for d in listed["drains"]] == [body["id"]]
    assert clients.viewer.get(f"/api/v1/drains/{body['id']}").json()["items"] == body["items"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({}, 400, "invalid body: target_stores: must be a non-empty list of cnpg store names"),
        ({"target_stores": "x"}, 400, "invalid body: target_stores: must be a non-empty list"),
        ({"target_stores": [1]}, 400, "invalid body: target_stores: every entry must be a store"),
        ({"target_stores": ["nope"]}, 400, f"{BAD}target_stores: no metadata store named nope"),
        ({"target_stores": ["SELF"]}, 400, f"{BAD}target_stores: SELF is the store being drained"),
        ({"target_stores": ["T", "T"]}, 400, f"{BAD}target_stores: at most 16 distinct store"),
        ({"target_stores": ["T"], "max_concurrent": 0}, 400, f"{BAD}max_concurrent: must be >= 1"),
        (
            {"target_stores": ["T"], "max_concurrent": 17},
            400,
            f"{BAD}max_concurrent: must be <= 16",
        ),
        ({"target_stores": ["T"], "speed": 1}, 400, "invalid body: speed: unknown field"),
    ],
    ids=["none", "not-a-list", "not-names", "unknown", "itself", "twice", "zero", "17", "extra"],
)
def test_bad_drain_requests_name_the_field_and_the_fix(clients, body, status, message):
    source, target = new_store(), new_store()
    names = {"SELF": source.name, "T": target.name}
    if isinstance(body.get("target_stores"), list):
        body = {**body, "target_stores": [names.get(t, t) for t in body["target_stores"]]}
    message = message.replace("SELF", source.name)
    resp = _drain(clients, source.name, **body)
    assert resp.status_code == status, resp.content
    assert error(resp).startswith(message), error(resp)
    assert StoreDrain.objects.count() == 0


def test_who_may_drain_and_what_cannot_be_drained(clients):
    source, target = new_store(), new_store()
    external = new_store(kind="external", host="db.example")
    assert _drain(clients, source.name, "viewer", target_stores=[target.name]).status_code == 403
    assert _drain(clients, source.name, "anon", target_stores=[target.name]).status_code == 401
    missing = _drain(clients, "no-such-store", target_stores=[target.name])
    assert (missing.status_code, error(missing)) == (404, "no metadata store named no-such-store")
    ext = _drain(clients, external.name, target_stores=[target.name])
    assert ext.status_code == 400
    assert "only cnpg stores can be drained" in error(ext)
    assert _drain(clients, source.name, target_stores=[target.name]).status_code == 201
    again = _drain(clients, source.name, target_stores=[target.name])
    assert again.status_code == 409
    assert error(again).startswith(f"metadata store {source.name} is being drained (drain ")
    into = _drain(clients, target.name, target_stores=[source.name])
    assert into.status_code == 409, "a store being drained is no target"


def test_pause_resume_cancel_are_compare_and_set(clients):
    source, target = new_store(), new_store()
    _bound(source, 1)
    drain_id = _drain(clients, source.name, target_stores=[target.name]).json()["id"]

    def act(action: str, who: str = "admin") -> Any:
        return getattr(clients, who).post(f"/api/v1/drains/{drain_id}/{action}")

    assert act("pause", "viewer").status_code == 403
    assert act("resume").status_code == 409
    assert act("pause").json()["state"] == "paused"
    paused_again = act("pause")
    assert (paused_again.status_code, error(paused_again)) == (
        409,
        f"drain {drain_id} is paused: only a running drain can pause",
    )
    assert act("resume").json()["state"] == "running"
    assert act("cancel").json()["state"] == "cancelling"
    assert act("resume").status_code == 409
    assert act("cancel").status_code == 409
    assert clients.admin.post("/api/v1/drains/999999/pause").status_code == 404
    actions = set(AuditRecord.objects.values_list("action", flat=True))
    assert {"metadata_store.drain_pause", "metadata_store.drain_cancel"} <= actions


@pytest.mark.safeguard("reshard-97")
def test_a_store_being_drained_accepts_no_new_warehouse(clients, monkeypatch):
    source, target = new_store(), new_store()
    [org] = _bound(source, 1)
    monkeypatch.setenv("DUCKGRES_TEST_PW_o", "resolvable")
    other = new_warehouse(store=new_store(), metadata_store_database="o", metadata_store_user="o",
                          metadata_store_password_ref="env:DUCKGRES_TEST_PW_o")  # fmt: skip
    drain_id = _drain(clients, source.name, target_stores=[target.name]).json()["id"]
    refusal = (
        f"metadata store {source.name} is being drained (drain {drain_id}): it accepts no new "
        "warehouses; choose another store"
    )
    created = _create_on(clients, source.name)
    assert (created.status_code, error(created)) == (
        409,
        f"invalid body: metadata_store_name: {refusal}",
    )
    moved = clients.internal.patch(
        f"/api/v1/warehouses/{other.org_id}",
        {"metadata_store_name": source.name},
        format="json",
    )
    assert (moved.status_code, error(moved)) == (
        409,
        f"invalid body: metadata_store_name: {refusal}",
    )
    started = clients.internal.post(
        f"/api/v1/warehouses/{other.org_id}/reshards",
        {"target": {"type": "cnpg", "cnpg_shard": source.name}},
        format="json",
    )
    assert (started.status_code, error(started)) == (409, f"target: {refusal}")
    # A warehouse already on the store may still be written (not a new warehouse on it).
    kept = clients.internal.patch(
        f"/api/v1/warehouses/{org}", {"max_connection_leases": 5}, format="json"
    )
    assert kept.status_code == 200, kept.content
    clients.internal.post(f"/api/v1/drains/{drain_id}/cancel")
    StoreDrain.objects.filter(pk=drain_id).update(state="cancelled")
    assert _create_on(clients, source.name).status_code == 201, "an ended drain guards nothing"


def _launched(drain_id: int, org_id: str, target: Any, **op: Any) -> ReshardOperation:
    """The item's child as the janitor would have launched it (no runner: the row only)."""
    item = StoreDrainItem.objects.get(drain_id=drain_id, org_id=org_id)
    child = new_op(Warehouse.objects.get(org_id=org_id), to_store=target, drain_item=item, **op)
    StoreDrainItem.objects.filter(pk=item.pk).update(state="launched", target_store=target.name)
    return child


@pytest.mark.safeguard("reshard-111")
def test_a_cancel_asks_the_active_children_in_its_own_transaction(clients):
    source, target = new_store(), new_store()
    blocking, late, pending, waiting = _bound(source, 4)
    drain_id = _drain(clients, source.name, target_stores=[target.name]).json()["id"]
    moving = _launched(drain_id, blocking, target, state="running", step="blocking")
    cleaning = _launched(drain_id, late, target, state="running", step="cleaning_up")
    queued = _launched(drain_id, pending, target, state="pending")

    resp = clients.admin.post(f"/api/v1/drains/{drain_id}/cancel")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    # No janitor tick ran: the cancel's own transaction asked and marked everything.
    assert ReshardOperation.objects.get(pk=moving.pk).cancel_requested is True
    assert ReshardOperation.objects.get(pk=queued.pk).state == "cancelled", "never started"
    # Past its cutoff: refused, as the reshard's own cancel refuses it, and said in its op log.
    assert ReshardOperation.objects.get(pk=cleaning.pk).cancel_requested is False
    assert body["state"] == "cancelling"
    assert body["cancel"] == {
        "waiting_cancelled": 1,
        "asked": [
            {"operation_id": moving.id, "org_id": blocking, "step": "blocking", "state": "running"},
            {"operation_id": queued.id, "org_id": pending, "step": None, "state": "cancelled"},
        ],
        "past_point_of_no_return": [
            {"operation_id": cleaning.id, "org_id": late, "step": "cleaning_up", "state": "running"}
        ],
    }
    shown = {i["org_id"]: (i["state"], i["reason"]) for i in body["items"]}
    assert shown == {
        blocking: ("running", ""),
        late: ("running", ""),
        pending: ("cancelled", ""),
        waiting: ("cancelled", "the drain was cancelled"),
    }
    assert ReshardLogEntry.objects.filter(
        operation_id=moving.id, message=f"cancel requested by drain:{drain_id}"
    ).exists()
    audit = AuditRecord.objects.filter(action="metadata_store.drain_cancel").latest("id")
    assert audit.detail == (
        f"drain {drain_id} of store {source.name}: cancel; asked op(s) {moving.id}, {queued.id}; "
        f"past their point of no return: op(s) {cleaning.id}"
    )

    refused = f"cancel by drain:{drain_id} refused: operation {cleaning.id} is past its point"
    assert ReshardLogEntry.objects.filter(
        operation_id=cleaning.id, message__startswith=refused
    ).exists()

    # The janitor's safety net then has nothing left to ask, and asks nothing twice.
    for _ in range(2):
        report = drains.advance(lambda: None)
        assert not [a for a in report.actions if "cancel requested" in a], report.actions
    for op, line in ((moving, "cancel requested by"), (cleaning, refused)):
        assert ReshardLogEntry.objects.filter(operation_id=op.id, message__startswith=line)
        assert ReshardLogEntry.objects.filter(operation_id=op.id).count() == 1, op
    assert StoreDrain.objects.get(pk=drain_id).state == "cancelling", "two children still run"


def test_a_cancel_without_active_children_reports_none(clients):
    source, target = new_store(), new_store()
    _bound(source, 2)
    drain_id = _drain(clients, source.name, target_stores=[target.name]).json()["id"]
    clients.admin.post(f"/api/v1/drains/{drain_id}/pause")
    body = clients.admin.post(f"/api/v1/drains/{drain_id}/cancel").json()
    assert body["cancel"] == {"waiting_cancelled": 2, "asked": [], "past_point_of_no_return": []}
    assert {i["state"] for i in body["items"]} == {"cancelled"}
    refused = clients.admin.post(f"/api/v1/drains/{drain_id}/cancel")
    assert (refused.status_code, error(refused)) == (
        409,
        f"drain {drain_id} is cancelling: only a running or paused drain can cancel",
    )


def _z_time(value: Any) -> dt.datetime:
    """An RFC 3339 UTC time as every API time is written: ``...Z``, never ``+00:00``."""
    assert isinstance(value, str), value
    assert value.endswith("Z"), value
    assert "+00:00" not in value, value
    return dt.datetime.fromisoformat(value)


def test_drain_times_are_rfc3339_z_as_every_api_time(clients):
    source, target = new_store(), new_store()
    [org] = _bound(source, 1)
    created = _drain(clients, source.name, target_stores=[target.name]).json()
    drain_id = created["id"]
    child = _launched(drain_id, org, target, state="running", step="blocking")
    row = StoreDrain.objects.get(pk=drain_id)
    assert _z_time(created["created_at"]) == row.created_at
    assert created["finished_at"] is None
    listed = clients.viewer.get(f"/api/v1/metadata-stores/{source.name}/drains").json()
    assert _z_time(listed["drains"][0]["created_at"]) == row.created_at
    op_json = clients.viewer.get(f"/api/v1/reshards/{child.id}").json()
    assert _z_time(op_json["created_at"]), "the op JSON's own format, for comparison"
    cancelled = clients.admin.post(f"/api/v1/drains/{drain_id}/cancel").json()
    assert _z_time(cancelled["created_at"]) == row.created_at
    ReshardOperation.objects.filter(pk=child.pk).update(state="cancelled")
    drains.advance(lambda: None)
    ended = clients.viewer.get(f"/api/v1/drains/{drain_id}").json()
    assert ended["state"] == "cancelled"
    assert _z_time(ended["finished_at"]) == StoreDrain.objects.get(pk=drain_id).finished_at
