"""Store drains in the Django admin (docs/admin.md "Store drains"): the list with each drain's
progress, the drain's page with its items and links to the child operations, pause / resume /
cancel by an admin (audited like the API's), refused for a viewer, and the store list's
"drained by" column."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from duckgres_admin.admin.stores import progress_label
from duckgres_admin.models import (
    PROGRESS_KEYS,
    AuditRecord,
    MetadataStore,
    StoreDrain,
    StoreDrainItem,
    Warehouse,
)
from reshard.control import drains
from tests.fixtures.admin import staff_user
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique

pytestmark = pytest.mark.django_db

DRAINS = "/admin/duckgres_admin/storedrain/"
STORES = "/admin/duckgres_admin/metadatastore/"


def _drain(n_warehouses: int = 0) -> tuple[StoreDrain, MetadataStore, MetadataStore]:
    source, target = new_store(), new_store()
    for _ in range(n_warehouses):
        new_warehouse(
            store=source,
            metadata_store_database=unique("cat"),
            metadata_store_user="tenant",
            metadata_store_password_ref="env:SOME_TENANT_PASSWORD",
        )
    drain = drains.create_drain(
        source.name,
        target_stores=[target.name],
        max_concurrent=2,
        drain_timeout_seconds=1800,
        actor="planner@example.com",
    )
    return drain, source, target


def _launch(item: StoreDrainItem, target: MetadataStore, op_state: str) -> int:
    """The item launched as the janitor would: its operation row, then the item marked."""
    warehouse = Warehouse.objects.get(org_id=item.org_id)
    op = new_op(warehouse, to_store=target, state=op_state, drain_item=item)
    StoreDrainItem.objects.filter(pk=item.pk).update(state="launched", target_store=target.name)
    return op.id


@pytest.fixture
def drain_in_progress() -> dict[str, Any]:
    """A drain of five: one moved, one moving, one failed, one skipped, one waiting."""
    drain, source, target = _drain(5)
    items = list(drain.items.order_by("id"))
    ops = {
        items[0].org_id: _launch(items[0], target, "succeeded"),
        items[1].org_id: _launch(items[1], target, "running"),
        items[2].org_id: _launch(items[2], target, "failed"),
    }
    StoreDrainItem.objects.filter(pk=items[3].pk).update(
        state="skipped", reason="org has Trino enabled"
    )
    return {"drain": drain, "source": source, "target": target, "items": items, "ops": ops}


def test_the_drain_list_shows_progress_and_filters_by_state_and_store(
    viewer_client, drain_in_progress
):
    drain, source = drain_in_progress["drain"], drain_in_progress["source"]
    response = viewer_client.get(DRAINS, {"q": source.name})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    body = response.content.decode()
    assert "done 1 / running 1 / failed 1 / skipped 1 / waiting 1" in body
    assert drain_in_progress["target"].name in body
    assert "planner@example.com" in body
    assert f"{DRAINS}{drain.id}/change/" in body
    assert (
        viewer_client.get(DRAINS, {"state": "running", "q": source.name}).context["cl"].result_count
        == 1
    )
    assert (
        viewer_client.get(DRAINS, {"state": "paused", "q": source.name}).context["cl"].result_count
        == 0
    )
    # Read-only like every screen: no add, change or delete through a model form.
    assert viewer_client.get(f"{DRAINS}add/").status_code == 403
    assert viewer_client.post(f"{DRAINS}{drain.id}/delete/").status_code == 403


def test_the_drain_list_reads_progress_in_a_fixed_number_of_queries(viewer_client):
    _drain(2)
    with CaptureQueriesContext(connection) as one:
        assert viewer_client.get(DRAINS).status_code == 200
    for _ in range(3):
        _drain(2)
    with CaptureQueriesContext(connection) as four:
        assert viewer_client.get(DRAINS).status_code == 200
    assert len(four) == len(one)


def test_progress_labels_are_the_service_counts():
    counts = dict.fromkeys(PROGRESS_KEYS, 0) | {"succeeded": 4, "waiting": 2}
    assert progress_label(counts) == "done 4 / running 0 / failed 0 / skipped 0 / waiting 2"
    counts["cancelled"] = 3
    assert progress_label(counts).endswith(" / waiting 2 / cancelled 3")


def test_the_drain_page_lists_the_items_with_links_to_their_operations(
    viewer_client, drain_in_progress
):
    drain, items, ops = (drain_in_progress[k] for k in ("drain", "items", "ops"))
    response = viewer_client.get(f"{DRAINS}{drain.id}/change/")
    assert response.status_code == 200
    shown = {
        row["org_id"]: (row["state"], row["reason"], row["target_store"], row["operation_id"])
        for row in response.context["items"]
    }
    target = drain_in_progress["target"].name
    assert shown == {
        items[0].org_id: ("succeeded", "", target, ops[items[0].org_id]),
        items[1].org_id: ("running", "", target, ops[items[1].org_id]),
        items[2].org_id: ("failed", "", target, ops[items[2].org_id]),
        items[3].org_id: ("skipped", "org has Trino enabled", None, None),
        items[4].org_id: ("waiting", "", None, None),
    }
    body = response.content.decode()
    for op_id in ops.values():
        assert f'href="/admin/duckgres_admin/reshardoperation/{op_id}/change/"' in body
    assert "org has Trino enabled" in body
    assert "done 1 / running 1 / failed 1 / skipped 1 / waiting 1" in body
    assert 'id="drain-pause"' not in body  # a viewer sees no buttons
    assert "viewer: read only" in body
    assert viewer_client.get(f"{DRAINS}999999/change/").status_code == 404


def _audits(drain: StoreDrain) -> list[tuple[str, str, str, int, str, str]]:
    return list(
        AuditRecord.objects.filter(path__startswith=f"{DRAINS}{drain.id}/")
        .order_by("id")
        .values_list("action", "source", "role", "status", "org_id", "detail")
    )


def test_an_admin_pauses_resumes_and_cancels_and_each_is_audited(admin_client):
    drain, source, _ = _drain(1)
    page = admin_client.get(f"{DRAINS}{drain.id}/change/").content.decode()
    assert 'id="drain-pause"' in page
    assert 'id="drain-cancel"' in page
    assert 'id="drain-resume"' not in page  # only the transitions the state allows
    assert "csrfmiddlewaretoken" in page
    for action, state in (("pause", "paused"), ("resume", "running"), ("cancel", "cancelling")):
        response = admin_client.post(f"{DRAINS}{drain.id}/{action}/", follow=True)
        assert response.redirect_chain == [(f"{DRAINS}{drain.id}/change/", 302)]
        drain.refresh_from_db()
        assert drain.state == state
        assert [str(m) for m in response.context["messages"]] == [
            f"drain {drain.id} of store {source.name}: {action} accepted, now {state}"
        ]
    what = f"drain {drain.id} of store {source.name}"
    assert _audits(drain) == [
        (f"metadata_store.drain_{action}", "django", "admin", 200, "", f"{what}: {action}")
        for action in ("pause", "resume", "cancel")
    ]
    page = admin_client.get(f"{DRAINS}{drain.id}/change/").content.decode()
    assert "no action: the drain is cancelling" in page


def test_a_refused_transition_shows_the_service_message(admin_client):
    drain, _, _ = _drain()
    response = admin_client.post(f"{DRAINS}{drain.id}/resume/", follow=True)
    message = f"drain {drain.id} is running: only a paused drain can resume"
    assert [str(m) for m in response.context["messages"]] == [f"resume refused: {message}"]
    assert 'class="error"' in response.content.decode()
    drain.refresh_from_db()
    assert drain.state == "running"
    assert _audits(drain) == [("metadata_store.drain_resume", "django", "admin", 409, "", message)]


def test_the_actions_are_post_only_and_refused_to_a_viewer(client, admin_client):
    drain, _, _ = _drain()
    assert admin_client.get(f"{DRAINS}{drain.id}/pause/").status_code == 405
    assert admin_client.post(f"{DRAINS}999999/pause/").status_code == 404
    client.force_login(staff_user("viewer"))
    for action in ("pause", "resume", "cancel"):
        assert client.post(f"{DRAINS}{drain.id}/{action}/").status_code == 403
        assert client.get(f"{DRAINS}{drain.id}/{action}/").status_code == 403
    drain.refresh_from_db()
    assert drain.state == "running"
    assert _audits(drain) == []


def test_the_store_list_names_the_active_drain(viewer_client):
    drain, source, target = _drain(1)
    body = viewer_client.get(STORES, {"q": source.name}).content.decode()
    assert f"drained by drain {drain.id} (running)" in body
    assert f'href="{DRAINS}{drain.id}/change/"' in body
    assert "drained by" not in viewer_client.get(STORES, {"q": target.name}).content.decode()
    StoreDrain.objects.filter(pk=drain.pk).update(state="finished")
    assert "drained by" not in viewer_client.get(STORES, {"q": source.name}).content.decode()


def test_an_action_without_the_csrf_token_is_refused():
    drain, _, _ = _drain()
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_user("admin"))
    assert client.post(f"{DRAINS}{drain.id}/pause/").status_code == 403
    drain.refresh_from_db()
    assert drain.state == "running"
    page = client.get(f"{DRAINS}{drain.id}/change/")
    token = page.context["csrf_token"]
    response = client.post(f"{DRAINS}{drain.id}/pause/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    drain.refresh_from_db()
    assert drain.state == "paused"
