"""``GET /warehouses/<org>/backups`` and the backup retention run, against a real S3 server
(moto's, over HTTP): only this org's backups are listed, the listing is bounded and says so,
the dry-run plan, and the retention task deletes exactly the planned keys (docs/backup.md)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import ReshardLogEntry
from duckgres_admin.platform.config import EnvReader
from duckgres_admin.platform.lockkeys import BACKUP_RETENTION_LOCK_KEY
from reshard.backups import inventory, retention, tasks
from reshard.engines.backup import KEY_PREFIX, backup_key
from tests.fixtures.api import error
from tests.fixtures.backups_listing import op_in_state as _op
from tests.fixtures.backups_listing import put_object as _put
from tests.fixtures.backups_listing import warehouse_with_bucket as _wh
from tests.fixtures.s3 import S3Bucket


def reload_op(op: Any) -> Any:
    op.refresh_from_db()
    return op


pytestmark = pytest.mark.django_db


def _policy(settings: Any, **values: Any) -> None:
    settings.DUCKGRES_BACKUP_RETENTION = retention.RetentionPolicy(**values)


def _in_days(monkeypatch: pytest.MonkeyPatch, days: float) -> dt.datetime:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    monkeypatch.setattr(inventory, "_now", lambda: later)
    return later


@pytest.mark.safeguard("reshard-93")
def test_only_this_orgs_backups_are_listed_even_in_a_shared_bucket(clients, bucket):
    mine = _wh(bucket.bucket)
    other = _wh(bucket.bucket)
    first, second = _op(mine, "succeeded"), _op(mine, "failed")
    foreign = _op(other, "succeeded")
    k1 = _put(bucket, backup_key(first.id), size=11)
    k2 = _put(bucket, backup_key(second.id), size=22)
    first.backup_s3_uri = f"s3://{bucket.bucket}/{k1}"
    first.save(update_fields=["backup_s3_uri"])
    _put(bucket, backup_key(foreign.id))  # another org's operation
    _put(bucket, backup_key(99_999_999))  # an id this installation does not know
    _put(bucket, backup_key(first.id, dt.datetime(2001, 1, 1, tzinfo=dt.UTC)))  # another life
    _put(bucket, f"{KEY_PREFIX}op-{first.id}-notes.txt")  # not a backup key
    _put(bucket, "elsewhere/op-1-20260101T000000Z.dump")  # outside the prefix

    for client in (clients.internal, clients.viewer, clients.admin):
        resp = client.get(f"/api/v1/warehouses/{mine.org_id}/backups")
        assert resp.status_code == 200, resp.content
        body = resp.json()
        assert [b["key"] for b in body["backups"]] == [k2, k1], "newest first, only mine"
        assert (body["listed_objects"], body["ignored_objects"]) == (6, 4)
        assert (body["truncated"], body["bucket"]) == (False, bucket.bucket)
    newest, oldest = body["backups"]
    assert newest == {
        "key": k2,
        "uri": f"s3://{bucket.bucket}/{k2}",
        "size": 22,
        "last_modified": newest["last_modified"],
        "op_id": second.id,
        "op_state": "failed",
        "recorded": True,
        "sha256": reload_op(second).backup_sha256,
        "version_id": None,
        "verified": None,
        "verified_at": None,
        "verification_detail": "",
    }
    assert newest["last_modified"].endswith("Z")
    assert (oldest["op_id"], oldest["size"], oldest["recorded"]) == (first.id, 11, True)
    assert "null when none has run" in body["verified_note"]
    assert "retention" not in body

    theirs = clients.internal.get(f"/api/v1/warehouses/{other.org_id}/backups").json()
    assert [b["op_id"] for b in theirs["backups"]] == [foreign.id]

    assert clients.anon.get(f"/api/v1/warehouses/{mine.org_id}/backups").status_code == 401
    missing = clients.internal.get("/api/v1/warehouses/no-such-org/backups")
    assert (missing.status_code, error(missing)) == (404, "org has no managed warehouse")
    bad = clients.internal.get(f"/api/v1/warehouses/{mine.org_id}/backups?retention=apply")
    assert (bad.status_code, error(bad)) == (400, "invalid query: retention: must be plan")
    empty = _wh("")
    none = clients.internal.get(f"/api/v1/warehouses/{empty.org_id}/backups").json()
    assert (none["bucket"], none["backups"]) == (None, [])


@pytest.mark.safeguard("reshard-93")
def test_the_listing_is_bounded_and_says_so(clients, bucket, monkeypatch, settings):
    monkeypatch.setattr(inventory, "LIST_MAX_OBJECTS", 3)
    wh = _wh(bucket.bucket)
    for _ in range(5):
        _put(bucket, backup_key(_op(wh, "succeeded").id))
    _policy(settings, enabled=True, keep_last=1, min_age_days=1)
    _in_days(monkeypatch, 40)
    body = clients.internal.get(f"/api/v1/warehouses/{wh.org_id}/backups?retention=plan").json()
    assert (body["truncated"], body["listed_objects"], body["max_listed_objects"]) == (True, 3, 3)
    assert len(body["backups"]) == 3
    assert body["retention"]["deletes"] == 0, "a truncated listing deletes nothing"
    assert all(b["retention"]["action"] == "keep" for b in body["backups"])
    assert "the listing stopped at 3 objects" in body["backups"][0]["retention"]["reason"]
    report = inventory.apply_retention()
    assert (report.ran, report.deleted, report.kept_truncated) == (True, [], [wh.org_id])
    assert len(bucket.object_keys()) == 5


@pytest.mark.safeguard("reshard-93")
def test_s3_errors_are_502_or_503_with_a_clear_message(clients, bucket, settings):
    gone = _wh("no-such-bucket-here")
    resp = clients.internal.get(f"/api/v1/warehouses/{gone.org_id}/backups")
    assert resp.status_code == 502
    assert resp.json()["code"] == "backup_listing_failed"
    assert error(resp).startswith(
        f"cannot list the backups in s3://no-such-bucket-here/{KEY_PREFIX}: list "
    )
    assert "NoSuchBucket" in error(resp)
    assert "testing" not in error(resp)

    settings.DUCKGRES_S3_ENDPOINT_URL = "http://127.0.0.1:1"
    wh = _wh(bucket.bucket)
    down = clients.internal.get(f"/api/v1/warehouses/{wh.org_id}/backups")
    assert down.status_code == 503
    assert down.json()["code"] == "backup_storage_unavailable"
    assert "cannot list the backups in s3://" in error(down)


def _fleet(bucket: S3Bucket) -> dict[str, Any]:
    """One warehouse with five backups, oldest first: an active op's, then four terminal ones;
    and another org's old backup in the same bucket."""
    wh = _wh(bucket.bucket)
    other = _wh(bucket.bucket)
    active = _op(wh, "running")
    keys = {"active": _put(bucket, backup_key(active.id))}
    for name, state in (("k1", "succeeded"), ("k2", "failed"), ("k3", "cancelled")):
        op = _op(wh, state)
        keys[name] = _put(bucket, backup_key(op.id))
    keys["other"] = _put(bucket, backup_key(_op(other, "succeeded").id))
    keys["k4"] = _put(bucket, backup_key(_op(wh, "succeeded").id))
    return {"wh": wh, "other": other, "keys": keys}


