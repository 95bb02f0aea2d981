"""The streamed backup against real Ceph RGW (marker ``rgw``; infra.md §2 brings it up with the
user ``testing``/``testing``). RGW differs from moto where it matters here: an empty ETag in the
CompleteMultipartUpload response, and 404 NoSuchUpload (not 500) for an aborted upload."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.lib.s3 import S3
from reshard.engines.backup import KEY_PREFIX, BackupDestination, BackupError, run_backup
from tests.fixtures.backup import add_blob_table, catalog_source, pid_gone
from tests.fixtures.hooks import RecordingHooks

pytestmark = pytest.mark.rgw


def test_multi_part_backup_on_rgw(
    rgw: tuple[S3, str], hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    s3, bucket = rgw
    catalog = tenant_catalog()
    add_blob_table(catalog, 12)
    result = run_backup(
        80, catalog_source(catalog), BackupDestination(bucket), hooks, part_size=5 * 1024 * 1024
    )
    assert result.parts >= 2
    assert s3.head_size(bucket, result.key) == result.bytes
    body = s3.client.get_object(Bucket=bucket, Key=result.key)["Body"].read()
    assert body.startswith(b"PGDMP")
    assert s3.list_multipart_uploads(bucket, KEY_PREFIX) == []


def test_failure_on_rgw_leaves_nothing(
    rgw: tuple[S3, str], hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    s3, bucket = rgw
    catalog = tenant_catalog()
    add_blob_table(catalog, 2)
    with pytest.raises(BackupError, match="backup exceeded 3 parts"):
        run_backup(
            81, catalog_source(catalog), BackupDestination(bucket), hooks,
            max_parts=3, part_size=64 * 1024,
        )  # fmt: skip
    assert s3.list_multipart_uploads(bucket, KEY_PREFIX) == []
    assert s3.list_keys(bucket, KEY_PREFIX) == []
    assert all(pid_gone(p) for p in hooks.processes)
    # An aborted upload is gone for real S3 semantics: aborting again is not an error.
    upload = s3.create_multipart_upload(bucket, f"{KEY_PREFIX}x")
    s3.abort_multipart_upload(bucket, f"{KEY_PREFIX}x", upload)
    s3.abort_multipart_upload(bucket, f"{KEY_PREFIX}x", upload)
