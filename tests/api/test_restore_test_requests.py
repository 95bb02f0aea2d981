"""``POST /warehouses/<org>/backups/restore-test`` (docs/api.md "Restore tests on demand"): who
may ask, which backup is queued, that the existing task is queued (never run here), the audit,
and the refusals that queue nothing — above all when no restore-test store is configured. The
worker's side, against a real Celery worker, is in tests/cli/test_cli_backups.py."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.models import AuditRecord, BackupVerification, ReshardLogEntry
from reshard.engines.backup import backup_key
from tests.fixtures.api import Published, error
from tests.fixtures.backups_listing import op_in_state, put_object, warehouse_with_bucket
from tests.fixtures.rows import new_store
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.django_db

TASK = "reshard.backup_restore_test"


def _url(org: str) -> str:
    return f"/api/v1/warehouses/{org}/backups/restore-test"


def _queued(published: Published) -> list[tuple[str, dict[str, Any]]]:
    """(task, kwargs) of every message sent (Celery protocol 2: body = (args, kwargs, embed))."""
    return [(m["headers"]["task"], m["body"][1]) for m in published.messages]


@pytest.mark.safeguard("reshard-113")
def test_the_newest_backup_or_the_named_one_is_queued_audited_and_not_run_here(
    clients: Any, bucket: S3Bucket, published: Published, settings: Any
) -> None:
    scratch = new_store(port=5434)  # a server no warehouse of this test is on
    settings.DUCKGRES_RESTORE_TEST_STORE = scratch.name
    wh = warehouse_with_bucket(bucket.bucket)
    old, new = op_in_state(wh, "succeeded"), op_in_state(wh, "failed")
    old_key = put_object(bucket, backup_key(old.id))
    new_key = put_object(bucket, backup_key(new.id))
    active_key = put_object(bucket, backup_key(op_in_state(wh, "running").id))
    BackupVerification.objects.create(
        org_id=wh.org_id, bucket=bucket.bucket, key=old_key, op_id=old.id, result="failed",
        detail="pg_restore exited with status 1", store=scratch.name,
    )  # fmt: skip

    # No key: the newest backup of an ended operation (the running op's newer one is skipped).
    newest = clients.internal.post(_url(wh.org_id), {}, format="json")
    assert newest.status_code == 202, newest.content
    doc = newest.json()
    assert (doc["backup_key"], doc["op_id"], doc["store"], doc["task"]) == (
        new_key,
        new.id,
        scratch.name,
        TASK,
    )
    assert doc["uri"] == f"s3://{bucket.bucket}/{new_key}"
    assert doc["previous"]["verified"] is None
    assert _queued(published) == [
        (TASK, {"org_id": wh.org_id, "backup_key": new_key, "op_id": new.id})
    ]
    assert published.messages[0]["headers"]["id"] == doc["task_id"]

    # A named backup, one whose last test failed: queued again (that is how it is retried).
    published.messages.clear()
    retry = clients.admin.post(_url(wh.org_id), {"backup_key": old_key}, format="json")
    assert retry.status_code == 202, retry.content
    assert retry.json()["previous"]["verified"] is False
    assert retry.json()["previous"]["verification_detail"] == "pg_restore exited with status 1"
    assert _queued(published) == [
        (TASK, {"org_id": wh.org_id, "backup_key": old_key, "op_id": old.id})
    ]

    # Nothing was restored in this process: the failed row is untouched, no new row exists.
    assert BackupVerification.objects.get(key=old_key).result == "failed"
    assert not BackupVerification.objects.filter(key=new_key).exists()

    # The backup's operation log says who asked; the audit rows say what was queued.
    assert ReshardLogEntry.objects.filter(
        operation_id=new.id, source="api", message__contains="asked by internal-secret"
    ).exists()
    audits = list(
        AuditRecord.objects.filter(action="backup.restore_test", org_id=wh.org_id)
        .order_by("id")
        .values_list("status", "actor", "detail")
    )
    assert [(status, actor) for status, actor, _ in audits] == [
        (202, "internal-secret"),
        (202, "admin@example.com"),
    ]
    assert f"restore test of s3://{bucket.bucket}/{new_key}" in audits[0][2]
    assert f"on store {scratch.name}: task {doc['task_id']}" in audits[0][2]
    assert "until now failed" in audits[1][2]

    # The backup of a running operation is refused by name.
    published.messages.clear()
    busy = clients.internal.post(_url(wh.org_id), {"backup_key": active_key}, format="json")
    assert busy.status_code == 409
    assert "is still running" in error(busy)
    assert published.messages == []


@pytest.mark.safeguard("reshard-113")
@pytest.mark.safeguard("reshard-130")
def test_no_restore_test_store_is_a_clear_409_and_queues_nothing(
    clients: Any, bucket: S3Bucket, published: Published, settings: Any
) -> None:
    wh = warehouse_with_bucket(bucket.bucket)
    put_object(bucket, backup_key(op_in_state(wh, "succeeded").id))

    settings.DUCKGRES_RESTORE_TEST_STORE = ""
    off = clients.internal.post(_url(wh.org_id), {}, format="json")
    assert off.status_code == 409
    assert off.json()["code"] == "restore_test_disabled"
    assert error(off).startswith(
        "no restore-test store is configured (DUCKGRES_RESTORE_TEST_STORE is empty), so no "
        "restore test can run: nothing was queued; set DUCKGRES_RESTORE_TEST_STORE"
    )

    settings.DUCKGRES_RESTORE_TEST_STORE = "no-such-store"
    wrong = clients.internal.post(_url(wh.org_id), {}, format="json")
    assert (wrong.status_code, wrong.json()["code"]) == (409, "restore_test_store_invalid")
    assert "DUCKGRES_RESTORE_TEST_STORE='no-such-store' names no metadata store" in error(wrong)

    # The warehouse's own store (its server serves a warehouse): refused unless allowed.
    settings.DUCKGRES_RESTORE_TEST_STORE = wh.metadata_store_id
    serving = clients.internal.post(_url(wh.org_id), {}, format="json")
    assert (serving.status_code, serving.json()["code"]) == (409, "restore_test_store_serving")
    assert "serves 1 warehouse(s)" in error(serving), error(serving)
    assert error(serving).endswith("to accept that risk: nothing was queued")

    assert published.messages == [], "a refusal queues no no-op"
    assert list(
        AuditRecord.objects.filter(action="backup.restore_test").values_list("status", flat=True)
    ) == [409, 409, 409], "refusals are audited too"


def test_who_may_ask_and_the_bodys_refusals(
    clients: Any, bucket: S3Bucket, published: Published, settings: Any
) -> None:
    settings.DUCKGRES_RESTORE_TEST_STORE = new_store(port=5434).name
    wh, empty = warehouse_with_bucket(bucket.bucket), warehouse_with_bucket(bucket.bucket)
    other = warehouse_with_bucket(bucket.bucket)
    foreign = put_object(bucket, backup_key(op_in_state(other, "succeeded").id))
    put_object(bucket, backup_key(op_in_state(wh, "succeeded").id))
    url = _url(wh.org_id)

    assert clients.viewer.post(url, {}, format="json").status_code == 403
    assert clients.disabled.post(url, {}, format="json").status_code == 403
    assert clients.dataplane.post(url, {}, format="json").status_code in (401, 403)
    assert clients.anon.post(url, {}, format="json").status_code in (401, 403)

    for body, status, message in (
        ({"backup_kee": "x"}, 400, "invalid body: backup_kee: unknown field"),
        ({"backup_key": 5}, 400, "invalid body: backup_key: must be a string"),
        ({"dry_run": True}, 400, "invalid body: dry_run: accepted only on POST"),
        ({"backup_key": "op-1.dump"}, 400, "invalid body: backup_key: must be a key under"),
        ({"backup_key": foreign}, 404, f"backup_key: {foreign} is not a backup of this"),
    ):
        answer = clients.internal.post(url, body, format="json")
        assert (answer.status_code, error(answer)[: len(message)]) == (status, message), body
    missing = clients.internal.post(_url("no-such-org"), {}, format="json")
    assert (missing.status_code, error(missing)) == (404, "org has no managed warehouse")
    nothing = clients.internal.post(_url(empty.org_id), {}, format="json")
    assert nothing.status_code == 404
    assert "has no backup of an ended operation" in error(nothing)
    assert published.messages == []
