"""Replaying the checked shape on the target: tables (re)created after the pre-statement
heartbeat, constraints and indexes after the rows, foreign keys last, and the durable commit
that ends the copy (safeguards 5 and 6)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from reshard.engines.copy.base import (
    Connection,
    CopyError,
    CopyHooks,
    db_error,
    execute_one,
    one_line,
    qualified,
)
from reshard.engines.copy.shape import Column, Constraint, IndexDef, create_table_sql

INDEX_CREATE_ATTEMPTS = 3


def _drop_index_sql(name: str) -> sql.Composed:
    return sql.SQL("DROP INDEX IF EXISTS public.{}").format(sql.Identifier(name))


def apply_constraints(conn: Connection, table: str, constraints: Sequence[Constraint]) -> None:
    """``ALTER TABLE … ADD CONSTRAINT`` for each; ``p``/``u`` first drop a same-named index (a
    stale one on a reused target). Any error fails the copy."""
    for con in constraints:
        try:
            if con.contype in ("p", "u", "x"):
                execute_one(conn, _drop_index_sql(con.name))
            execute_one(
                conn,
                sql.SQL("ALTER TABLE public.{} ADD CONSTRAINT {} {}").format(
                    sql.Identifier(table), sql.Identifier(con.name), con.clause
                ),
            )
        except psycopg.Error as exc:
            raise db_error(f"constraint {con.name} on {table}", exc) from exc


def apply_index(
    conn: Connection,
    table: str,
    index: IndexDef,
    log: Callable[[str, str], None],
    *,
    attempts: int = INDEX_CREATE_ATTEMPTS,
) -> int:
    """Drop the index by name, then create it (never ``IF NOT EXISTS``: that would keep a wrong
    stale index). On 42P07 (a stale or concurrently created relation of that name) drop again
    and retry, ``attempts`` creates in all; any other error fails at once, as does a failing
    ``DROP INDEX``. Returns the number of create attempts used."""
    drop = _drop_index_sql(index.name)
    for attempt in range(1, attempts + 1):
        try:
            execute_one(conn, drop)
        except psycopg.Error as exc:
            raise db_error(f"DROP INDEX {index.name} on {table}", exc) from exc
        try:
            execute_one(conn, index.create)
            return attempt
        except pg_errors.DuplicateTable as exc:
            if attempt >= attempts:
                raise CopyError(
                    f"index {index.name} on {table}: still colliding after {attempts} "
                    f"drop+create attempts (last error: {one_line(exc)})",
                    sqlstate=exc.sqlstate,
                ) from exc
            log("warn", f"index {index.name} on {table} collided (42P07); dropping and retrying "
                        f"(attempt {attempt + 1} of {attempts})")  # fmt: skip
        except psycopg.Error as exc:
            raise db_error(f"index {index.name} on {table}", exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def recreate_table(
    tgt: Connection, table: str, columns: Sequence[Column], hooks: CopyHooks
) -> None:
    """Pre-statement heartbeat, then ``DROP TABLE IF EXISTS … CASCADE`` and ``CREATE TABLE …``
    (a leftover of an earlier attempt is replaced), one statement per message."""
    hooks.before_irreversible()
    try:
        execute_one(tgt, sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(qualified(table)))
        execute_one(tgt, create_table_sql(table, columns))
    except psycopg.Error as exc:
        raise db_error(f"recreating {table} on the target", exc) from exc


def drop_table(tgt: Connection, table: str, hooks: CopyHooks) -> None:
    """Pre-statement heartbeat, then ``DROP TABLE IF EXISTS … CASCADE``."""
    hooks.before_irreversible()
    try:
        execute_one(tgt, sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(qualified(table)))
    except psycopg.Error as exc:
        raise db_error(f"dropping {table} on the target", exc) from exc


def replay(
    tgt: Connection,
    tables: Sequence[str],
    constraints: Mapping[str, list[Constraint]],
    indexes: Mapping[str, list[IndexDef]],
    hooks: CopyHooks,
) -> None:
    """Per table: constraints other than foreign keys, then indexes. Foreign keys of every
    table come after all tables' keys exist: a table sorting before the table it references
    would otherwise find no unique constraint to reference (42830)."""
    hooks.log("info", f"applying constraints and indexes on the target ({len(tables)} tables)…")
    for table in tables:
        if hooks.stopped():
            raise CopyError("copy interrupted: the runner is stopping")
        apply_constraints(tgt, table, [c for c in constraints[table] if c.contype != "f"])
        for index in indexes[table]:
            apply_index(tgt, table, index, hooks.log)
    for table in tables:
        apply_constraints(tgt, table, [c for c in constraints[table] if c.contype == "f"])
    hooks.log("info", "constraints and indexes applied on target")


def durable_commit(tgt: Connection) -> None:
    """Flush the WAL of every asynchronously committed copy statement: a synchronous commit of a
    transaction with an xid waits for the WAL up to its commit record, which follows them all."""
    try:
        execute_one(tgt, sql.SQL("SET synchronous_commit = on"))
        execute_one(
            tgt, sql.SQL("SELECT pg_catalog.txid_current()")
        )  # an xid on every server version
    except psycopg.Error as exc:
        raise db_error("flushing the target's WAL", exc) from exc