@pytest.mark.safeguard("reshard-94")
def test_the_dry_run_plan_gives_keep_or_delete_with_the_reason(
    clients, bucket, settings, monkeypatch
):
    fleet = _fleet(bucket)
    keys = fleet["keys"]
    _policy(settings, enabled=False, keep_last=2, min_age_days=30)
    _in_days(monkeypatch, 40)
    url = f"/api/v1/warehouses/{fleet['wh'].org_id}/backups?retention=plan"
    body = clients.viewer.get(url).json()
    plan = {b["key"]: (b["retention"]["action"], b["retention"]["reason"]) for b in body["backups"]}
    assert [b["key"] for b in body["backups"]] == [
        keys["k4"], keys["k3"], keys["k2"], keys["k1"], keys["active"]
    ]  # fmt: skip
    assert plan[keys["k4"]][0] == plan[keys["k3"]][0] == "keep"
    assert plan[keys["k4"]][1].startswith("among the newest 2 (40.0 days old")
    assert plan[keys["k2"]] == (
        "delete",
        "not among the newest 2, older than 30 days (40.0 days old), operation "
        f"{body['backups'][2]['op_id']} failed",
    )
    assert plan[keys["k1"]][0] == "delete"
    assert plan[keys["active"]] == (
        "keep",
        f"operation {body['backups'][4]['op_id']} is still running",
    )
    assert body["retention"] == {
        "enabled": False,
        "keep_last": 2,
        "min_age_days": 30,
        "deletes": 2,
        "note": "retention is disabled (DUCKGRES_BACKUP_RETENTION_ENABLED=false): nothing is "
        "deleted; the keys marked delete are what it would delete",
    }
    # Younger than D days: kept whatever N says.
    _in_days(monkeypatch, 10)
    young = clients.internal.get(url).json()
    assert young["retention"]["deletes"] == 0
    assert young["backups"][2]["retention"]["reason"] == "younger than 30 days (10.0 days old)"
    # The plan deleted nothing.
    assert sorted(bucket.object_keys()) == sorted(keys.values())


