"""Unit tables of the backup: part sizes, client selection, key format; STS AssumeRole."""

from __future__ import annotations

import datetime as dt
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.lib.s3 import S3, S3Error
from reshard.engines import clients
from reshard.engines.backup import (
    BackupDestination,
    BackupError,
    BackupResult,
    backup_key,
    gated_failure,
    part_size_for,
    run_backup,
)
from reshard.engines.clients import BackupSource
from tests.fixtures.backup import MotoS3
from tests.fixtures.hooks import RecordingHooks

MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40


@pytest.mark.safeguard("reshard-36")
@pytest.mark.parametrize(
    ("db_size", "max_parts", "expected"),
    [
        (0, 10_000, 16 * MIB),
        (1 * GIB, 10_000, 16 * MIB),
        (500 * GIB, 10_000, 103 * MIB),  # 1000 GiB / 10,000 = 102.4 MiB → ceil to MiB
        (60 * TIB, 10_000, 5 * GIB),  # 12.3 GiB capped at the S3 part limit
        (None, 10_000, 64 * MIB),  # size unreadable
        (1 * GIB, 5, 410 * MIB),  # tests' small MAX_PARTS: 2 GiB / 5 = 409.6 MiB
        (80 * GIB, 10_000, 17 * MIB),  # 16.384 MiB → 17 MiB
    ],
)
def test_part_size(db_size: int | None, max_parts: int, expected: int) -> None:
    assert part_size_for(db_size, max_parts) == expected


def test_key_format() -> None:
    now = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    assert backup_key(17, now) == "_reshard_catalog_backups/op-17-20260304T050607Z.dump"
    other_zone = now.astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert backup_key(17, other_zone) == backup_key(17, now)


