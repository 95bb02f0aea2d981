"""The session policy a runner's S3 session is minted with (pure; what the server does with it
is proven against Ceph RGW in ``tests/backup/test_runner_s3_session_rgw.py``)."""

from __future__ import annotations

import json

import pytest

from reshard.launchers.s3scope import partition_of, session_policy


@pytest.mark.safeguard("reshard-137")
def test_the_policy_names_the_operations_own_keys_and_nothing_wider() -> None:
    text = session_policy(bucket="tenant-b", op_id=42, restore=None, partition="aws")
    assert " " not in text  # compact: RGW does not decode a form-encoded "+" in it
    statements = json.loads(text)["Statement"]
    resources = sorted(r for s in statements for r in s["Resource"])
    assert resources == [
        "arn:aws:s3:::tenant-b",
        "arn:aws:s3:::tenant-b/_reshard_catalog_backups/op-42-*",
    ]
    [bucket_wide] = [s for s in statements if s["Resource"] == ["arn:aws:s3:::tenant-b"]]
    assert bucket_wide["Action"] == ["s3:ListBucketMultipartUploads"]  # never ListBucket
    assert all(s["Effect"] == "Allow" and "*" not in "".join(s["Action"]) for s in statements)
    # op 4 must not match op 42's keys, nor 42 op 420's: the pattern ends with the dash.
    assert "op-42-*" in text


def test_a_restore_reads_exactly_its_source_in_the_roles_partition() -> None:
    role = "arn:aws-cn:iam::123456789012:role/data"
    text = session_policy(
        bucket="b", op_id=9, restore=("b", "_reshard_catalog_backups/op-3-x.dump"),
        partition=partition_of(role),
    )  # fmt: skip
    [restore] = [s for s in json.loads(text)["Statement"] if s["Sid"] == "RestoreSource"]
    assert restore["Resource"] == ["arn:aws-cn:s3:::b/_reshard_catalog_backups/op-3-x.dump"]
    assert restore["Action"] == ["s3:GetObject", "s3:GetObjectVersion"]
    assert partition_of("") == "aws"
    assert partition_of("not-an-arn") == "aws"
