"""Store drains through the API (issue 13 item 3; docs/drains.md): the plan and its items, the
refusals that name the field and the fix, pause/resume/cancel by compare-and-set, and a store
being drained accepting no new warehouses (safeguard reshard-97)."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.models import AuditRecord, ReshardOperation, StoreDrain
from tests.fixtures.api import error
from tests.fixtures.rows import new_store, new_warehouse, unique

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
