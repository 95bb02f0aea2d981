"""The DuckLake-shaped catalog generator and ``manage.py make_demo_catalog``."""

from __future__ import annotations

import io
import secrets
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from psycopg import sql

from reshard.engines.demo_catalog import SCHEMA_DDL
from tests.fixtures.stores import StoreClusters, drop_tenant

DUCKLAKE_TABLES = {
    "ducklake_metadata", "ducklake_snapshot", "ducklake_snapshot_changes", "ducklake_schema",
    "ducklake_table", "ducklake_view", "ducklake_tag", "ducklake_column_tag",
    "ducklake_data_file", "ducklake_file_column_stats", "ducklake_delete_file",
    "ducklake_column", "ducklake_table_stats", "ducklake_table_column_stats",
    "ducklake_partition_info", "ducklake_partition_column", "ducklake_file_partition_value",
    "ducklake_files_scheduled_for_deletion", "ducklake_inlined_data_tables",
    "ducklake_column_mapping", "ducklake_name_mapping", "ducklake_schema_versions",
}  # fmt: skip


@pytest.fixture
def owner(store_clusters: StoreClusters) -> Any:
    name = f"demo_{secrets.token_hex(4)}"
    with store_clusters.source.superuser_conn() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield name
    drop_tenant(store_clusters.source, name)


def test_make_demo_catalog_builds_an_awkward_ducklake_catalog(
    store_clusters: StoreClusters, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "unused-with-trust")
    out = io.StringIO()
    call_command(
        "make_demo_catalog",
        "--host", "127.0.0.1", "--port", "5433", "--dbname", owner, "--user", "postgres",
        "--sslmode", "require", "--tables", "40", "--create-db", "--owner", owner,
        stdout=out,
    )  # fmt: skip
    assert out.getvalue().startswith(f"demo catalog {owner} on 127.0.0.1:5433: 40 DuckLake tables")
    with store_clusters.source.superuser_conn(owner) as conn:
        tables = {
            str(r[0]): str(r[1])
            for r in conn.execute(
                "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'"
            )
        }
        inlined = {t for t in tables if t.startswith("ducklake_inlined_data_") and t[-1].isdigit()}
        assert set(tables) - inlined == DUCKLAKE_TABLES
        assert len(inlined) == 4  # every 10th of 40
        assert set(tables.values()) == {owner}
        indexes = {
            str(r[0])
            for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
        }
        assert {"idx_ducklake_column_tbl_snap", "ducklake_snapshot_pkey"} <= indexes

        def one(query: str) -> Any:
            row = conn.execute(query).fetchone()
            assert row is not None
            return row[0]

        assert one("SELECT count(*) FROM ducklake_table") == 40
        assert one("SELECT max(snapshot_id) FROM ducklake_snapshot") == 80
        assert one("SELECT count(*) FROM ducklake_data_file WHERE encryption_key IS NULL") > 0
        assert one("SELECT count(*) FROM ducklake_table WHERE table_name LIKE '表%'") > 0
        name = sorted(inlined)[0]
        q = sql.Identifier(name).as_string(conn)
        assert one(f"SELECT max(octet_length(note)) FROM {q}") > 4000  # wide, TOASTed
        assert one(f"SELECT count(*) FROM {q} WHERE payload IS NULL") > 0
        # bytea carrying every byte value 0..255
        assert one(
            f"SELECT count(DISTINCT get_byte(payload, i)) FROM {q}, "
            "generate_series(16, 271) i WHERE payload IS NOT NULL"
        ) == 256  # fmt: skip
        assert one("SELECT count(*) FROM ducklake_inlined_data_tables") == 4

    with pytest.raises(CommandError, match="already holds ducklake_"):
        call_command(
            "make_demo_catalog", "--port", "5433", "--dbname", owner, "--user", "postgres",
            "--tables", "1", stdout=io.StringIO(),
        )  # fmt: skip


def test_the_password_is_never_an_argument() -> None:
    from duckgres_admin.management.commands.make_demo_catalog import Command

    parser = Command().create_parser("manage.py", "make_demo_catalog")
    options = {opt for action in parser._actions for opt in action.option_strings}
    assert not {o for o in options if "pass" in o.lower()}
    assert all("PASSWORD" not in ddl for ddl in SCHEMA_DDL)
