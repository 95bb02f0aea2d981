"""Operator screens in the Django admin (issue 6 item 1): roles, read-only rows, the detail
page's status JSON (progress from ``progress`` only, ETA from the copy rate), cancel and the
recovery dry run with confirmation, and no secret value on any page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from duckgres_admin.adminui.progress import progress_view
from duckgres_admin.models import (
    AuditRecord,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
)
from tests.fixtures.admin import staff_user
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.secrets_scan import scan, unique_password

pytestmark = pytest.mark.django_db

OPS = "/admin/duckgres_admin/reshardoperation/"


@pytest.fixture
def op():
    store = new_store()
    target = new_store()
    warehouse = new_warehouse(
        store=store,
        metadata_store_database="cat",
        metadata_store_user="tenant",
        metadata_store_password_ref="env:SOME_TENANT_PASSWORD",
    )
    return new_op(warehouse, to_store=target)


PAGES = [
    OPS,
    "/admin/duckgres_admin/warehouse/",
    "/admin/duckgres_admin/metadatastore/",
    "/admin/duckgres_admin/storedrain/",
    "/admin/duckgres_admin/connectionlease/",
    "/admin/duckgres_admin/lease/",
    "/admin/duckgres_admin/trinopool/",
    "/admin/duckgres_admin/trinopoolinstance/",
    "/admin/duckgres_admin/warehousetrino/",
    "/admin/duckgres_admin/reshardlogentry/",
    "/admin/duckgres_admin/reshardsteptiming/",
    "/admin/duckgres_admin/auditrecord/",
    "/admin/duckgres_admin/operator/",
]


def test_a_viewer_reads_every_screen_without_model_permissions(viewer_client, op):
    for page in [*PAGES, f"{OPS}{op.id}/change/", f"{OPS}{op.id}/status.json"]:
        response = viewer_client.get(page)
        assert response.status_code == 200, page
    index = viewer_client.get("/admin/").content.decode()
    assert "Reshard operations" in index
    assert "Leases" in index


def test_the_op_list_filters_and_searches(viewer_client, op):
    response = viewer_client.get(OPS, {"state": "pending", "q": op.org_id})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    response = viewer_client.get(OPS, {"state": "succeeded", "q": op.org_id})
    assert response.context["cl"].result_count == 0
    assert viewer_client.get(OPS, {"target_kind": "cnpg"}).status_code == 200


def test_a_viewer_cannot_act_even_by_posting_directly(viewer_client, op):
    for url in (f"{OPS}{op.id}/cancel/", f"{OPS}{op.id}/recover/", f"{OPS}start/"):
        assert viewer_client.get(url).status_code == 403, url
        assert viewer_client.post(url, {"stage": "start"}).status_code == 403, url
    op.refresh_from_db()
    assert op.state == "pending"
    assert not op.cancel_requested
    page = viewer_client.get(f"{OPS}{op.id}/change/").content.decode()
    assert 'id="op-cancel"' not in page
    assert "Start a reshard" not in viewer_client.get(OPS).content.decode()


def test_a_disabled_operator_reads_nothing(client, op):
    client.force_login(staff_user("admin", disabled=True))
    assert client.get(f"{OPS}{op.id}/status.json").status_code == 403
    assert client.post(f"{OPS}{op.id}/cancel/").status_code == 403


def test_op_rows_are_never_editable_through_the_admin(admin_client, op):
    assert admin_client.get(f"{OPS}add/").status_code == 403
    assert admin_client.post(f"{OPS}{op.id}/delete/").status_code == 403
    assert admin_client.get("/admin/duckgres_admin/warehouse/add/").status_code == 403


def test_an_admin_cancels_with_confirmation_and_it_is_audited(admin_client, op):
    confirm = admin_client.get(f"{OPS}{op.id}/cancel/")
    assert confirm.status_code == 200
    assert b"Yes, cancel it" in confirm.content
    op.refresh_from_db()
    assert op.state == "pending"  # the confirmation page changes nothing
    response = admin_client.post(f"{OPS}{op.id}/cancel/")
    assert response.status_code == 302
    op.refresh_from_db()
    assert op.state == "cancelled"
    assert op.error == "cancelled before start"
    audit = AuditRecord.objects.get(action="reshard.cancel", org_id=op.org_id)
    assert (audit.source, audit.role, audit.status) == ("django", "admin", 200)
    # A second cancel is refused (409 from the service) and shown, not a 500.
    again = admin_client.post(f"{OPS}{op.id}/cancel/", follow=True)
    assert b"operation already cancelled" in again.content


def test_a_superuser_without_an_operator_row_may_act(client, op):
    client.force_login(staff_user(superuser=True))
    ReshardOperation.objects.filter(pk=op.pk).update(state="running")
    assert client.post(f"{OPS}{op.id}/cancel/").status_code == 302
    op.refresh_from_db()
    assert op.cancel_requested


def test_the_recovery_dry_run_prints_the_refusal_for_an_active_op(admin_client, op):
    assert b"Show the recovery plan" in admin_client.get(f"{OPS}{op.id}/recover/").content
    response = admin_client.post(f"{OPS}{op.id}/recover/")
    assert response.status_code == 200
    assert b"still active" in response.content


def test_the_recovery_dry_run_prints_the_plan(admin_client, op):
    ReshardOperation.objects.filter(pk=op.pk).update(
        state="failed", recovery_required=True, step="copying", error="force-failed"
    )
    response = admin_client.post(f"{OPS}{op.id}/recover/")
    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="recover-output"' in body
    assert "plan (rollback; commit point not passed)" in body
    assert "dry run: nothing changed" in body
    op.refresh_from_db()
    assert op.state == "failed"
    assert op.recovery_owner == ""


@pytest.mark.safeguard("reshard-81")
def test_the_start_form_plans_first_and_shows_refusals(admin_client, op):
    page = admin_client.get(f"{OPS}start/", {"org": "x"})
    assert page.status_code == 200
    response = admin_client.post(
        f"{OPS}start/",
        {
            "stage": "plan",
            "org_id": "no-such-org",
            "target_type": "cnpg",
            "cnpg_shard": "shard-002",
            "drain_timeout_seconds": "1800",
            "cutover_timeout_seconds": "0",
        },
    )
    assert response.status_code == 200
    assert b"org has no managed warehouse" in response.content
    assert not ReshardOperation.objects.filter(org_id="no-such-org").exists()
    # The admin's dry run is audited like the API's, refused ones too (safeguard reshard-81).
    assert list(
        AuditRecord.objects.filter(action="reshard.dry_run").values_list(
            "org_id", "status", "detail", "source"
        )
    ) == [("no-such-org", 404, "org has no managed warehouse", "django")]


def test_the_status_json_carries_steps_window_and_progress(viewer_client, op):
    base = timezone.now() - timedelta(seconds=100)
    ReshardOperation.objects.filter(pk=op.pk).update(
        state="running",
        step="copying",
        blocked_at=base + timedelta(seconds=5),
        progress={"tables_done": 10, "tables_total": 40, "rows_copied": 1234,
                  "bytes_copied": 99, "updated_at": (base + timedelta(seconds=60)).isoformat()},
        rows_copied=0,
    )  # fmt: skip
    for i, step in enumerate(("blocking", "draining", "copying")):
        ReshardStepTiming.objects.create(
            operation_id=op.id,
            step=step,
            runner_epoch=1,
            started_at=base + timedelta(seconds=20 * i),
            ended_at=base + timedelta(seconds=20 * (i + 1)) if step != "copying" else None,
            outcome="ok" if step != "copying" else "",
        )
    data = viewer_client.get(f"{OPS}{op.id}/status.json").json()
    assert [s["step"] for s in data["steps"]] == ["blocking", "draining", "copying"]
    assert data["steps"][-1]["outcome"] == ""
    assert data["blocked_at"] is not None
    assert data["unblocked_at"] is None
    assert data["progress"]["rows_copied"] == 1234  # from progress, not the success column
    assert data["progress"]["tables_done"] == 10
    assert data["progress"]["eta_seconds"] is not None


def _op_stub(progress: dict[str, object], state: str = "running") -> ReshardOperation:
    return ReshardOperation(id=1, state=state, progress=progress)


def _steps(copy_start: datetime) -> list[ReshardStepTiming]:
    return [ReshardStepTiming(step="copying", runner_epoch=1, started_at=copy_start)]


def test_eta_is_extrapolated_from_the_copy_rate():
    start = datetime(2030, 1, 1, tzinfo=UTC)
    updated = start + timedelta(seconds=100)
    op = _op_stub({"tables_done": 25, "tables_total": 100, "updated_at": updated.isoformat()})
    view = progress_view(op, _steps(start), now=updated)
    assert view["eta_seconds"] == 300  # 75 tables at 0.25 tables/s
    later = progress_view(op, _steps(start), now=updated + timedelta(seconds=50))
    assert later["eta_seconds"] == 250


def test_no_eta_without_a_rate_or_when_terminal():
    start = datetime(2030, 1, 1, tzinfo=UTC)
    updated = (start + timedelta(seconds=10)).isoformat()
    assert progress_view(_op_stub({}), _steps(start))["eta_seconds"] is None
    none_done = _op_stub({"tables_done": 0, "tables_total": 5, "updated_at": updated})
    assert progress_view(none_done, _steps(start))["eta_seconds"] is None
    failed = _op_stub({"tables_done": 1, "tables_total": 5, "updated_at": updated}, "failed")
    assert progress_view(failed, _steps(start))["eta_seconds"] is None
    assert progress_view(_op_stub({"tables_done": 1, "tables_total": 5}), [])["eta_seconds"] is None


def test_the_admin_never_renders_a_password_or_secret_value(
    admin_client, op, monkeypatch, settings
):
    password = unique_password()
    monkeypatch.setenv("SOME_TENANT_PASSWORD", password)
    ReshardLogEntry.objects.create(operation_id=op.id, message="copy started", source="runner")
    pages = {
        page: admin_client.get(page).content
        for page in [
            *PAGES,
            f"{OPS}{op.id}/change/",
            f"{OPS}{op.id}/status.json",
            f"{OPS}start/",
            f"/admin/duckgres_admin/warehouse/{op.org_id}/change/",
        ]
    }
    for secret in (
        password,
        settings.DUCKGRES_INTERNAL_SECRET,
        settings.DUCKGRES_RUNNER_SECRET,
        settings.DUCKGRES_DATAPLANE_SECRET,
    ):
        assert scan(secret, pages) == []
    assert b"env:SOME_TENANT_PASSWORD" in pages[f"{OPS}{op.id}/change/"]  # the reference only


def test_leader_leases_show_holder_epoch_and_a_readable_infinite_expiry(viewer_client):
    body = viewer_client.get("/admin/duckgres_admin/lease/").content.decode()
    assert "janitor" in body
    assert "trino" in body
    assert "-infinity" in body  # the seeded expires_at, loaded as datetime.min
