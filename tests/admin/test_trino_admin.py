"""Trino placement from the Django admin's warehouses list: the API's services, validation,
messages, roles and audit (issue: Trino part 1, item 8)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from duckgres_admin.models import AuditRecord, Operator, WarehouseTrino
from tests.fixtures.api import trino  # noqa: F401 - the Trino configuration fixture
from tests.fixtures.rows import new_warehouse

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/duckgres_admin/warehouse/"


def staff(client, email: str, *, role: str | None) -> None:
    user = get_user_model().objects.create_user(email, email, None, is_staff=True)
    if role:
        Operator.objects.create(email=email, role=role)
    client.force_login(user)


def act(client, action: str, *warehouses):
    return client.post(
        CHANGELIST,
        {"action": action, "_selected_action": [str(w.pk) for w in warehouses]},
        follow=True,
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_an_admin_selects_a_cell_then_enables(client, trino):  # noqa: F811
    staff(client, "ops@example.com", role="admin")
    wh = new_warehouse(state="ready")
    response = act(client, "trino_select_pool-b", wh)
    assert response.status_code == 200
    row = WarehouseTrino.objects.get(warehouse=wh)
    assert (row.trino_cell_id, row.enabled) == ("registered:pool-b", False)
    act(client, "trino_enable", wh)
    row.refresh_from_db()
    assert (row.trino_cell_id, row.enabled) == ("registered:pool-b", True), "owner preserved"
    actions = list(
        AuditRecord.objects.filter(org_id=wh.org_id).order_by("id").values_list("action", "status")
    )
    assert actions == [("trino.cell_select", 200), ("trino.enable", 200)]
    assert all(a.source == "django" for a in AuditRecord.objects.filter(org_id=wh.org_id))


def test_enabling_a_warehouse_that_is_not_ready_is_refused_with_the_api_message(client, trino):  # noqa: F811
    staff(client, "ops@example.com", role="admin")
    wh = new_warehouse(state="resharding")
    response = act(client, "trino_enable", wh)
    assert any(
        "Trino can only be enabled on a ready warehouse (currently resharding)" in m
        for m in messages_of(response)
    )
    assert not WarehouseTrino.objects.filter(warehouse=wh, enabled=True).exists()
    record = AuditRecord.objects.get(org_id=wh.org_id)
    assert (record.action, record.status) == ("trino.enable", 409)


def test_a_move_is_a_compare_and_swap_from_the_current_owner(client, trino):  # noqa: F811
    staff(client, "ops@example.com", role="admin")
    wh = new_warehouse(state="ready")
    act(client, "trino_select_pool-a", wh)
    act(client, "trino_enable", wh)
    act(client, "trino_move_pool-b", wh)
    row = WarehouseTrino.objects.get(warehouse=wh)
    assert (row.trino_cell_id, row.enabled, row.state) == ("registered:pool-b", True, "pending")
    act(client, "trino_disable", wh)
    row.refresh_from_db()
    assert (row.trino_cell_id, row.enabled) == ("registered:pool-b", False), "disable keeps owner"


def test_viewers_get_no_trino_actions_and_cannot_post_them(client, trino):  # noqa: F811
    staff(client, "viewer@example.com", role=None)
    wh = new_warehouse(state="ready")
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    assert b"trino_enable" not in page.content
    act(client, "trino_enable", wh)
    assert not WarehouseTrino.objects.filter(warehouse=wh).exists()


def test_no_trino_actions_when_trino_is_not_wired(client, trino):  # noqa: F811
    trino.unwire()
    staff(client, "ops@example.com", role="admin")
    new_warehouse(state="ready")
    assert b"trino_enable" not in client.get(CHANGELIST).content
