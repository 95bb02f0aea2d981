"""``duckgres backups list``, ``duckgres backups test`` and ``duckgres restore start`` against
the live API and a real S3 server (moto's): the table, ``--retention-plan``, ``--output json``,
a restore's dry run and refusals, the on-demand restore test run by a real Celery worker on the
real store clusters, and how a restore is named by ``reshard list`` and ``--follow``
(docs/cli.md)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from duckgres_admin.models import BackupVerification, ReshardLogEntry, ReshardOperation
from duckgres_admin.platform.lockkeys import RESTORE_TEST_LOCK_KEY
from reshard.engines import verify
from reshard.engines.backup import backup_key
from tests.fixtures.backup import pg_dump_custom
from tests.fixtures.backups_listing import bucket, op_in_state, put_object, warehouse_with_bucket
from tests.fixtures.cli import Cli
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.stores import StoreClusters

assert bucket  # a fixture, used by name below


@pytest.mark.safeguard("reshard-93")
def test_backups_list_prints_this_orgs_backups(
    cli: Cli,
    transactional_db: None,
    bucket: S3Bucket,
) -> None:
    # The live server runs in this process: ``bucket`` points its S3 settings at moto.
    s3_bucket = bucket
    name = unique("cat")
    wh = new_warehouse(
        store=new_store(),
        data_bucket=s3_bucket.bucket,
        metadata_store_database=name,
        metadata_store_user=name,
        metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
    )
    op = new_op(wh, to_store=new_store(), state="succeeded", finished_at=timezone.now())
    key = backup_key(op.id)
    put_object(s3_bucket, key, size=4)  # recorded on its operation, as the runner records it
    put_object(s3_bucket, backup_key(99_999_999), size=1)  # an id this installation does not know
    # A killed attempt's complete object of the same operation: never recorded, never listed.
    attempt = backup_key(op.id, timezone.now() + dt.timedelta(seconds=2))
    put_object(s3_bucket, attempt, size=4, record=False)

    listed = cli("backups", "list", wh.org_id)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "key\tsize\tlast_modified\top\tstate\tsha256\tverified"
    sha = ReshardOperation.objects.get(pk=op.id).backup_sha256
    assert lines[1].startswith(f"{key}\t4\t")
    assert lines[1].endswith(f"\t{op.id}\tsucceeded\t{sha[:12]}\t-")
    assert lines[2:] == [
        "(1 object(s) of this org's operations are not recorded backups (a killed attempt's, "
        "or not written by the product): not listed)"
    ]

    planned = cli("backups", "list", wh.org_id, "--retention-plan")
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.splitlines()[1].endswith("\tkeep: among the newest 5 (0.0 days old)")
    assert "retention: retention is disabled" in planned.stdout

    as_json = json.loads(cli("backups", "list", wh.org_id, "-o", "json").stdout)
    assert [(b["key"], b["verified"]) for b in as_json["backups"]] == [(key, None)]

    missing = cli("backups", "list", "no-such-org-x")
    assert missing.returncode == 1
    assert "HTTP 404: org has no managed warehouse" in missing.stderr
    cli.assert_no_secret()


@pytest.mark.safeguard("reshard-103")
def test_restore_start_against_the_live_api(
    cli: Cli,
    transactional_db: None,
    bucket: S3Bucket,
) -> None:
    s3_bucket = bucket
    name = unique("cat")
    here, there = new_store(), new_store()
    wh = new_warehouse(
        store=here,
        data_bucket=s3_bucket.bucket,
        metadata_store_database=name,
        metadata_store_user=name,
        metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
    )
    op = new_op(wh, to_store=there, state="succeeded", finished_at=timezone.now())
    key = backup_key(op.id)
    put_object(s3_bucket, key, size=4)
    uri = f"s3://{s3_bucket.bucket}/{key}"

    # The dry run: the backup's facts, and the reshard's preflight (this warehouse's catalog
    # does not exist on the store, so a check fails: exit 1, nothing created).
    plan = cli("restore", "start", wh.org_id, "--backup", uri, "--to-shard", there.name,
               "--dry-run", "-o", "json")  # fmt: skip
    assert plan.returncode == 1, plan.stderr
    doc = json.loads(plan.stdout)
    assert (doc["kind"], doc["restore"]["backup_key"], doc["restore"]["made_by_op"]) == (
        "restore",
        key,
        op.id,
    )
    assert any(not check["ok"] for check in doc["preflight"])
    unknown = cli("restore", "start", wh.org_id, "--backup", key + "x", "--to-shard", there.name)
    assert unknown.returncode == 1
    assert "is not a recorded backup of this warehouse" in unknown.stderr
    same = cli("restore", "start", wh.org_id, "--backup", key, "--to-shard", here.name,
               "--dry-run", "-o", "json")  # fmt: skip
    assert json.loads(same.stdout)["restore"]["in_place"] is True, "its own store: in place"
    assert not ReshardOperation.objects.filter(kind="restore").exists()
    cli.assert_no_secret()


@pytest.mark.safeguard("reshard-114")
def test_reshard_list_and_follow_name_a_restore_and_an_in_place_one(
    cli: Cli, transactional_db: None
) -> None:
    key = "_reshard_catalog_backups/op-1-20260101T000000Z.dump"
    here = new_store()
    name = unique("cat")
    wh = new_warehouse(
        store=here,
        metadata_store_database=name,
        metadata_store_user=name,
        metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
    )
    reshard = new_op(wh, to_store=new_store(), state="succeeded")
    elsewhere = new_op(
        wh, to_store=new_store(), state="failed", kind="restore", restore_backup_key=key,
        error="boom",
    )  # fmt: skip
    in_place = new_op(
        wh, to_store=here, state="succeeded", kind="restore", restore_backup_key=key,
        target_database=f"{name}_restored_0123abcd",
    )  # fmt: skip

    listed = cli("reshard", "list", "--org", wh.org_id)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "id\torg\tkind\tstate\tstep\tsource -> target\tcreated_at"
    assert lines[1].startswith(
        f"{in_place.id}\t{wh.org_id}\tin-place restore\tsucceeded\t-\t{here.name} -> {here.name}\t"
    )
    assert lines[2].startswith(f"{elsewhere.id}\t{wh.org_id}\trestore\tfailed\t")
    assert lines[3].startswith(f"{reshard.id}\t{wh.org_id}\treshard\tsucceeded\t")

    followed = cli("reshard", "follow", str(in_place.id))
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[-1] == f"in-place restore {in_place.id} succeeded"
    failed = cli("reshard", "follow", str(elsewhere.id))
    assert failed.returncode == 4
    assert failed.stdout.splitlines()[-1] == f"restore {elsewhere.id} failed: boom"
    cli.assert_no_secret()


def _wait_for(what: str, found: Callable[[], Any], worker: Any, seconds: float = 150.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {seconds:.0f} s\n{worker.log_text()[-6000:]}")


@pytest.mark.safeguard("reshard-113")
def test_backups_test_queues_a_restore_test_that_the_worker_runs(
    cli: Cli,
    transactional_db: None,
    bucket: S3Bucket,
    store_clusters: StoreClusters,
    tenant_catalog: Any,
    settings: Any,
    celery_worker_factory: Callable[..., Any],
) -> None:
    catalog = tenant_catalog(store_clusters.source, rows=3)
    scratch = new_store(store_clusters.target)
    wh = warehouse_with_bucket(bucket.bucket)
    op = op_in_state(wh, "succeeded")
    with catalog.cluster.superuser_conn(catalog.database) as conn:
        state = verify.read_state(conn)
    op.catalog_fingerprint = verify.compare(state, state).fingerprint()
    op.save(update_fields=["catalog_fingerprint"])
    key = backup_key(op.id)
    dump = pg_dump_custom(catalog)
    answer = bucket.client().put_object(Bucket=bucket.bucket, Key=key, Body=dump)
    uri = f"s3://{bucket.bucket}/{key}"
    # Recorded on its operation as the runner records what it wrote (only recorded objects are
    # backups, docs/backup.md).
    ReshardOperation.objects.filter(pk=op.id).update(
        backup_s3_uri=uri,
        backup_bytes=len(dump),
        backup_sha256=hashlib.sha256(dump).hexdigest(),
        backup_etag=str(answer.get("ETag", "")).strip('"'),
    )

    # No store configured (the API's own setting): a clear refusal, nothing queued.
    settings.DUCKGRES_RESTORE_TEST_STORE = ""
    off = cli("backups", "test", wh.org_id)
    assert off.returncode == 1
    assert "no restore-test store is configured (DUCKGRES_RESTORE_TEST_STORE is empty)" in (
        off.stderr
    )
    assert "[restore_test_disabled]" in off.stderr

    settings.DUCKGRES_RESTORE_TEST_STORE = scratch.name
    worker = celery_worker_factory(
        extra_env={**bucket.env(), "DUCKGRES_RESTORE_TEST_STORE": scratch.name}
    )
    # Another run holds the lock: the asked-for test waits (retried), it is not dropped.
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [RESTORE_TEST_LOCK_KEY])
        queued = cli("backups", "test", wh.org_id, "--key", uri)
        assert queued.returncode == 0, queued.stderr
        first = queued.stdout.splitlines()[0]
        assert first.startswith(
            f"queued a restore test of {uri} (operation {op.id}; until now never tested) on "
            f"store {scratch.name}: task "
        ), first
        _wait_for(
            "the deferral noted on the op log",
            lambda: ReshardLogEntry.objects.filter(
                operation_id=op.id, message__contains="another restore-test run holds the lock"
            ).exists(),
            worker,
        )
        assert not BackupVerification.objects.filter(key=key).exists()
    row = _wait_for(
        "the restore test's result",
        lambda: BackupVerification.objects.filter(key=key).first(),
        worker,
    )
    assert (row.result, row.store, row.op_id) == ("passed", scratch.name, op.id)
    listed = cli("backups", "list", wh.org_id)
    sha = hashlib.sha256(dump).hexdigest()[:12]
    assert listed.stdout.splitlines()[1].endswith(f"\t{op.id}\tsucceeded\t{sha}\ttrue")

    # Asked again (no key: the newest backup): tested again, the result replaced.
    again = cli("backups", "test", wh.org_id, "-o", "json")
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert (doc["backup_key"], doc["previous"]["verified"]) == (key, True)
    _wait_for(
        "the second result",
        lambda: BackupVerification.objects.filter(key=key, checked_at__gt=row.checked_at).exists(),
        worker,
    )
    assert BackupVerification.objects.filter(key=key).count() == 1
    cli.assert_no_secret()
