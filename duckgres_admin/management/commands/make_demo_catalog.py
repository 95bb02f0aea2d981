"""``manage.py make_demo_catalog``: build a DuckLake-shaped catalog of a chosen size.

Used by tests, benchmarks and ``make demo``. The password comes only from ``PGPASSWORD`` in the
environment (never an argument, so it never shows in ``ps``); ``--create-db`` first creates the
database (connecting to ``postgres`` on the same server), owned by ``--owner`` when given, and
the catalog tables are then created as ``--owner`` (``SET ROLE``) so the tenant owns them.
See ``reshard/engines/demo_catalog.py`` for the shape.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser
from psycopg import sql

from reshard.engines.demo_catalog import build_demo_catalog, create_database


class Command(BaseCommand):
    help = "Build a DuckLake-shaped catalog (ducklake_* tables) with --tables DuckLake tables."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=5432)
        parser.add_argument("--dbname", required=True)
        parser.add_argument("--user", default="postgres")
        parser.add_argument("--sslmode", default="require")
        parser.add_argument("--tables", type=int, required=True, help="DuckLake tables")
        parser.add_argument("--create-db", action="store_true", help="CREATE DATABASE first")
        parser.add_argument("--owner", default="", help="database and table owner role")
        parser.add_argument(
            "--inlined-every",
            type=int,
            default=10,
            help="every N-th table gets a physical inlined-data table (0: none)",
        )
        parser.add_argument("--files-per-table", type=int, default=16)
        parser.add_argument("--columns-per-table", type=int, default=10)

    def handle(self, *args: Any, **opts: Any) -> None:
        def connect(dbname: str) -> psycopg.Connection[tuple[object, ...]]:
            return psycopg.connect(
                host=opts["host"],
                port=opts["port"],
                dbname=dbname,
                user=opts["user"],
                password=os.environ.get("PGPASSWORD") or None,
                sslmode=opts["sslmode"],
                connect_timeout=10,
                application_name="duckgres-make-demo-catalog",
                autocommit=True,
            )

        try:
            if opts["create_db"]:
                with connect("postgres") as admin:
                    create_database(admin, opts["dbname"], opts["owner"] or None)
            with connect(opts["dbname"]) as conn:
                if opts["owner"]:
                    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(opts["owner"])))
                summary = build_demo_catalog(
                    conn,
                    tables=opts["tables"],
                    inlined_every=opts["inlined_every"],
                    files_per_table=opts["files_per_table"],
                    columns_per_table=opts["columns_per_table"],
                )
        except (psycopg.Error, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"demo catalog {opts['dbname']} on {opts['host']}:{opts['port']}: "
            f"{summary.ducklake_tables} DuckLake tables, {summary.physical_tables} "
            f"ducklake_* tables, {summary.rows} rows, "
            f"{summary.database_bytes / 1048576:.1f} MiB database"
        )
