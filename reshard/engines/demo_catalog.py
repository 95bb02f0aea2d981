"""A DuckLake-shaped catalog of any size, for tests, benchmarks and ``make demo`` (issue 3 item 7).

:func:`build_demo_catalog` creates the DuckLake catalog schema (the ``ducklake_*`` tables of
the DuckLake 0.3 catalog specification with their keys and the indexes DuckLake creates, such
as ``idx_ducklake_column_tbl_snap``) in the ``public`` schema of the connected database and
fills it as a DuckLake catalog holding ``tables`` DuckLake tables would look: per table a
creating and an inserting snapshot with their change records, columns, data files with
per-column statistics, table statistics, and for some tables partitions, delete files, tags,
views, name mappings and inlined data. Every ``inlined_every``-th table also gets a physical
inlined-data table ``ducklake_inlined_data_<table_id>_<schema_version>``, which is what makes
a real catalog's physical table count grow.

The content is deliberately awkward: NULLs in nullable columns, non-ASCII names and values,
``bytea`` with every byte value, and wide (TOASTed) rows.

All rows are generated server-side (``generate_series``), so even large catalogs build in
seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

# The DuckLake catalog schema (spec 0.3: https://ducklake.select/docs/stable/specification/tables/overview)
# with the keys and indexes a DuckLake-created PostgreSQL catalog carries.
SCHEMA_DDL: tuple[str, ...] = (
    """CREATE TABLE ducklake_metadata (key varchar NOT NULL, value varchar NOT NULL,
        scope varchar, scope_id bigint)""",
    """CREATE TABLE ducklake_snapshot (snapshot_id bigint PRIMARY KEY,
        snapshot_time timestamptz, schema_version bigint, next_catalog_id bigint,
        next_file_id bigint)""",
    """CREATE TABLE ducklake_snapshot_changes (snapshot_id bigint PRIMARY KEY,
        changes_made varchar, author varchar, commit_message varchar, commit_extra_info varchar)""",
    """CREATE TABLE ducklake_schema (schema_id bigint PRIMARY KEY, schema_uuid uuid,
        begin_snapshot bigint, end_snapshot bigint, schema_name varchar, path varchar,
        path_is_relative boolean)""",
    """CREATE TABLE ducklake_table (table_id bigint, table_uuid uuid, begin_snapshot bigint,
        end_snapshot bigint, schema_id bigint, table_name varchar, path varchar,
        path_is_relative boolean)""",
    """CREATE TABLE ducklake_view (view_id bigint, view_uuid uuid, begin_snapshot bigint,
        end_snapshot bigint, schema_id bigint, view_name varchar, dialect varchar, sql varchar,
        column_aliases varchar)""",
    """CREATE TABLE ducklake_tag (object_id bigint, begin_snapshot bigint, end_snapshot bigint,
        key varchar, value varchar)""",
    """CREATE TABLE ducklake_column_tag (table_id bigint, column_id bigint,
        begin_snapshot bigint, end_snapshot bigint, key varchar, value varchar)""",
    """CREATE TABLE ducklake_data_file (data_file_id bigint PRIMARY KEY, table_id bigint,
        begin_snapshot bigint, end_snapshot bigint, file_order bigint, path varchar,
        path_is_relative boolean, file_format varchar, record_count bigint,
        file_size_bytes bigint, footer_size bigint, row_id_start bigint, partition_id bigint,
        encryption_key varchar, partial_file_info varchar, mapping_id bigint)""",
    """CREATE TABLE ducklake_file_column_stats (data_file_id bigint, table_id bigint,
        column_id bigint, column_size_bytes bigint, value_count bigint, null_count bigint,
        min_value varchar, max_value varchar, contains_nan boolean, extra_stats varchar)""",
    """CREATE TABLE ducklake_delete_file (delete_file_id bigint PRIMARY KEY, table_id bigint,
        begin_snapshot bigint, end_snapshot bigint, data_file_id bigint, path varchar,
        path_is_relative boolean, format varchar, delete_count bigint, file_size_bytes bigint,
        footer_size bigint, encryption_key varchar)""",
    """CREATE TABLE ducklake_column (column_id bigint, begin_snapshot bigint,
        end_snapshot bigint, table_id bigint, column_order bigint, column_name varchar,
        column_type varchar, initial_default varchar, default_value varchar,
        nulls_allowed boolean, parent_column bigint)""",
    """CREATE TABLE ducklake_table_stats (table_id bigint, record_count bigint,
        next_row_id bigint, file_size_bytes bigint)""",
    """CREATE TABLE ducklake_table_column_stats (table_id bigint, column_id bigint,
        contains_null boolean, contains_nan boolean, min_value varchar, max_value varchar,
        extra_stats varchar)""",
    """CREATE TABLE ducklake_partition_info (partition_id bigint, table_id bigint,
        begin_snapshot bigint, end_snapshot bigint)""",
    """CREATE TABLE ducklake_partition_column (partition_id bigint, table_id bigint,
        partition_key_index bigint, column_id bigint, transform varchar)""",
    """CREATE TABLE ducklake_file_partition_value (data_file_id bigint, table_id bigint,
        partition_key_index bigint, partition_value varchar)""",
    """CREATE TABLE ducklake_files_scheduled_for_deletion (data_file_id bigint, path varchar,
        path_is_relative boolean, schedule_start timestamptz)""",
    """CREATE TABLE ducklake_inlined_data_tables (table_id bigint, table_name varchar,
        schema_version bigint)""",
    """CREATE TABLE ducklake_column_mapping (mapping_id bigint, table_id bigint, type varchar)""",
    """CREATE TABLE ducklake_name_mapping (mapping_id bigint, column_id bigint,
        source_name varchar, target_field_id bigint, parent_column bigint,
        is_partition boolean)""",
    """CREATE TABLE ducklake_schema_versions (begin_snapshot bigint, schema_version bigint)""",
    "CREATE INDEX idx_ducklake_column_tbl_snap ON ducklake_column (table_id, begin_snapshot)",
    "CREATE INDEX idx_ducklake_table_snap ON ducklake_table (table_id, begin_snapshot)",
    "CREATE INDEX idx_ducklake_data_file_tbl_snap ON ducklake_data_file (table_id, begin_snapshot)",
    "CREATE INDEX idx_ducklake_file_column_stats_file ON ducklake_file_column_stats "
    "(data_file_id, column_id)",
    "CREATE INDEX idx_ducklake_delete_file_tbl ON ducklake_delete_file (table_id, data_file_id)",
)

# Per DuckLake table t (1..N): snapshot 2t-1 creates it (schema_version t), snapshot 2t inserts
# its data files. Schema s (0..) holds tables in blocks of 100. Catalog ids: schemas 0..S-1,
# tables and views share the catalog id space above them; column ids are per table.
_FILL: tuple[str, ...] = (
    """INSERT INTO ducklake_metadata (key, value, scope, scope_id) VALUES
        ('version', '0.3', NULL, NULL),
        ('created_by', 'DuckDB v1.4.0 — make_demo_catalog ✓', NULL, NULL),
        ('data_path', 's3://demo-bucket/ducklake/données/', NULL, NULL),
        ('encrypted', 'false', NULL, NULL),
        ('data_inlining_row_limit', '16', NULL, NULL),
        ('target_file_size', '536870912', 'schema', 0)""",
    """INSERT INTO ducklake_snapshot
       SELECT 0, timestamptz '2025-01-01 00:00:00+00', 0, %(schemas)s, 0
       UNION ALL
       SELECT s, timestamptz '2025-01-01 00:00:00+00' + make_interval(secs => s * 7.25),
              (s + 1) / 2, %(schemas)s + (s + 1) / 2 + 1, (s / 2) * %(files)s
       FROM generate_series(1, 2 * %(tables)s) s""",
    """INSERT INTO ducklake_snapshot_changes
       SELECT 0, 'created_schema:"main"', NULL, NULL, NULL
       UNION ALL
       SELECT s,
              CASE WHEN s %% 2 = 1 THEN format('created_table:"main"."t_%%s"', (s + 1) / 2)
                   ELSE format('inserted_into_table:%%s', s / 2) END,
              CASE WHEN s %% 3 = 0 THEN NULL ELSE 'ingest-bot ☃' END,
              CASE WHEN s %% 5 = 0 THEN repeat('long commit message ', 40) ELSE NULL END,
              CASE WHEN s %% 7 = 0 THEN '{"source":"kafka","partition":3}' ELSE NULL END
       FROM generate_series(1, 2 * %(tables)s) s""",
    """INSERT INTO ducklake_schema
       SELECT g, ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 0, NULL,
              CASE WHEN g = 0 THEN 'main' ELSE format('schéma_%%s', g) END,
              CASE WHEN g = 0 THEN 'main/' ELSE format('schéma_%%s/', g) END, true
       FROM generate_series(0, %(schemas)s - 1) g""",
    """INSERT INTO ducklake_schema_versions
       SELECT 2 * t - 1, t FROM generate_series(1, %(tables)s) t""",
    """INSERT INTO ducklake_table
       SELECT %(schemas)s + t, ('10000000-0000-4000-8000-' || lpad(to_hex(t), 12, '0'))::uuid,
              2 * t - 1, CASE WHEN t %% 50 = 0 THEN 2 * %(tables)s ELSE NULL END,
              (t - 1) / 100,
              CASE t %% 4 WHEN 0 THEN format('événements_%%s', t)
                          WHEN 1 THEN format('表_%%s', t)
                          WHEN 2 THEN format('table "quoted" %%s', t)
                          ELSE format('t_%%s', t) END,
              format('t_%%s/', t), true
       FROM generate_series(1, %(tables)s) t""",
    """INSERT INTO ducklake_column
       SELECT c, 2 * t - 1, NULL, %(schemas)s + t, c,
              CASE c %% 5 WHEN 0 THEN format('colonne_%%s', c) WHEN 1 THEN 'id'
                          WHEN 2 THEN format('名前_%%s', c) ELSE format('c%%s', c) END,
              (ARRAY['int64','varchar','timestamp with time zone','double','blob',
                     'decimal(18,3)','boolean','struct<a int32, b varchar>'])[1 + c %% 8],
              CASE WHEN c %% 3 = 0 THEN NULL ELSE '0' END,
              CASE WHEN c %% 4 = 0 THEN NULL ELSE 'NULL' END,
              c %% 2 = 0, CASE WHEN c > %(columns)s - 1 AND c %% 8 = 7 THEN 1 ELSE NULL END
       FROM generate_series(1, %(tables)s) t, generate_series(1, %(columns)s) c""",
    """INSERT INTO ducklake_data_file
       SELECT (t - 1) * %(files)s + f, %(schemas)s + t, 2 * t,
              CASE WHEN f = 1 AND t %% 5 = 0 THEN 2 * %(tables)s ELSE NULL END, f,
              format('t_%%s/ducklake-%%s-%%s.parquet', t, md5((t * 1000 + f)::text), f),
              true, 'parquet', 1000 + f * 37, 40960 + f * 4096, 1024 + f, (f - 1) * 1000,
              CASE WHEN t %% 4 = 0 THEN t ELSE NULL END,
              CASE WHEN f %% 2 = 0 THEN NULL
                   ELSE encode(sha256((t || ':' || f)::bytea), 'base64') END,
              NULL, CASE WHEN t %% 10 = 0 THEN t ELSE NULL END
       FROM generate_series(1, %(tables)s) t, generate_series(1, %(files)s) f""",
    """INSERT INTO ducklake_file_column_stats
       SELECT (t - 1) * %(files)s + f, %(schemas)s + t, c, 512 * c + f, 1000 + f * 37,
              CASE WHEN c %% 3 = 0 THEN f ELSE 0 END,
              CASE WHEN c %% 4 = 0 THEN NULL ELSE ((t * 31 + f * 7 + c) %% 100000)::text END,
              CASE WHEN c %% 4 = 0 THEN NULL
                   WHEN c %% 8 = 1 THEN repeat('zzz-ß-', 20) || f
                   ELSE ((t * 31 + f * 7 + c) %% 100000 + 5000)::text END,
              CASE WHEN c %% 8 = 3 THEN false ELSE NULL END, NULL
       FROM generate_series(1, %(tables)s) t, generate_series(1, %(files)s) f,
            generate_series(1, %(columns)s) c""",
    """INSERT INTO ducklake_table_stats
       SELECT %(schemas)s + t, %(files)s * 1000 + t, %(files)s * 1000 + t + 1,
              %(files)s * 45000 FROM generate_series(1, %(tables)s) t""",
    """INSERT INTO ducklake_table_column_stats
       SELECT %(schemas)s + t, c, c %% 3 = 0, CASE WHEN c %% 8 = 3 THEN false ELSE NULL END,
              CASE WHEN c %% 4 = 0 THEN NULL ELSE '0' END,
              CASE WHEN c %% 4 = 0 THEN NULL ELSE '99999' END, NULL
       FROM generate_series(1, %(tables)s) t, generate_series(1, %(columns)s) c""",
    """INSERT INTO ducklake_delete_file
       SELECT t, %(schemas)s + t, 2 * t, NULL, (t - 1) * %(files)s + 1,
              format('t_%%s/ducklake-delete-%%s.parquet', t, t), true, 'parquet', t %% 17,
              2048, 512, NULL
       FROM generate_series(1, %(tables)s) t WHERE t %% 5 = 0""",
    """INSERT INTO ducklake_partition_info
       SELECT t, %(schemas)s + t, 2 * t - 1, NULL FROM generate_series(1, %(tables)s) t
       WHERE t %% 4 = 0""",
    """INSERT INTO ducklake_partition_column
       SELECT t, %(schemas)s + t, k, k + 1, (ARRAY['identity','year','month'])[k + 1]
       FROM generate_series(1, %(tables)s) t, generate_series(0, 1) k WHERE t %% 4 = 0""",
    """INSERT INTO ducklake_file_partition_value
       SELECT (t - 1) * %(files)s + f, %(schemas)s + t, k,
              CASE k WHEN 0 THEN format('région=%%s', f %% 3) ELSE (2020 + f %% 5)::text END
       FROM generate_series(1, %(tables)s) t, generate_series(1, %(files)s) f,
            generate_series(0, 1) k WHERE t %% 4 = 0""",
    """INSERT INTO ducklake_files_scheduled_for_deletion
       SELECT (t - 1) * %(files)s + 1, format('t_%%s/old-%%s.parquet', t, t), true,
              timestamptz '2025-02-01 00:00:00+00' + make_interval(secs => t)
       FROM generate_series(1, %(tables)s) t WHERE t %% 5 = 0""",
    """INSERT INTO ducklake_tag
       SELECT %(schemas)s + t, 2 * t - 1, NULL, 'comment',
              CASE WHEN t %% 2 = 0 THEN 'tableau des ventes — 売上' ELSE NULL END
       FROM generate_series(1, %(tables)s) t WHERE t %% 3 = 0""",
    """INSERT INTO ducklake_column_tag
       SELECT %(schemas)s + t, 1, 2 * t - 1, NULL, 'comment', 'primary identifier'
       FROM generate_series(1, %(tables)s) t WHERE t %% 6 = 0""",
    """INSERT INTO ducklake_view
       SELECT %(schemas)s + %(tables)s + v,
              ('20000000-0000-4000-8000-' || lpad(to_hex(v), 12, '0'))::uuid, 2 * v, NULL,
              0, format('vue_%%s', v), 'duckdb',
              'SELECT ' || string_agg(format('"c%%s"', c), ', ') || format(' FROM t_%%s', v),
              NULL
       FROM generate_series(1, greatest(%(tables)s / 20, 1)) v, generate_series(1, 60) c
       GROUP BY v""",
    """INSERT INTO ducklake_column_mapping
       SELECT t, %(schemas)s + t, 'map_by_name' FROM generate_series(1, %(tables)s) t
       WHERE t %% 10 = 0""",
    """INSERT INTO ducklake_name_mapping
       SELECT t, c, format('source_col_%%s', c), c, NULL, false
       FROM generate_series(1, %(tables)s) t, generate_series(1, %(columns)s) c
       WHERE t %% 10 = 0""",
)

# One round trip for all inlined-data tables: a DO block looping over the chosen tables.
_INLINED = """
DO $demo$
DECLARE
  t bigint;
  name text;