@pytest.mark.safeguard("reshard-94")
def test_the_task_deletes_exactly_the_planned_keys(clients, bucket, settings, monkeypatch):
    fleet = _fleet(bucket)
    keys = fleet["keys"]
    _policy(settings, enabled=True, keep_last=2, min_age_days=30)
    _in_days(monkeypatch, 40)
    url = f"/api/v1/warehouses/{fleet['wh'].org_id}/backups?retention=plan"
    planned = {
        b["uri"] for b in clients.internal.get(url).json()["backups"]
        if b["retention"]["action"] == "delete"
    }  # fmt: skip
    assert planned == {f"s3://{bucket.bucket}/{keys[k]}" for k in ("k1", "k2")}

    result = tasks.backup_retention_task()
    assert result == {
        "enabled": True, "ran": True, "warehouses": 2, "deleted": 2, "errors": 0, "bounded": False
    }  # fmt: skip
    left = set(bucket.object_keys())
    assert left == {keys[k] for k in ("active", "k3", "k4", "other")}, (
        "the active op's, the newest N and another org's backups stay"
    )
    lines = ReshardLogEntry.objects.filter(message__startswith="backup retention: deleted")
    assert {line.message.split()[3] for line in lines} == planned
    assert all(line.source == "janitor" for line in lines)
    # A second run finds nothing more to delete.
    assert tasks.backup_retention_task()["deleted"] == 0


@pytest.mark.safeguard("reshard-94")
def test_disabled_or_locked_deletes_nothing(bucket, settings, monkeypatch):
    fleet = _fleet(bucket)
    before = sorted(bucket.object_keys())
    _in_days(monkeypatch, 400)
    _policy(settings, enabled=False, keep_last=1, min_age_days=1)
    report = inventory.apply_retention()
    assert (report.enabled, report.ran, report.deleted) == (False, False, [])
    assert sorted(bucket.object_keys()) == before

    # Another run holds the lock (another session): this run does nothing.
    _policy(settings, enabled=True, keep_last=1, min_age_days=1)
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [BACKUP_RETENTION_LOCK_KEY])
        report = inventory.apply_retention()
        assert (report.enabled, report.ran, report.deleted) == (True, False, [])
        assert sorted(bucket.object_keys()) == before
        # Released before the close: a closed client's backend may hold it a moment longer.
        other.execute("SELECT pg_advisory_unlock(%s)", [BACKUP_RETENTION_LOCK_KEY])
    # Released: the run proceeds, and the lock is not left behind.
    assert len(inventory.apply_retention().deleted) == 3
    assert not inventory.lock_held()
    assert fleet["keys"]["active"] in bucket.object_keys()


