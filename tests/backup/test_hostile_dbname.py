"""A database name is never parsed as connection settings (safeguard reshard-65).

``pg_dump --dbname=<name>`` treats a name containing ``=`` as a conninfo string: a catalog named
``dbname=postgres host=127.0.0.1 port=<p> sslmode=disable`` sent ``pg_dump`` (and the password in
its environment) to another server, in clear. The dump now gets every parameter in one conninfo
built with ``make_conninfo``, where the name is only a quoted value; the restore command names
it the same way. A real database with such a name is created on 5433; a ``PgWireStub`` listens
where the name points and must see nothing.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from reshard.engines.backup import BackupDestination, run_backup
from reshard.engines.clients import BackupSource
from reshard.engines.restore.command import restored_database_name
from tests.fixtures.backup import MotoS3, restore_into_scratch
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.store_tls import PgWireStub
from tests.fixtures.stores import DUCKLAKE_DDL, _populate

pytestmark = pytest.mark.safeguard("reshard-65")


def _hostile_catalog(catalog: Any, name: str, rows: int) -> None:
    """A database literally named ``name`` (quoted identifier) owned by the tenant, with the
    fixture's ducklake tables; dropped with the tenant after the test."""
    cluster = catalog.cluster
    with cluster.superuser_conn() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(catalog.role)
            )
        )
    with cluster.superuser_conn(name) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(catalog.role)))
        for ddl in DUCKLAKE_DDL:
            conn.execute(ddl)
        _populate(conn, rows)


def _counts(cluster: Any, database: str) -> dict[str, int]:
    with cluster.superuser_conn(database) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]
        out = {}
        for name in names:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(name))
            ).fetchone()
            assert row is not None
            out[name] = int(row[0])
    return out


def test_a_database_named_like_connection_settings_is_dumped_from_itself(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any
) -> None:
    catalog = tenant_catalog(rows=2)  # the tenant's own catalog holds 2 rows per main table
    with PgWireStub() as elsewhere:
        name = f"dbname=postgres host=127.0.0.1 port={elsewhere.port} sslmode=disable"
        _hostile_catalog(catalog, name, rows=7)
        source = BackupSource(
            host=catalog.cluster.host, port=catalog.cluster.port, database=name,
            user=catalog.role, sslmode=catalog.cluster.sslmode, password=catalog.password,
        )  # fmt: skip
        result = run_backup(61, source, BackupDestination(moto_s3.bucket), hooks)
        # Nothing connected to where the name points (no startup, no password: no packet).
        assert elsewhere.connections == 0
        assert elsewhere.passwords == []
    # The dump is the hostile-named database's (7 rows), not postgres' or the tenant's (2).
    restored = restore_into_scratch(catalog.cluster, moto_s3.get(result.key))
    assert restored == _counts(catalog.cluster, name)
    assert restored["ducklake_data_file"] == 7
    # The restore command names the database it creates (after the hostile name) as one
    # quoted conninfo value too, and its psql connects to postgres on the same server.
    words = shlex.split(result.restore_command)
    dbname = [w for w in words if w.startswith("--dbname=")]
    assert len(dbname) == 2
    new_db = restored_database_name(name, 61)  # shortened to PostgreSQL's 63 bytes
    assert len(new_db.encode()) <= 63
    for word, expected in zip(dbname, ("postgres", new_db), strict=True):
        params = conninfo_to_dict(word.removeprefix("--dbname="))
        assert params["dbname"] == expected
        assert (params["host"], params["port"]) == (
            catalog.cluster.host, str(catalog.cluster.port),
        )  # fmt: skip
        assert params["sslmode"] == catalog.cluster.sslmode
    assert catalog.password not in result.restore_command