def fake_dirs(tmp_path: Path, majors: list[str]) -> str:
    dirs = []
    for version in majors:
        d = tmp_path / f"pg{version}" / "bin"
        d.mkdir(parents=True)
        script = d / "pg_dump"
        script.write_text(f'#!/bin/sh\necho "pg_dump (PostgreSQL) {version}"\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        dirs.append(str(d))
    return ":".join(dirs)


@pytest.mark.parametrize(
    ("have", "server", "chosen"),
    [
        (["15.20", "18.6"], 15, 15),  # same major
        (["15.20", "18.6"], 18, 18),
        (["15.20", "18.6"], 16, 18),  # newest ≥ it
        (["15.20", "16.4", "17.2"], 14, 17),  # newest ≥ it, not the nearest
        (["15.20"], 15, 15),
    ],
)
def test_client_selection(tmp_path: Path, have: list[str], server: int, chosen: int) -> None:
    client = clients.choose_client(server, fake_dirs(tmp_path, have))
    assert client.major == chosen
    assert client.pg_dump.endswith(
        f"pg{have[[v.split('.')[0] for v in have].index(str(chosen))]}/bin/pg_dump"
    )
    assert client.pg_restore == os.path.join(os.path.dirname(client.pg_dump), "pg_restore")


@pytest.mark.parametrize(
    ("have", "server", "message"),
    [
        (["15.20"], 18, "no pg_dump for PostgreSQL 18 (have: 15)"),
        (["15.20", "16.4"], 17, "no pg_dump for PostgreSQL 17 (have: 15, 16)"),
        ([], 15, "no pg_dump for PostgreSQL 15 (have: none)"),
    ],
)
def test_no_client(tmp_path: Path, have: list[str], server: int, message: str) -> None:
    dirs = fake_dirs(tmp_path, have) or str(tmp_path / "missing")
    with pytest.raises(clients.NoPgClient) as err:
        clients.choose_client(server, dirs)
    assert str(err.value) == message


def test_globs_and_version_cache(tmp_path: Path) -> None:
    fake_dirs(tmp_path, ["15.20", "18.6"])
    counter = tmp_path / "calls"
    for d in (tmp_path / "pg15.20" / "bin", tmp_path / "pg18.6" / "bin"):
        script = d / "pg_dump"
        version = d.parent.name[2:]
        script.write_text(
            f'#!/bin/sh\necho x >> {counter}\necho "pg_dump (PostgreSQL) {version} (Debian)"\n'
        )
    spec = f"{tmp_path}/pg*/bin:{tmp_path}/nowhere"
    majors = [c.major for c in clients.available_clients(spec)]
    assert majors == [18, 15]
    clients.available_clients(spec)
    clients.choose_client(15, spec)
    assert counter.read_text().count("x") == 2  # one --version per directory per process


def test_debian_default_dir_is_found() -> None:
    client = clients.choose_client(15, "/usr/lib/postgresql/*/bin")
    assert client.major == 15
    assert client.pg_dump == "/usr/lib/postgresql/15/bin/pg_dump"


def test_no_client_fails_the_backup_before_any_upload(
    moto_s3: MotoS3, hooks: RecordingHooks, tmp_path: Path
) -> None:
    from reshard.engines.backup import SourceFacts

    with pytest.raises(BackupError, match=r"no pg_dump for PostgreSQL 18 \(have: 15\)"):
        run_backup(
            60,
            BackupSource("127.0.0.1", 5433, "d", "u", "require", "pw"),
            BackupDestination(moto_s3.bucket),
            hooks,
            facts=SourceFacts(18, 1000),
            pg_bin_dirs=fake_dirs(tmp_path, ["15.20"]),
        )
    assert hooks.processes == []
    assert moto_s3.open_uploads() == []


def test_assume_role_names_the_session_and_refreshes(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto_s3.endpoint_url)
    role = "arn:aws:iam::123456789012:role/duckgres-data"
    s3 = S3(role_arn=role, session_name="duckgres-reshard-op-7")
    creds = s3.client._request_signer._credentials
    assert creds.method == "sts-assume-role"
    first = creds.get_frozen_credentials()
    assert first.access_key != "testing"
    assert first.token
    who = s3._session.client(
        "sts", endpoint_url=moto_s3.endpoint_url, region_name="us-east-1"
    ).get_caller_identity()
    assert who["Arn"].endswith("assumed-role/duckgres-data/duckgres-reshard-op-7")
    # Still usable for S3 with the assumed credentials.
    assert s3.head_size(moto_s3.bucket, "nothing-here") is None
    # Near expiry: botocore refreshes through AssumeRole before the next call signs.
    creds._expiry_time = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
    second = creds.get_frozen_credentials()
    assert second.access_key != first.access_key


def test_assume_role_failure_fails_fast_before_pg_dump(
    moto_s3: MotoS3, hooks: RecordingHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:1")
    started = time.monotonic()
    with pytest.raises(BackupError, match=r"^S3 credentials for the backup: STS AssumeRole of"):
        run_backup(
            61,
            BackupSource("127.0.0.1", 5433, "d", "u", "require", "pw"),
            BackupDestination(moto_s3.bucket, role_arn="arn:aws:iam::123456789012:role/x"),
            hooks,
        )
    assert time.monotonic() - started < 30
    assert hooks.processes == []


def test_abort_of_an_unknown_upload_is_not_an_error(moto_s3: MotoS3) -> None:
    """Real S3/RGW answer NoSuchUpload (404); an already-aborted upload counts as aborted.
    (moto answers 500 here, which botocore retries and then raises: not relied upon.)"""
    upload = moto_s3.s3.create_multipart_upload(moto_s3.bucket, "_reshard_catalog_backups/x")
    moto_s3.s3.abort_multipart_upload(moto_s3.bucket, "_reshard_catalog_backups/x", upload)
    assert moto_s3.open_uploads() == []
    with pytest.raises(S3Error):
        S3(endpoint_url="http://127.0.0.1:1").head_size("b", "k")


def test_s3_error_text_has_no_credentials(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "super-secret-key-value")
    with pytest.raises(S3Error) as err:
        S3().create_multipart_upload("no-such-bucket-xyz", "k")
    assert "super-secret-key-value" not in str(err.value)
    assert "NoSuchBucket" in str(err.value)


def test_direction_gate_texts() -> None:
    err = BackupError("pg_dump produced an empty archive — refusing to record a useless backup")
    assert gated_failure(err, mandatory=True) == (
        "pre-flip catalog backup is mandatory for the destructive cnpg→external direction: "
        "pg_dump produced an empty archive — refusing to record a useless backup"
    )
    assert gated_failure(err, mandatory=False).endswith(" — continuing without a backup")


def test_result_log_lines() -> None:
    result = BackupResult(
        "s3://b/k", 1234, "k", 16 * MIB, 1, "aws s3api get-object --bucket b --key k x",
        restore_prerequisites="PGUSER and PGPASSWORD of a login with CREATEDB on h:5432",
        sha256="ab" * 32, version_id="v1",
    )  # fmt: skip
    assert result.log_lines() == [
        f"catalog backup complete: s3://b/k (1234 bytes, sha256 {'ab' * 32}, version v1)",
        "to restore it, start a restore operation (checked, fenced, rolled back on failure): "
        "duckgres restore start <org> --backup k --to-shard <store> (docs/restore.md); by "
        "hand, the line below",
        "restore command (needs PGUSER and PGPASSWORD of a login with CREATEDB on h:5432): "
        "aws s3api get-object --bucket b --key k x",
    ]


def test_missing_ambient_credentials_fail_cleanly(
    moto_s3: MotoS3,
    hooks: RecordingHooks,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tenant_catalog: Any,
) -> None:
    """Without a role ARN the client is built while pg_dump starts: a missing credential
    stops the backup with the credentials error, pg_dump killed and reaped."""
    from tests.fixtures.backup import catalog_source, pid_gone

    catalog = tenant_catalog()
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(BackupError, match=r"^S3 credentials for the backup: no AWS credentials"):
        run_backup(62, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)
    assert all(pid_gone(p) for p in hooks.processes)
