"""Hostile names in what the runner writes and spawns (safeguard reshard-70).

- The restore command in the op log is quoted for a POSIX shell, every part: a bucket, key,
  endpoint, region, host or database name carrying ``$(…)``, backticks, ``;`` or quotes is one
  argument when the operator pastes the command (run here by ``bash`` with recording stand-ins
  for ``aws``, ``psql`` and ``pg_restore``), and the database it creates is one SQL identifier
  (run by a real ``psql`` against a real server).
- ``pg_dump`` gets a minimal environment (``PATH``, the locale, ``PGPASSWORD``): none of the
  runner's secrets, and no ``PG*`` variable that could redirect or reconfigure it.
- Exception tracebacks written to the op log pass the per-op scrubber as rendered text, and
  uncaught exceptions of any thread are reported the same way instead of raw on stderr.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.models import ReshardLogEntry
from reshard.engines.backup import BackupDestination, run_backup
from reshard.engines.restore.command import (
    Recorded,
    RestoreTarget,
    restore_command,
    restore_owner_role,
)
from reshard.operation import oplog as direct_oplog
from reshard.runner.logwriter import OpLogWriter
from tests.fixtures.backup import MotoS3, catalog_source
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.rows import new_op, new_warehouse

pytestmark = pytest.mark.safeguard("reshard-69")

MARK = "pwned"


def _recorder(path: Path, log: Path) -> None:
    path.write_text(
        "#!/bin/sh\n"
        f'for a in "$0" "$@"; do printf "%s\\0" "$a"; done >> {shlex.quote(str(log))}\n'
        f'printf "\\n" >> {shlex.quote(str(log))}\n'
    )
    path.chmod(0o755)


def test_the_restore_command_quotes_every_part_for_the_shell(tmp_path: Path) -> None:
    marker = tmp_path / MARK
    hostile = f"x$(touch {marker})`touch {marker}`;touch {marker}'\"; touch {marker} #"
    bins = tmp_path / "bin"
    bins.mkdir()
    calls = tmp_path / "calls"
    for tool in ("aws", "sha256sum", "openssl", "psql", "pg_restore"):
        _recorder(bins / tool, calls)
    target = RestoreTarget(f"h{hostile}", 6543, f"d{hostile}", "verify-full")
    recorded = Recorded(f"bucket{hostile}", f"key{hostile}.dump", "ab" * 32, f"v{hostile}")
    endpoint = f"http://s3.example{hostile}"
    region = f"r{hostile}"
    cmd = restore_command(recorded, target, 18, endpoint, region=region, server_major=18)
    env = {"PATH": f"{bins}:/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    runs = [line.split("\0")[:-1] for line in calls.read_text().splitlines() if line]
    assert [os.path.basename(run[0]) for run in runs] == [
        "aws", "sha256sum", "openssl", "psql", "pg_restore",
    ]  # fmt: skip
    assert runs[0][1:] == [
        "s3api", "get-object", "--bucket", recorded.bucket, "--key", recorded.key,
        "--version-id", recorded.version_id, "--endpoint-url", endpoint, "--region", region,
        "./catalog.dump",
    ]  # fmt: skip
    assert runs[1][1:] == ["--check", "--strict", "-"]
    runs = [runs[0], runs[3], runs[4]]
    expected = {
        "host": target.host,
        "port": "6543",
        "sslmode": "verify-full",
        "require_auth": "scram-sha-256",
    }
    # psql creates the database: its name is one SQL identifier inside one argument.
    assert runs[1][1:4] == ["--no-psqlrc", "-v", "ON_ERROR_STOP=1"]
    assert conninfo_to_dict(runs[1][4].removeprefix("--dbname=")) == {
        **expected, "dbname": "postgres",
    }  # fmt: skip
    assert runs[1][5:] == ["--file=-"]  # the script comes on stdin (a real psql test below)
    assert runs[2][1:-2] == ["--no-owner", "--no-acl", "--clean", "--if-exists",
                             "--exit-on-error", "--format=custom"]  # fmt: skip
    assert runs[2][-1] == "./catalog.dump"
    assert conninfo_to_dict(runs[2][-2].removeprefix("--dbname=")) == {
        **expected, "dbname": target.database,
    }  # fmt: skip
    # No user and no password in a conninfo: the operator's login comes from PGUSER/PGPASSWORD,
    # the restore's from the password the line made (never printed).
    assert 'PGPASSWORD="$DUCKGRES_RESTORE_PASSWORD"' in cmd
    assert "user=" not in cmd


@pytest.mark.safeguard("reshard-110")
def test_a_hostile_database_name_is_one_identifier_on_a_real_server(
    store_clusters: Any, tmp_path: Path
) -> None:
    """The CREATE DATABASE of the printed command, run by a real psql against a real server,
    creates exactly the database named (quotes, ``;`` and ``$(…)`` included)."""
    cluster = store_clusters.source
    marker = tmp_path / MARK
    name = f"r\"; DROP DATABASE postgres; --$(touch {MARK})`touch {MARK}`'"  # run in tmp_path
    assert len(name.encode()) <= 63
    target = RestoreTarget(cluster.host, cluster.port, name, cluster.sslmode)
    cmd = restore_command(Recorded("b", "k.dump", "0" * 64), target, 15, server_major=15)
    create = " && ".join(cmd.split(" && ")[2:4])  # the fresh password, then psql
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PGUSER": cluster.provisioner_user,
        "PGPASSWORD": cluster.provisioner_password,
    }
    rootcert = settings.DUCKGRES_STORE_SSLROOTCERT
    if rootcert and rootcert != "system":
        env["PGSSLROOTCERT"] = rootcert
    try:
        done = subprocess.run(
            ["bash", "-c", create], cwd=tmp_path, env=env, capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert not marker.exists()
        with cluster.superuser_conn() as conn:
            found = conn.execute(
                "SELECT datname FROM pg_database WHERE datname IN (%s, 'postgres') ORDER BY 1",
                [name],
            ).fetchall()
        assert sorted(str(r[0]) for r in found) == sorted([name, "postgres"])
        with cluster.superuser_conn() as conn:
            owner = conn.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [name]
            ).fetchone()
        assert owner == (restore_owner_role(name),), "owned by the fresh role, one identifier"
    finally:
        with cluster.superuser_conn() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(
                sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(restore_owner_role(name)))
            )


def test_pg_dump_gets_a_minimal_environment(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tenant_catalog(rows=3)
    poison = {
        "DUCKGRES_CONFIG_STORE": "postgresql://admin:config-store-secret@db/admin",
        "DUCKGRES_RUNNER_SECRET": "runner-secret-that-pg-dump-must-not-see",
        "AWS_SECRET_ACCESS_KEY": "testing",  # still used by this process's S3 client
        "PGHOST": "192.0.2.1",
        "PGPORT": "1",
        "PGDATABASE": "postgres",
        "PGSERVICEFILE": "/nonexistent/pg_service.conf",
        "PGOPTIONS": "-c search_path=evil",
        "PGSSLMODE": "disable",
        "PGPASSFILE": "/nonexistent/pgpass",
    }
    for name, value in poison.items():
        monkeypatch.setenv(name, value)
    # The environment is read from /proc/<pid>/environ right after the start. A 3-row dump fits
    # in the pipe, so on a loaded machine pg_dump may already have exited (a zombie shows an
    # empty cmdline and environment): then the backup is run again, up to five times.
    for _attempt in range(5):
        result = run_backup(63, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)
        assert result.bytes > 0
        assert len(hooks.environs) == len(hooks.cmdlines) == 1
        if hooks.cmdlines[0]:
            break
        hooks = RecordingHooks()
    assert hooks.cmdlines[0], "pg_dump exited before its environment could be read, 5 times"
    env = hooks.environs[0]
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "PGPASSWORD"}
    assert env["PGPASSWORD"] == catalog.password
    assert env["PATH"] == os.environ["PATH"]


# --- tracebacks in the op log --------------------------------------------------------------------


def _entries(op_id: int) -> list[str]:
    return list(
        ReshardLogEntry.objects.filter(operation_id=op_id).order_by("id").values_list(
            "message", flat=True
        )
    )  # fmt: skip


def _failing(secret: str) -> BaseException:
    try:
        try:
            raise ValueError(f"inner cause mentions {secret}")
        except ValueError as inner:
            raise RuntimeError(f"connection to host failed with password={secret}") from inner
    except RuntimeError as exc:
        return exc


@pytest.fixture
def logged_op(transactional_db: None) -> Any:
    return new_op(new_warehouse(), source_kind="cnpg", target_kind="external")


def test_a_traceback_in_the_op_log_is_scrubbed(logged_op: Any) -> None:
    secret = "per-op-provisioner-secret-9a8b"
    writer = OpLogWriter(logged_op.id, Scrubber(secret))
    try:
        writer.exception("step copying raised", _failing(secret))
    finally:
        writer.close()
    (line,) = _entries(logged_op.id)
    assert line.startswith("step copying raised\nTraceback (most recent call last):")
    assert "RuntimeError: connection to host failed with password=***" in line
    assert "ValueError: inner cause mentions ***" in line
    assert secret not in line
    # The direct appender (API, janitor, recovery) renders and scrubs the same way.
    direct_oplog.append(
        logged_op.id, "janitor: reconcile failed", exc=_failing(secret), scrubber=Scrubber(secret)
    )
    last = _entries(logged_op.id)[-1]
    assert "Traceback (most recent call last):" in last
    assert secret not in last


def test_uncaught_exceptions_of_any_thread_are_scrubbed(
    logged_op: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = "per-op-target-secret-5c4d3e"
    writer = OpLogWriter(logged_op.id, Scrubber(secret))
    before = (sys.excepthook, threading.excepthook)
    restore = writer.install_excepthooks()
    try:
        thread = threading.Thread(target=lambda: (_ for _ in ()).throw(_failing(secret)))
        thread.start()
        thread.join()
        sys.excepthook(*_exc_info(_failing(secret)))
    finally:
        restore()
        writer.close()
    lines = _entries(logged_op.id)
    assert len(lines) == 2
    assert lines[0].startswith("uncaught exception in thread ")
    assert lines[1].startswith("uncaught exception in the runner\nTraceback")
    out, err = capfd.readouterr()
    for text in (*lines, out, err):
        assert secret not in text
    assert "password=***" in err
    assert (sys.excepthook, threading.excepthook) == before  # restored


def _exc_info(exc: BaseException) -> tuple[type[BaseException], BaseException, Any]:
    return type(exc), exc, exc.__traceback__