def test_the_policy_settings_are_parsed_strictly():
    assert retention.policy_from_env(EnvReader({})) == retention.RetentionPolicy(False, 5, 30)
    env = EnvReader(
        {
            "DUCKGRES_BACKUP_RETENTION_ENABLED": "true",
            "DUCKGRES_BACKUP_RETENTION_KEEP_LAST": "0",
            "DUCKGRES_BACKUP_RETENTION_MIN_AGE_DAYS": "x",
        }
    )
    retention.policy_from_env(env)
    with pytest.raises(ImproperlyConfigured) as refused:
        env.raise_if_errors()
    assert "DUCKGRES_BACKUP_RETENTION_KEEP_LAST='0' must be >= 1" in str(refused.value)
    assert "DUCKGRES_BACKUP_RETENTION_MIN_AGE_DAYS='x' is not an integer" in str(refused.value)


@pytest.mark.safeguard("reshard-109")
def test_only_recorded_objects_are_backups_an_overwritten_or_planted_one_is_refused(
    clients, bucket, settings
):
    """The tenant owns its bucket: it overwrites a backup with another archive and plants new
    keys (under its own operation's id, and under another org's in a shared bucket). The
    listing shows only the recorded objects, names the changed one, and the restore start, the
    restore test's candidates and retention never take either."""
    from duckgres_admin.models import Warehouse
    from reshard.backups import restore_test
    from reshard.kinds import restore_checks

    mine, other = _wh(bucket.bucket), _wh(bucket.bucket)
    genuine, overwritten = _op(mine, "succeeded"), _op(mine, "succeeded")
    killed, foreign = _op(mine, "failed"), _op(other, "succeeded")
    kept = _put(bucket, backup_key(genuine.id), size=40)
    replaced = _put(bucket, backup_key(overwritten.id), size=40)
    # The tenant replaces it with a hostile archive of another size (a same-size one has
    # another ETag; the reader's digest check is the last line: tests/backup).
    bucket.client().put_object(Bucket=bucket.bucket, Key=replaced, Body=b"PGDMP-hostile" * 9)
    # A key of its own failed operation that the operation never recorded.
    planted = _put(bucket, backup_key(killed.id), size=40, record=False)
    under_foreign = _put(bucket, backup_key(foreign.id), size=40, record=False)

    body = clients.internal.get(f"/api/v1/warehouses/{mine.org_id}/backups").json()
    assert [b["key"] for b in body["backups"]] == [kept]
    assert body["unrecorded_objects"] == 1, body
    assert body["changed_objects"] == [
        {
            "key": replaced,
            "reason": f"size 117 differs from the 40 bytes operation {overwritten.id} wrote: "
            "the object was replaced since",
        }
    ]
    theirs = clients.internal.get(f"/api/v1/warehouses/{other.org_id}/backups").json()
    assert (theirs["backups"], theirs["unrecorded_objects"]) == ([], 1)

    wh = Warehouse.objects.get(org_id=mine.org_id)
    for key, status, words in (
        (replaced, 409, "was replaced since"),
        (planted, 404, "is not a recorded backup of this warehouse"),
        (under_foreign, 404, "is not a recorded backup of this warehouse"),
    ):
        with pytest.raises(ServiceError) as caught:
            restore_checks.resolve_backup(wh, key)
        assert (caught.value.status, words in caught.value.message) == (status, True), key
    found, made_by = restore_checks.resolve_backup(wh, kept)
    recorded = reload_op(genuine).backup_sha256
    assert (found.sha256, found.size, made_by.id) == (recorded, 40, genuine.id)

    # The restore test's candidates and retention read the same listing.
    picked = [
        c.backup.key
        for c in restore_test.candidates(
            dt.datetime.now(dt.UTC), inventory.warehouse_client, restore_test.RestoreTestReport()
        )
    ]
    assert not {replaced, planted, under_foreign} & set(picked)
    _policy(settings, enabled=True, keep_last=0, min_age_days=0)
    report = inventory.apply_retention()
    assert report.deleted == [f"s3://{bucket.bucket}/{kept}"], "only the recorded one counts"
    assert {replaced, planted, under_foreign} <= set(bucket.object_keys())
