"""The admin's backups page (issue 13 item 2): a warehouse's own backups from a real S3 server
(moto's, over HTTP), newest first, with the retention plan; readable by every viewer, refused
to a disabled operator; an unreachable store is a clear message, not a 500."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from duckgres_admin.models import AuditRecord, BackupVerification, Operator
from reshard.backups import retention
from reshard.engines.backup import backup_key
from tests.fixtures.api import Published, published
from tests.fixtures.backups_listing import op_in_state, put_object, warehouse_with_bucket
from tests.fixtures.rows import new_store, unique
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.django_db
assert published  # autouse: every Celery message sent in these tests, on an in-memory broker


def _viewer(client: Any, *, disabled: bool = False, role: str = "") -> Any:
    name = unique("viewer")
    user = get_user_model().objects.create_user(
        name, f"{name}@example.com", "pw-for-tests", is_staff=True
    )
    if disabled or role:
        Operator.objects.create(
            email=f"{name}@example.com", role=role or "viewer", disabled=disabled
        )
    client.force_login(user)
    return client


def _page(org: str) -> str:
    return f"/admin/duckgres_admin/warehouse/{org}/backups/"


@pytest.mark.safeguard("reshard-93")
def test_a_viewer_sees_only_this_warehouses_backups_with_the_plan(
    client: Any, bucket: S3Bucket, settings: Any
) -> None:
    settings.DUCKGRES_BACKUP_RETENTION = retention.RetentionPolicy(keep_last=1, min_age_days=0)
    mine, other = warehouse_with_bucket(bucket.bucket), warehouse_with_bucket(bucket.bucket)
    old, new = op_in_state(mine, "succeeded"), op_in_state(mine, "failed")
    old_key = put_object(bucket, backup_key(old.id), size=1234)
    new_key = put_object(bucket, backup_key(new.id), size=5678)
    foreign_key = put_object(bucket, backup_key(op_in_state(other, "succeeded").id))

    resp = _viewer(client).get(_page(mine.org_id))
    assert resp.status_code == 200
    html = resp.content.decode()
    assert foreign_key not in html, "another warehouse's backup in the same bucket is not listed"
    assert html.index(new_key) < html.index(old_key), "newest first"
    assert "5678" in html
    assert "1234" in html
    assert "2 of this warehouse; 3 object(s) listed, 1 not this warehouse" in html
    assert f"/admin/duckgres_admin/reshardoperation/{old.id}/change/" in html
    assert "keep: among the newest 1" in html
    assert "delete: not among the newest 1" in html
    assert "1 marked delete" in html
    assert "retention is disabled" in html
    assert "not tested" in html

    listing = client.get("/admin/duckgres_admin/warehouse/")
    assert _page(mine.org_id) in listing.content.decode(), "the warehouse list links the page"


def test_a_disabled_operator_is_refused_and_an_unknown_org_is_explained(
    client: Any, bucket: S3Bucket
) -> None:
    mine = warehouse_with_bucket(bucket.bucket)
    refused = _viewer(client, disabled=True).get(_page(mine.org_id))
    assert refused.status_code == 403
    client.logout()
    missing = _viewer(client).get(_page("no-such-org"))
    assert missing.status_code == 200
    assert 'id="backups-error">org has no managed warehouse<' in missing.content.decode()


def test_an_unreachable_storage_is_a_message_not_an_error_page(
    client: Any, bucket: S3Bucket, settings: Any
) -> None:
    mine = warehouse_with_bucket(bucket.bucket)
    settings.DUCKGRES_S3_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    resp = _viewer(client).get(_page(mine.org_id))
    assert resp.status_code == 200
    assert f"cannot list the backups in s3://{bucket.bucket}/" in resp.content.decode()


def test_each_backup_shows_its_restore_tests_result(client: Any, bucket: S3Bucket) -> None:
    wh = warehouse_with_bucket(bucket.bucket)
    good, bad, fresh = (op_in_state(wh, "succeeded") for _ in range(3))
    keys = [put_object(bucket, backup_key(op.id)) for op in (good, bad, fresh)]
    for op, key, result, detail in (
        (good, keys[0], "passed", "DuckLake verification of the restore matches"),
        (bad, keys[1], "failed", "pg_restore exited with status 1: input file is too short"),
    ):
        BackupVerification.objects.create(
            org_id=wh.org_id, bucket=bucket.bucket, key=key, op_id=op.id, result=result,
            detail=detail, store="scratch",
        )  # fmt: skip
    html = _viewer(client).get(_page(wh.org_id)).content.decode()
    cells = re.findall(r'<td class="backup-verified"[^>]*>([^<]*)</td>', html)
    assert len(cells) == 3, cells
    by_key = dict(zip(re.findall(r"<td><code>([^<]+)</code></td>", html), cells, strict=True))
    assert by_key[keys[0]].startswith("yes (")
    assert by_key[keys[1]].startswith("failed (")
    assert by_key[keys[1]].endswith(": pg_restore exited with status 1: input file is too short")
    assert by_key[keys[2]] == "not tested"


def test_a_restore_operation_is_shown_as_one(client: Any, bucket: S3Bucket) -> None:
    wh = warehouse_with_bucket(bucket.bucket)
    made, restore = op_in_state(wh, "succeeded"), op_in_state(wh, "failed")
    key = backup_key(made.id)
    type(restore).objects.filter(pk=restore.id).update(kind="restore", restore_backup_key=key)
    viewer = _viewer(client)
    detail = viewer.get(f"/admin/duckgres_admin/reshardoperation/{restore.id}/change/")
    assert detail.status_code == 200
    assert f"restore of {key}" in detail.content.decode()
    listed = viewer.get("/admin/duckgres_admin/reshardoperation/?kind=restore").content.decode()
    assert f"/admin/duckgres_admin/reshardoperation/{restore.id}/change/" in listed
    assert f"/admin/duckgres_admin/reshardoperation/{made.id}/change/" not in listed


@pytest.mark.safeguard("reshard-113")
def test_an_admin_queues_a_restore_test_from_the_backups_page(
    client: Any, bucket: S3Bucket, published: Published, settings: Any
) -> None:
    scratch = new_store(port=5434)  # a server no warehouse of this test is on
    wh = warehouse_with_bucket(bucket.bucket)
    old, new = op_in_state(wh, "succeeded"), op_in_state(wh, "succeeded")
    old_key = put_object(bucket, backup_key(old.id))
    new_key = put_object(bucket, backup_key(new.id))
    action = f"/admin/duckgres_admin/warehouse/{wh.org_id}/backups/restore-test/"

    viewer = _viewer(client)
    assert action not in viewer.get(_page(wh.org_id)).content.decode(), "no button for a viewer"
    assert viewer.post(action, {"key": old_key}).status_code == 403
    client.logout()

    admin = _viewer(client, role="admin")
    html = admin.get(_page(wh.org_id)).content.decode()
    assert html.count(f'action="{action}"') == 3, "one per backup and one for the newest"

    settings.DUCKGRES_RESTORE_TEST_STORE = ""
    off = admin.post(action, {"key": ""}, follow=True)
    assert "Restore test not queued (409): no restore-test store is configured" in (
        off.content.decode()
    )
    assert published.messages == []

    settings.DUCKGRES_RESTORE_TEST_STORE = scratch.name
    queued = admin.post(action, {"key": old_key})
    assert (queued.status_code, queued["Location"]) == (302, _page(wh.org_id))
    shown = admin.get(_page(wh.org_id)).content.decode()
    assert f"Restore test of s3://{bucket.bucket}/{old_key} (op {old.id}; until now never" in shown
    newest = admin.post(action, {"key": ""})
    assert newest.status_code == 302
    assert [(m["headers"]["task"], m["body"][1]) for m in published.messages] == [
        ("reshard.backup_restore_test", {"org_id": wh.org_id, "backup_key": k, "op_id": o.id})
        for k, o in ((old_key, old), (new_key, new))
    ]
    assert list(
        AuditRecord.objects.filter(action="backup.restore_test", source="django")
        .order_by("id")
        .values_list("status", "org_id")
    ) == [(409, wh.org_id), (202, wh.org_id), (202, wh.org_id)]
    assert admin.get(action).status_code == 405
