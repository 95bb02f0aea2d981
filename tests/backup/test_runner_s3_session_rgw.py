"""A runner's operation-scoped S3 session against real Ceph RGW, which enforces session
policies (moto accepts any credentials). The role ``arn:aws:iam:::role/duckgres-data`` is set
up by ``.ci/rgw.sh``: trusted by the ``testing`` user and allowed all of S3, so whatever the
session cannot do is refused by the session policy the launcher wrote (issue 25 item 3)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from duckgres_admin.lib.s3 import S3, S3Error
from duckgres_admin.models import ReshardOperation
from reshard.engines.backup import KEY_PREFIX, BackupDestination, run_backup
from reshard.launchers import s3scope
from tests.fixtures.backup import add_blob_table, catalog_source
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.rows import new_warehouse

pytestmark = [pytest.mark.rgw, pytest.mark.django_db]

ROLE = "arn:aws:iam:::role/duckgres-data"


def unsaved_op(org_id: str, **fields: Any) -> ReshardOperation:
    """What ``for_launch`` reads of an op: its id, org and restore pins."""
    return ReshardOperation(id=secrets.randbelow(10**8) + 1000, org_id=org_id, **fields)


def runner_process(given: s3scope.RunnerS3, monkeypatch: pytest.MonkeyPatch, settings: Any) -> S3:
    """This process becomes the runner the launcher started: the session in its environment
    (nothing else), the marker in its settings; returns the client its steps build."""
    for name, value in given.environment().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_RESHARD_S3_SESSION = given.description
    return S3(role_arn=ROLE)  # the steps pass the warehouse's role; a session assumes nothing


def denied(call: Any) -> str:
    with pytest.raises(S3Error) as caught:
        call()
    return caught.value.code


@pytest.mark.safeguard("reshard-137")
def test_a_runner_session_backs_up_its_own_operation_and_reaches_no_other_object(
    rgw: tuple[S3, str],
    hooks: RecordingHooks,
    tenant_catalog: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    admin, bucket = rgw
    # Another organisation's genuine backup in the same (shared) bucket, and a tenant object.
    other_key = f"{KEY_PREFIX}op-7-20261201T000000Z.dump"
    admin.client.put_object(Bucket=bucket, Key=other_key, Body=b"PGDMP other org")
    admin.client.put_object(Bucket=bucket, Key="tenant/data.parquet", Body=b"rows")
    wh = new_warehouse(data_bucket=bucket, data_region="us-east-1", data_role_arn=ROLE)
    op = unsaved_op(wh.org_id)

    given = s3scope.for_launch(op)  # as the launcher does, with the control plane's keys
    assert given is not None
    assert f"role {ROLE}" in given.description
    assert f"op-{op.id}-*" in given.description
    assert "testing" not in given.environment().values()  # not the control plane's keys
    runner = runner_process(given, monkeypatch, settings)

    # Everything the backup does (stale-upload listing, multipart, complete, HEAD) is allowed.
    catalog = tenant_catalog()
    add_blob_table(catalog, 12)
    result = run_backup(
        op.id,
        catalog_source(catalog),
        BackupDestination(bucket, "us-east-1", ROLE),
        hooks,
        part_size=5 * 1024 * 1024,
    )
    assert result.parts >= 2
    assert admin.head_size(bucket, result.key) == result.bytes
    head = runner.head(bucket, result.key)
    assert head is not None
    assert head.size == result.bytes

    # Nothing else: another op's backup, the tenant's data, a listing, a write elsewhere.
    assert denied(lambda: runner.stream_object(bucket, other_key)) == "AccessDenied"
    assert denied(lambda: runner.stream_object(bucket, "tenant/data.parquet")) == "AccessDenied"
    assert denied(lambda: runner.delete_object(bucket, other_key)) == "AccessDenied"
    assert denied(lambda: runner.list_keys(bucket, KEY_PREFIX)) == "AccessDenied"
    assert denied(lambda: runner.create_multipart_upload(bucket, other_key)) == "AccessDenied"
    assert admin.client.get_object(Bucket=bucket, Key=other_key)["Body"].read() == (
        b"PGDMP other org"
    )


@pytest.mark.safeguard("reshard-137")
def test_a_restore_session_reads_exactly_its_recorded_source(
    rgw: tuple[S3, str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    admin, bucket = rgw
    source = f"{KEY_PREFIX}op-11-20261201T000000Z.dump"
    sibling = f"{KEY_PREFIX}op-11-20261202T000000Z.dump"  # same op, another (planted) key
    for key in (source, sibling):
        admin.client.put_object(Bucket=bucket, Key=key, Body=b"PGDMP " + key.encode())
    wh = new_warehouse(data_bucket=bucket, data_region="us-east-1", data_role_arn=ROLE)
    op = unsaved_op(
        wh.org_id, kind="restore", restore_backup_key=source, restore_backup_bucket=bucket
    )

    given = s3scope.for_launch(op)
    assert given is not None
    assert f"reads s3://{bucket}/{source}" in given.description
    runner = runner_process(given, monkeypatch, settings)

    stream = runner.stream_object(bucket, source)
    try:
        assert b"".join(stream) == b"PGDMP " + source.encode()
    finally:
        stream.close()
    assert denied(lambda: runner.stream_object(bucket, sibling)) == "AccessDenied"
    assert denied(lambda: runner.delete_object(bucket, source)) == "AccessDenied"


def test_without_a_role_or_sts_the_launch_fails_naming_the_fix(
    rgw: tuple[S3, str],
) -> None:
    """RGW has no GetFederationToken: a warehouse without a role cannot get a session there,
    and the launch says what to set instead of handing out the control plane's keys."""
    _, bucket = rgw
    wh = new_warehouse(data_bucket=bucket, data_region="us-east-1")
    from reshard.launchers.base import LauncherError

    with pytest.raises(LauncherError) as caught:
        s3scope.for_launch(unsaved_op(wh.org_id))
    message = str(caught.value)
    assert "minting the runner's S3 session failed: STS GetFederationToken" in message
    assert "data_role_arn" in message
    assert "DUCKGRES_RUNNER_S3_CREDENTIALS=ambient" in message
    assert "testing" not in message
