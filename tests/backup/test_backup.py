"""The streamed catalog backup against a real PostgreSQL source and a moto S3 server over HTTP
(spec reshard §4.10; safeguards 1, 11, 36, 37, 39)."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

from reshard.engines import backup as backup_mod
from reshard.engines import clients
from reshard.engines.backup import (
    EMPTY_ARCHIVE,
    KEY_PREFIX,
    BackupDestination,
    BackupError,
    SourceFacts,
    run_backup,
)
from reshard.engines.restore import command
from reshard.engines.restore.command import RestoreTarget
from tests.fixtures.backup import (
    PG15_BIN,
    MotoS3,
    add_blob_table,
    assert_nothing_left,
    catalog_source,
    restore_into_scratch,
)
from tests.fixtures.hooks import RecordingHooks

KEY_RE = re.compile(r"^_reshard_catalog_backups/op-(\d+)-\d{8}T\d{6}Z\.dump$")


@pytest.mark.safeguard("reshard-11")
@pytest.mark.safeguard("reshard-39")
def test_success_restorable_untagged_no_password_in_argv(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tenant_catalog(rows=50)
    spawned: list[tuple[list[str], dict[str, str]]] = []
    real_popen = subprocess.Popen

    def recording_popen(argv: Any, *args: Any, **kwargs: Any) -> Any:
        spawned.append((list(argv), dict(kwargs.get("env") or {})))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    result = run_backup(
        41, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks, mandatory=True
    )

    # The object: right key, size = bytes produced, a custom-format archive.
    match = KEY_RE.match(result.key)
    assert match, result.key
    assert match[1] == "41"
    assert result.uri == f"s3://{moto_s3.bucket}/{result.key}"
    assert moto_s3.keys() == [result.key]
    body = moto_s3.get(result.key)
    assert len(body) == result.bytes > 0
    assert body.startswith(b"PGDMP")
    assert result.part_size == 16 * 1024 * 1024
    assert result.parts == 1
    assert moto_s3.open_uploads() == []

    # Restorable with stock pg_restore into a scratch database: identical row counts.
    assert restore_into_scratch(catalog.cluster, body) == catalog.row_counts()

    # pg_dump argv exactly per spec, no password anywhere in it; the password only in env.
    # (What the product passed to exec, and what /proc shows when the child was still alive.)
    dumps = [
        (a, e)
        for a, e in spawned
        if a[0].endswith("/pg_dump") and "--version" not in a and "--schema-only" not in a
    ]
    assert len(dumps) == 1
    assert len(hooks.processes) == 1
    argv, env = dumps[0]
    if hooks.cmdlines[0]:
        assert hooks.cmdlines[0] == argv
        assert hooks.environs[0]["PGPASSWORD"] == catalog.password
    # Every connection parameter in one conninfo (--dbname; safeguard reshard-65), a bounded
    # lock wait (reshard-67); the env is minimal (reshard-70) and carries only the password.
    # The compression is DUCKGRES_RESHARD_BACKUP_COMPRESSION's (default gzip:1).
    assert argv[1:6] == ["--format=custom", "--compress=1", "--no-owner", "--schema=public",
                         "--lock-wait-timeout=900000"]  # fmt: skip
    assert len(argv) == 7
    assert argv[6].startswith("--dbname=")
    params = conninfo_to_dict(argv[6].removeprefix("--dbname="))
    assert params == {
        "host": catalog.cluster.host,
        "port": str(catalog.cluster.port),
        "user": catalog.role,
        "dbname": catalog.database,
        "connect_timeout": "10",
        "application_name": "duckgres-reshard-op-41-pg_dump",
        "sslmode": catalog.cluster.sslmode,
        **({"sslrootcert": settings.DUCKGRES_STORE_SSLROOTCERT}
           if settings.DUCKGRES_STORE_SSLROOTCERT else {}),
        "channel_binding": "require",  # pg_dump 15 refuses cleartext through it (reshard-123)
        # Dead-peer detection as on every store connection (reshard-127).
        "keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
        "keepalives_count": "3", "tcp_user_timeout": "60000",
    }  # fmt: skip
    assert os.path.basename(argv[0]) == "pg_dump"
    assert not any(catalog.password in a for a in argv)
    assert env["PGPASSWORD"] == catalog.password
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "PGPASSWORD"}
    assert catalog.password not in hooks.text()
    assert catalog.password not in result.restore_command

    # No tagging on any request the product sent (safeguard 11), content type set on create.
    assert moto_s3.requests
    for req in moto_s3.requests:
        lowered = {k.lower(): v for k, v in req["headers"].items()}
        assert "x-amz-tagging" not in lowered, req
        assert "tagging" not in req["url"].split("?", 1)[-1].lower(), req
    creates = [r for r in moto_s3.requests if r["method"] == "POST" and "uploads" in r["url"]]
    assert len(creates) == 1
    head = moto_s3.s3.client.head_object(Bucket=moto_s3.bucket, Key=result.key)
    assert head["ContentType"] == "application/octet-stream"

    # The announcement, the restore command: a new database on the source server as the
    # operator's login (safeguard reshard-71), the majors that work, no user or password.
    text = hooks.text()
    assert "may take several minutes — size unknown until complete" in text
    assert "HARD prerequisite for the destructive cnpg→external direction" in text
    server = f"host={catalog.cluster.host} port={catalog.cluster.port}"
    restored = f"{catalog.database}_restored_op41"
    bucket, _, key = result.uri.removeprefix("s3://").partition("/")
    owner = command.restore_owner_role(restored)
    mode = catalog.cluster.sslmode or "verify-full"
    script = (
        "\\getenv pw DUCKGRES_RESTORE_PASSWORD\n"
        f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION '
        "NOBYPASSRLS PASSWORD :'pw';\n"
        f'GRANT "{owner}" TO CURRENT_USER;\n'
        f'CREATE DATABASE "{restored}" OWNER "{owner}" TEMPLATE template0;\n'
        f'REVOKE ALL ON DATABASE "{restored}" FROM PUBLIC;'
    )
    assert result.restore_command == (
        f"aws s3api get-object --bucket {bucket} --key {key} --endpoint-url "
        f"{moto_s3.endpoint_url} --region us-east-1 ./catalog.dump >/dev/null && "
        f"printf '%s  %s\\n' {result.sha256} ./catalog.dump | sha256sum --check --strict - && "
        'export DUCKGRES_RESTORE_PASSWORD="$(openssl rand -hex 24)" && '
        f"printf '%s\\n' {shlex.quote(script)} | psql --no-psqlrc -v ON_ERROR_STOP=1 "
        f"'--dbname={server} dbname=postgres sslmode={mode}' --file=- && "
        f'PGUSER={owner} PGPASSWORD="$DUCKGRES_RESTORE_PASSWORD" '
        "pg_restore --no-owner --no-acl --clean --if-exists --exit-on-error --format=custom "
        f"'--dbname={server} dbname={restored} sslmode={mode}' ./catalog.dump"
    )
    assert result.restore_prerequisites == (
        "PGUSER and PGPASSWORD of a login with CREATEDB and CREATEROLE on "
        f"{catalog.cluster.host}:{catalog.cluster.port}; "
        + ("PGSSLROOTCERT = the CA file of that server; " if mode != "require" else "")
        + "AWS credentials with s3:GetObject (and s3:GetObjectVersion) on the backup; "
        "psql and pg_restore of PostgreSQL 15 to 16, sha256sum and openssl on PATH"
    )
    assert result.log_lines()[2] == (
        f"restore command (needs {result.restore_prerequisites}): {result.restore_command}"
    )
    assert all(proc.returncode == 0 for proc in hooks.processes)
    assert hooks.unregistered == hooks.processes


@pytest.mark.safeguard("reshard-37")
def test_restore_command_honours_a_non_default_port(moto_s3: MotoS3) -> None:
    target = RestoreTarget("db.example.com", 6543, "catalog_a_restored_op3")
    cmd = command.restore_command(
        command.Recorded("b", "k.dump", "0" * 64), target, 15, server_major=15
    )
    for dbname in ("postgres", "catalog_a_restored_op3"):
        assert (
            f"'--dbname=host=db.example.com port=6543 dbname={dbname} sslmode=verify-full'" in cmd
        )
    assert "--endpoint-url" not in cmd
    assert "--region" not in cmd
    # The only password is the one the line makes, by reference: none is printed.
    assert cmd.count("PGPASSWORD") == 1
    assert 'PGPASSWORD="$DUCKGRES_RESTORE_PASSWORD"' in cmd
    needs = command.restore_prerequisites(target, 15, server_major=15)
    assert "CREATEDB and CREATEROLE on db.example.com:6543;" in needs
    assert "PGSSLROOTCERT" in needs  # verify-full (the default) needs the CA


def test_cnpg_source_adds_role(tenant_catalog: Any) -> None:
    catalog = tenant_catalog()
    source = clients.BackupSource(
        host="h", port=5433, database=catalog.database, user="provisioner", sslmode="require",
        password="pw-secret", role=catalog.role,
    )  # fmt: skip
    client = clients.choose_client(15, PG15_BIN)
    argv = backup_mod.pg_dump_argv(client, source)
    assert argv[-1] == f"--role={catalog.role}"
    assert "pw-secret" not in " ".join(argv)


@pytest.mark.safeguard("reshard-1")
@pytest.mark.safeguard("reshard-36")
def test_multi_part_memory_bound_and_progress(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tenant_catalog()
    add_blob_table(catalog, 24)
    monkeypatch.setattr(backup_mod, "PROGRESS_INTERVAL_SECONDS", 0.0)
    part = 5 * 1024 * 1024  # S3's smallest non-last part
    result = run_backup(
        42, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks, part_size=part
    )
    assert result.parts >= 5
    assert result.bytes == len(moto_s3.get(result.key))
    assert 0 < result.peak_buffered_bytes <= 3 * part
    assert moto_s3.open_uploads() == []
    assert hooks.progress_calls
    last = hooks.progress_calls[-1][1]
    assert set(last) == {"bytes_dumped", "backup_parts"}
    assert last["bytes_dumped"] <= result.bytes


def test_progress_at_most_every_two_seconds(
    moto_s3: MotoS3, tenant_catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []

    class Hooks(RecordingHooks):
        def progress(self, values: Mapping[str, int]) -> None:
            calls.append(time.monotonic())

    catalog = tenant_catalog()
    add_blob_table(catalog, 12)
    run_backup(
        43, catalog_source(catalog), BackupDestination(moto_s3.bucket), Hooks(),
        part_size=5 * 1024 * 1024,
    )  # fmt: skip
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(calls))


@pytest.mark.safeguard("reshard-36")
def test_max_parts_aborts_before_part_m_plus_1(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    catalog = tenant_catalog()
    add_blob_table(catalog, 2)
    with pytest.raises(BackupError, match=r"^backup exceeded 5 parts of 0\.06 MiB$"):
        run_backup(
            44, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks,
            max_parts=5, part_size=64 * 1024,
        )  # fmt: skip
    uploads = [r for r in moto_s3.requests if r["method"] == "PUT" and "partNumber" in r["url"]]
    numbers = {int(re.search(r"partNumber=(\d+)", r["url"])[1]) for r in uploads}  # type: ignore[index]
    # Part 6 is never sent; part 5 may be skipped when the abort wins the race (no point).
    assert numbers <= {1, 2, 3, 4, 5}
    assert {1, 2, 3} <= numbers
    assert_nothing_left(moto_s3, hooks)


@pytest.mark.safeguard("reshard-36")
def test_max_parts_from_settings(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, settings: Any
) -> None:
    settings.DUCKGRES_RESHARD_MAX_PARTS = 5
    catalog = tenant_catalog()
    add_blob_table(catalog, 2)
    with pytest.raises(BackupError, match="backup exceeded 5 parts"):
        run_backup(
            45, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks,
            part_size=64 * 1024,
        )  # fmt: skip
    assert_nothing_left(moto_s3, hooks)


@pytest.mark.safeguard("reshard-36")
def test_dropped_bytes_are_caught_by_the_size_check(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lossy hop between the runner and S3: every part body loses its last 100 bytes."""

    def truncate(request: Any, **_: Any) -> None:
        if request.method == "PUT" and "partNumber=" in request.url:
            body = request.body
            data = body.read() if hasattr(body, "read") else bytes(body)
            request.body = data[:-100]
            request.headers["Content-Length"] = str(len(data) - 100)

    from duckgres_admin.lib.s3 import S3

    original_init = S3.__init__

    def init(self: S3, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.client.meta.events.register_last("before-send.s3.UploadPart", truncate)

    monkeypatch.setattr(S3, "__init__", init)
    catalog = tenant_catalog(rows=20)
    with pytest.raises(BackupError) as err:
        run_backup(46, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)
    assert re.fullmatch(
        r"uploaded backup size (\d+) does not match the (\d+) bytes pg_dump produced",
        str(err.value),
    )
    stored, produced = map(int, re.findall(r"\d+", str(err.value)))
    assert stored == produced - 100
    deletes = [r for r in moto_s3.requests if r["method"] == "DELETE"]
    assert deletes, "the mismatching object must be deleted"
    assert_nothing_left(moto_s3, hooks)


def test_pg_dump_nonzero_exit_leaves_nothing(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    catalog = tenant_catalog()
    source = catalog_source(catalog, database="no_such_database_here")
    with pytest.raises(BackupError) as err:
        run_backup(
            47, source, BackupDestination(moto_s3.bucket), hooks,
            facts=SourceFacts(server_major=15, db_size=None),
        )  # fmt: skip
    text = str(err.value)
    assert "failed with exit status 1" in text
    assert source.redacted() in text
    assert 'database "no_such_database_here" does not exist' in text
    assert catalog.password not in text
    assert any("size unreadable" in m for _, m in hooks.logs)
    assert_nothing_left(moto_s3, hooks)


def _fake_bin(tmp_path: Path, script: str, version: str = "15.99") -> str:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("pg_dump", "pg_restore"):
        path = bin_dir / name
        path.write_text(
            "#!/bin/sh\n"
            f'if [ "$1" = "--version" ]; then echo "{name} (PostgreSQL) {version}"; exit 0; fi\n'
            + script
        )
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


def test_empty_archive_leaves_nothing(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, tmp_path: Path, settings: Any
) -> None:
    settings.DUCKGRES_PG_BIN_DIRS = _fake_bin(tmp_path, "exit 0\n")
    catalog = tenant_catalog()
    with pytest.raises(BackupError) as err:
        run_backup(48, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)
    assert str(err.value) == EMPTY_ARCHIVE
    assert_nothing_left(moto_s3, hooks)


def test_nonzero_exit_after_several_parts_leaves_nothing(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, tmp_path: Path
) -> None:
    """Parts already uploaded when pg_dump fails: the upload is aborted, not completed."""
    bins = _fake_bin(
        tmp_path,
        # The sleep lets the parts' uploads start first (on a loaded machine the S3 client and
        # the upload id can take longer than the 12 MB of output).
        "head -c 12000000 /dev/urandom\nsleep 5\necho 'pg_dump: error: connection lost' >&2\n"
        "exit 3\n",
    )
    catalog = tenant_catalog()
    with pytest.raises(BackupError, match=r"exit status 3: pg_dump: error: connection lost"):
        run_backup(
            49, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks,
            part_size=5 * 1024 * 1024, pg_bin_dirs=bins,
        )  # fmt: skip
    assert any(r["method"] == "PUT" for r in moto_s3.requests)
    assert any(r["method"] == "DELETE" for r in moto_s3.requests)  # the abort
    assert_nothing_left(moto_s3, hooks)


def test_upload_error_aborts_and_kills_pg_dump(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """S3 rejects part 2 while pg_dump still has output: abort, kill, reap, clear error."""
    bins = _fake_bin(tmp_path, "exec cat /dev/urandom\n")  # never ends on its own

    from duckgres_admin.lib.s3 import S3, S3Error

    original = S3.upload_part

    def failing(self: S3, bucket: str, key: str, upload_id: str, number: int, body: Any) -> Any:
        if number == 2:
            raise S3Error("upload part 2: AccessDenied (HTTP 403): Access Denied", "AccessDenied")
        return original(self, bucket, key, upload_id, number, body)

    monkeypatch.setattr(S3, "upload_part", failing)
    catalog = tenant_catalog()
    started = time.monotonic()
    with pytest.raises(BackupError) as err:
        run_backup(
            50, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks,
            part_size=5 * 1024 * 1024, pg_bin_dirs=bins,
        )  # fmt: skip
    assert str(err.value).startswith(f"upload backup to s3://{moto_s3.bucket}/{KEY_PREFIX}op-50-")
    assert "AccessDenied" in str(err.value)
    assert time.monotonic() - started < 30
    assert hooks.processes[0].returncode == -9
    assert_nothing_left(moto_s3, hooks)


def test_stop_kills_a_stalled_pg_dump_promptly(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, tmp_path: Path
) -> None:
    """Fencing/SIGTERM while pg_dump produces nothing (e.g. waiting on a lock)."""
    bins = _fake_bin(tmp_path, "printf PGDMP\nexec sleep 600\n")
    catalog = tenant_catalog()
    import threading

    threading.Timer(1.0, hooks.stop.set).start()
    started = time.monotonic()
    with pytest.raises(BackupError, match="interrupted: the runner is stopping"):
        run_backup(
            51, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks,
            pg_bin_dirs=bins,
        )  # fmt: skip
    assert time.monotonic() - started < 10
    assert_nothing_left(moto_s3, hooks)
    # Its own session: no controlling terminal, so libpq can never block on a /dev/tty prompt.
    assert hooks.sids == [hooks.processes[0].pid]


def test_no_bucket_is_an_error(hooks: RecordingHooks) -> None:
    with pytest.raises(BackupError, match="no data bucket"):
        run_backup(
            52,
            clients.BackupSource("h", 5432, "d", "u", "require", "pw"),
            BackupDestination(""),
            hooks,
        )
    assert hooks.processes == []


def test_leftover_upload_of_an_earlier_attempt_is_aborted(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    """A runner killed mid-backup leaves an open upload; the takeover's backup aborts it."""
    stale_key = f"{KEY_PREFIX}op-53-20260101T000000Z.dump"
    moto_s3.s3.create_multipart_upload(moto_s3.bucket, stale_key)
    other = moto_s3.s3.create_multipart_upload(moto_s3.bucket, f"{KEY_PREFIX}op-530-x.dump")
    catalog = tenant_catalog()
    result = run_backup(53, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)
    assert moto_s3.open_uploads() == [(f"{KEY_PREFIX}op-530-x.dump", other)]
    assert moto_s3.keys() == [result.key]
    assert any("earlier attempt" in m for _, m in hooks.logs)


def test_connection_refused_source_fails_before_pg_dump(
    moto_s3: MotoS3, hooks: RecordingHooks
) -> None:
    source = clients.BackupSource("127.0.0.1", 1, "d", "u", "require", "secret-pw-123")
    with pytest.raises(BackupError, match="cannot read the server version") as err:
        run_backup(54, source, BackupDestination(moto_s3.bucket), hooks)
    assert "secret-pw-123" not in str(err.value)
    assert hooks.processes == []
    assert moto_s3.open_uploads() == []


def test_psycopg_is_what_reads_facts(tenant_catalog: Any) -> None:
    catalog = tenant_catalog()
    facts = backup_mod.read_source_facts(catalog_source(catalog))
    assert facts.server_major == 15
    assert facts.db_size is not None
    assert facts.db_size > 1_000_000
    assert isinstance(psycopg.__version__, str)


def test_cleanup_of_earlier_uploads_is_best_effort(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without s3:ListBucketMultipartUploads the backup still runs (a warning is logged)."""
    from duckgres_admin.lib.s3 import S3, S3Error

    def denied(self: S3, bucket: str, prefix: str = "") -> list[tuple[str, str]]:
        raise S3Error("list multipart uploads: AccessDenied (HTTP 403)", "AccessDenied")

    monkeypatch.setattr(S3, "list_multipart_uploads", denied)
    catalog = tenant_catalog()
    result = run_backup(55, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)
    assert result.bytes > 0
    assert ("warn", "could not clean up earlier backup uploads of this operation: "
            "list multipart uploads: AccessDenied (HTTP 403)") in hooks.logs  # fmt: skip


def test_stale_cleanup_never_aborts_the_running_attempt(moto_s3: MotoS3) -> None:
    mine = f"{KEY_PREFIX}op-56-20260101T000001Z.dump"
    old = f"{KEY_PREFIX}op-56-20260101T000000Z.dump"
    own_upload = moto_s3.s3.create_multipart_upload(moto_s3.bucket, mine)
    moto_s3.s3.create_multipart_upload(moto_s3.bucket, old)
    logs = RecordingHooks()
    assert backup_mod.abort_stale_uploads(moto_s3.s3, moto_s3.bucket, 56, logs, skip_key=mine) == 1
    assert moto_s3.open_uploads() == [(mine, own_upload)]
    moto_s3.s3.abort_multipart_upload(moto_s3.bucket, mine, own_upload)
