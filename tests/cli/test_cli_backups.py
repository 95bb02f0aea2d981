"""``duckgres backups list`` and ``duckgres restore start`` against the live API and a real S3
server (moto's): the table, ``--retention-plan``, ``--output json``, and a restore's dry run and
refusals (docs/cli.md)."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from duckgres_admin.models import ReshardOperation
from reshard.backup import backup_key
from tests.fixtures.backups_listing import bucket
from tests.fixtures.cli import Cli
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.s3 import S3Bucket

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
    s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=b"dump")
    s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=backup_key(99_999_999), Body=b"x")

    listed = cli("backups", "list", wh.org_id)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "key\tsize\tlast_modified\top\tstate\tverified"
    assert len(lines) == 2
    assert lines[1].startswith(f"{key}\t4\t")
    assert lines[1].endswith(f"\t{op.id}\tsucceeded\t-")

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
    s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=b"dump")
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
    assert "is not a backup of this warehouse" in unknown.stderr
    same = cli("restore", "start", wh.org_id, "--backup", key, "--to-shard", here.name,
               "--dry-run", "-o", "json")  # fmt: skip
    assert json.loads(same.stdout)["restore"]["in_place"] is True, "its own store: in place"
    assert not ReshardOperation.objects.filter(kind="restore").exists()
    cli.assert_no_secret()