BEGIN
  FOR t IN SELECT g FROM generate_series({first}, {last}) g WHERE g % {every} = 0 LOOP
    name := format('ducklake_inlined_data_%s_%s', {schemas} + t, t);
    EXECUTE format('CREATE TABLE %I (row_id bigint, begin_snapshot bigint, end_snapshot bigint,
        id bigint, "名前" varchar, payload bytea, note varchar, flag boolean,
        created timestamptz)', name);
    EXECUTE format($q$INSERT INTO %I SELECT r, %s, CASE WHEN r %% 4 = 0 THEN %s ELSE NULL END,
        r * 1000 + %s,
        CASE WHEN r %% 3 = 0 THEN NULL ELSE 'ligne ' || r || ' — ✓ 行' END,
        CASE WHEN r %% 5 = 0 THEN NULL ELSE decode(md5(r::text), 'hex') ||
             (SELECT string_agg(set_byte('\\x00'::bytea, 0, b), ''::bytea)
              FROM generate_series(0, 255) b) END,
        CASE WHEN r %% 7 = 0 THEN repeat('wide row ', 600) || r ELSE 'n' || r END,
        CASE WHEN r %% 2 = 0 THEN NULL ELSE r %% 3 = 0 END,
        timestamptz '2025-01-01 00:00:00+00' + make_interval(hours => r)
        FROM generate_series(1, {rows}) r$q$, name, 2 * t, 2 * t + 1, t);
    INSERT INTO ducklake_inlined_data_tables VALUES ({schemas} + t, name, t);
  END LOOP;
END
$demo$
"""


@dataclass(frozen=True)
class CatalogSummary:
    ducklake_tables: int
    physical_tables: int
    rows: int
    database_bytes: int


def build_demo_catalog(
    conn: psycopg.Connection[tuple[object, ...]],
    *,
    tables: int,
    inlined_every: int = 10,
    inlined_rows: int = 24,
    files_per_table: int = 16,
    columns_per_table: int = 10,
) -> CatalogSummary:
    """Create and fill the catalog in ``public`` of the connected database (the catalog tables
    in one transaction, then the inlined-data tables in batches of 500 per transaction).

    Refuses a database that already holds ``ducklake_*`` tables. ``inlined_every`` = 0 makes
    no inlined-data tables."""
    if tables < 1:
        raise ValueError("--tables must be at least 1")
    if inlined_every < 0 or files_per_table < 1 or columns_per_table < 1 or inlined_rows < 1:
        raise ValueError("sizes must be positive")
    schemas = max(1, (tables + 99) // 100)
    params = {
        "tables": tables,
        "files": files_per_table,
        "columns": columns_per_table,
        "schemas": schemas,
    }
    with conn.transaction():
        existing = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename LIKE 'ducklake\\_%'"
        ).fetchone()
        if existing and int(str(existing[0])) > 0:
            raise ValueError(
                "the database already holds ducklake_* tables; use an empty database "
                "(or --create-db with a new name)"
            )
        conn.execute("SET LOCAL search_path = public")
        for ddl in SCHEMA_DDL:
            conn.execute(sql.SQL(ddl))
        for statement in _FILL:
            conn.execute(sql.SQL(statement), params)
    # Inlined-data tables in batches, each its own transaction: creating thousands of tables in
    # one transaction would exhaust the server's lock table (max_locks_per_transaction).
    batch = 500 * max(inlined_every, 1)
    for first in range(1, tables + 1, batch) if inlined_every > 0 else ():
        with conn.transaction():
            conn.execute("SET LOCAL search_path = public")
            conn.execute(
                sql.SQL(
                    _INLINED.format(
                        first=first,
                        last=min(tables, first + batch - 1),
                        every=inlined_every,
                        schemas=schemas,
                        rows=inlined_rows,
                    )
                )
            )
    return summarize(conn)


def summarize(conn: psycopg.Connection[tuple[object, ...]]) -> CatalogSummary:
    """Exact counts (``count(*)`` per table, not the statistics collector's estimate)."""
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename LIKE 'ducklake\\_%'"
        )
    ]
    rows = 0
    for name in names:
        got = conn.execute(
            sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(name))
        ).fetchone()
        rows += int(str(got[0])) if got else 0
    got = conn.execute(
        "SELECT (SELECT count(*) FROM public.ducklake_table), pg_database_size(current_database())"
    ).fetchone()
    assert got is not None
    return CatalogSummary(int(str(got[0])), len(names), rows, int(str(got[1])))


def create_database(
    conn: psycopg.Connection[tuple[object, ...]], dbname: str, owner: str | None
) -> None:
    """``CREATE DATABASE`` (autocommit connection to another database of the server)."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
    if owner:
        statement = sql.SQL("{} OWNER {}").format(statement, sql.Identifier(owner))
    conn.execute(statement)
