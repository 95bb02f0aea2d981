"""Trigger-based change capture on a source catalog, for the online copy (docs/copy.md "Online
copy: the engine").

Why triggers: they need nothing the provisioner does not already have for the offline move
(membership in the tenant role, so these objects are created as, and owned by, the tenant),
no server setting (logical decoding needs ``wal_level = logical`` and a restart), and no
change to the tenant's tables' replica identity (most ``ducklake_*`` tables have no primary
key, so logical replication would need ``REPLICA IDENTITY FULL`` on them).

**What it creates** in the tenant's catalog database, all in one schema, :data:`SCHEMA`:

- the table ``changes`` (``seq``, the writing transaction's ``xid``, the table, ``I``/``U``/``D``/
  ``T``, the old and the new row as ``jsonb``);
- the function ``record()`` (``SECURITY INVOKER``, pinned ``search_path``), which appends one
  row per changed row, and ``record_truncate()`` for ``TRUNCATE``;
- on each captured ``public.ducklake_*`` table, the triggers ``duckgres_capture`` (after each
  row) and ``duckgres_capture_truncate`` (after the statement).

**Invariants.**

1. *Nothing outlives the operation:* :func:`remove` drops the triggers and then the schema
   (``DROP SCHEMA … CASCADE``), idempotent and resumable; the tenant's tables are left exactly
   as they were. Every terminal path calls it.
2. *A change is applied exactly when the pre-copy did not see it:* the pre-copy records its
   snapshot (:func:`snapshot_marker`, ``pg_current_snapshot()`` inside its ``REPEATABLE READ``
   transaction); :func:`pending` returns the changes of transactions **not visible** in it
   (``pg_visible_in_snapshot``), in ``seq`` order. Conflicting row changes are serialised by
   row locks, so ``seq`` order is their commit order; others commute.
3. *Only tables that carry the trigger are captured:* a table created after :func:`install`
   has none, so the pre-copy copies only :func:`installed_tables` and the catch-up copies any
   other table whole, under the write fence.
4. *Nothing read back is executed as SQL text:* a change names its table by a value checked
   against the copied set and carries rows as ``jsonb`` values, applied on the target with
   ``jsonb_populate_record`` against the target's own table type. A change the target cannot
   match (a row to update or delete that is not there) fails the catch-up: the copy has
   diverged and the operation rolls back. The change table is the tenant's: before it is read
   it must still be the plain table of built-in types :func:`install` created (a view or a
   type with the tenant's own functions would run the tenant's code in the reading session).

Locks on the tenant's tables. ``CREATE TRIGGER`` takes ``SHARE ROW EXCLUSIVE`` on its table and
``DROP TRIGGER`` ``ACCESS EXCLUSIVE``; a tenant's DuckDB commit writes several tables in one
transaction, in its own order. The capture therefore never waits for a table while it holds
another one, so it can never deadlock with such a commit (PostgreSQL would then pick a victim,
possibly the tenant's transaction):

- :func:`install` creates the schema in one transaction, then puts the triggers on each table in
  a transaction **of its own**, which waits a bounded time for that one table (a tenant's
  writes to it queue behind that wait at most) and holds nothing else. A wait that runs out
  raises :class:`Busy` with every table before it done: calling it again resumes, with a longer
  wait (:func:`lock_wait_ms`: 200 ms doubling to 5 s), so it gets through even when the tenant's
  commits take seconds and always overlap.
  Taking all the tables at once instead (``LOCK … NOWAIT``, then the triggers) starved on a
  catalog of 2,022 tables with DuckDB committing 20 times a second: some table was always held
  (226 attempts in 30 s, none free). Per-table transactions keep the pre-copy exact: a tenant's
  transaction that wrote a table before its trigger existed held that table's lock until it
  committed, so it committed before the trigger, hence before the pre-copy's snapshot, which
  is taken once every trigger is in place.
- :func:`remove` and :func:`drop_triggers` first try every table at once with ``NOWAIT``
  (:func:`_lock_all`; instant when the tenant is fenced, as on the way to success). When a
  tenant's transaction holds one, :func:`remove` drops the triggers table by table as
  :func:`install` adds them, then the schema; :func:`drop_triggers` (only ever called once the
  tenant is fenced) raises :class:`Busy` and the caller retries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

SCHEMA = "duckgres_capture"
TRIGGER = "duckgres_capture"
TRUNCATE_TRIGGER = "duckgres_capture_truncate"
LOCK_TIMEOUT_MS = 2000
TABLE_LOCK_WAIT_MS = 200  # how long one table's trigger statement first waits for a tenant
TABLE_LOCK_WAIT_MAX_MS = 5000  # the longest it waits, after doubling on each busy attempt
FETCH_ROWS = 1000

Connection = psycopg.Connection[Any]

_SCHEMA = sql.Identifier(SCHEMA)

_CREATE = (
    sql.SQL("CREATE SCHEMA {}").format(_SCHEMA),
    sql.SQL(
        "CREATE TABLE {}.changes (seq bigserial PRIMARY KEY, "
        "xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(), tbl text NOT NULL, "
        'op "char" NOT NULL, old_row jsonb, new_row jsonb)'
    ).format(_SCHEMA),
    sql.SQL(
        "CREATE FUNCTION {}.record() RETURNS trigger LANGUAGE plpgsql SECURITY INVOKER "
        "SET search_path = pg_catalog AS $body$ BEGIN "
        "INSERT INTO {}.changes (tbl, op, old_row, new_row) VALUES (TG_TABLE_NAME, "
        "left(TG_OP, 1), CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END, "
        "CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END); RETURN NULL; END $body$"
    ).format(_SCHEMA, _SCHEMA),
    sql.SQL(
        "CREATE FUNCTION {}.record_truncate() RETURNS trigger LANGUAGE plpgsql "
        "SECURITY INVOKER SET search_path = pg_catalog AS $body$ BEGIN "
        "INSERT INTO {}.changes (tbl, op) VALUES (TG_TABLE_NAME, 'T'); RETURN NULL; END $body$"
    ).format(_SCHEMA, _SCHEMA),
)


class CaptureError(Exception):
    """Capture could not be installed, read or applied; the message is operator-facing."""


class Busy(CaptureError):
    """A tenant's transaction held one of the tables: nothing was done; try again."""


def _lock_all(conn: Connection, tables: Sequence[str], mode: str) -> None:
    if not tables:
        return
    try:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN " + mode + " MODE NOWAIT").format(
                sql.SQL(", ").join(_table(t) for t in tables)
            )
        )
    except psycopg.errors.LockNotAvailable as exc:
        raise Busy(f"a tenant's transaction holds a table: {_one_line(exc)}") from exc


@dataclass(frozen=True)
class Change:
    seq: int
    table: str
    op: str  # I, U, D or T
    old: dict[str, Any] | None
    new: dict[str, Any] | None


@dataclass
class Applied:
    """What a catch-up applied, per kind of change."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    truncated: int = 0
    skipped: int = 0  # changes of tables the catch-up drops or copies whole

    @property
    def total(self) -> int:
        return self.inserted + self.updated + self.deleted + self.truncated


def _table(name: str) -> sql.Composed:
    return sql.SQL("public.{}").format(sql.Identifier(name))


def _lock_timeout(conn: Connection) -> None:
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{LOCK_TIMEOUT_MS}ms")))


def installed(conn: Connection) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (SCHEMA,)
    ).fetchone()
    return row is not None


def install(conn: Connection, tables: Sequence[str]) -> None:
    """:func:`create_schema`, then :func:`add_triggers` (``conn``: autocommit, ``SET ROLE`` to
    the tenant done)."""
    create_schema(conn)
    add_triggers(conn, tables)


def create_schema(conn: Connection) -> None:
    """The capture schema, its change table and functions, in one transaction (no lock on a
    tenant's table). Refused when the schema exists: a leftover of another install is removed
    first (:func:`remove`), never reused, because its changes belong to another pre-copy."""
    try:
        if installed(conn):
            raise CaptureError(f"schema {SCHEMA} exists already on the source: remove it first")
        with conn.transaction():
            _lock_timeout(conn)
            for statement in _CREATE:
                conn.execute(statement)
    except CaptureError:
        raise
    except psycopg.Error as exc:
        raise CaptureError(f"installing change capture: {_one_line(exc)}") from exc


def add_triggers(
    conn: Connection, tables: Sequence[str], wait_ms: int = TABLE_LOCK_WAIT_MS
) -> None:
    """Put the triggers on each of ``tables`` (``public``) that lacks them, each table in a
    transaction of its own (see the module: one table locked at a time, waiting at most
    ``wait_ms`` for it). :class:`Busy` when a table stayed held by a tenant's transaction: the
    tables before it carry their triggers, and calling again resumes (with a longer wait:
    :func:`lock_wait_ms`)."""
    try:
        done = set(installed_tables(conn))
        for table in tables:
            if table not in done:
                _on_one_table(conn, table, "SHARE ROW EXCLUSIVE", _create_triggers(table), wait_ms)
    except CaptureError:
        raise
    except psycopg.Error as exc:
        raise CaptureError(f"installing change capture: {_one_line(exc)}") from exc


def _create_triggers(table: str) -> tuple[sql.Composed, ...]:
    return (
        sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {} "
            "FOR EACH ROW EXECUTE FUNCTION {}.record()"
        ).format(sql.Identifier(TRIGGER), _table(table), _SCHEMA),
        sql.SQL(
            "CREATE TRIGGER {} AFTER TRUNCATE ON {} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {}.record_truncate()"
        ).format(sql.Identifier(TRUNCATE_TRIGGER), _table(table), _SCHEMA),
    )


def _drop_triggers(table: str) -> tuple[sql.Composed, ...]:
    return tuple(
        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(name), _table(table))
        for name in (TRIGGER, TRUNCATE_TRIGGER)
    )


def lock_wait_ms(attempt: int) -> int:
    """The wait for one table at the ``attempt``-th try (1, 2, …): doubling from
    :data:`TABLE_LOCK_WAIT_MS` to :data:`TABLE_LOCK_WAIT_MAX_MS`. While it waits, the capture
    is queued for that one table: the tenant's transactions holding it finish, its new writes
    to it wait behind (at most this long), and it holds no other table, so nothing deadlocks.
    A longer wait is what lets it through when the tenant's commits are long (seconds on a
    very large catalog) and always overlap."""
    return int(min(TABLE_LOCK_WAIT_MS * 2 ** max(0, attempt - 1), TABLE_LOCK_WAIT_MAX_MS))


def _on_one_table(
    conn: Connection,
    table: str,
    mode: str,
    statements: Sequence[sql.Composed],
    wait_ms: int = TABLE_LOCK_WAIT_MS,
) -> None:
    """``statements`` on ``table`` in one transaction that locks only it, waiting at most
    ``wait_ms`` (:class:`Busy` after: nothing of it done)."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{wait_ms}ms")))
            conn.execute(sql.SQL("LOCK TABLE {} IN " + mode + " MODE").format(_table(table)))
            for statement in statements:
                conn.execute(statement)
    except psycopg.errors.LockNotAvailable as exc:
        raise Busy(
            f"a tenant's transaction held {table} for {wait_ms} ms: {_one_line(exc)}"
        ) from exc


def installed_tables(conn: Connection) -> list[str]:
    """The ``public`` tables carrying the capture trigger (what a pre-copy may copy)."""
    rows = conn.execute(
        "SELECT c.relname::text FROM pg_catalog.pg_trigger t "
        "JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND t.tgname = %s ORDER BY 1",
        (TRIGGER,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def remove(conn: Connection, wait_ms: int = TABLE_LOCK_WAIT_MS) -> bool:
    """Drop everything :func:`install` created (idempotent, resumable); True when something was
    there. All at once when no tenant's transaction holds a captured table, else the triggers
    table by table (:class:`Busy` when one stayed held: call again), then the schema. The
    tenant's tables lose the triggers and are otherwise untouched."""
    try:
        present = installed(conn)
        tables = installed_tables(conn)
        try:
            _drop_schema(conn, tables)
            return present
        except Busy:
            pass
        for table in tables:
            _on_one_table(conn, table, "ACCESS EXCLUSIVE", _drop_triggers(table), wait_ms)
        _drop_schema(conn, installed_tables(conn))
    except CaptureError:
        raise
    except psycopg.Error as exc:
        raise CaptureError(f"removing change capture: {_one_line(exc)}") from exc
    return present


def _drop_schema(conn: Connection, tables: Sequence[str]) -> None:
    """The schema and what depends on it, ``tables`` (those still carrying a trigger) locked
    at once with ``NOWAIT`` first (:class:`Busy`: nothing done)."""
    with conn.transaction():
        _lock_timeout(conn)
        _lock_all(conn, tables, "ACCESS EXCLUSIVE")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(_SCHEMA))


def drop_triggers(conn: Connection) -> None:
    """Drop the triggers (with the two functions they run) and keep the change table: once the
    tenant is fenced nothing is left to capture, and what was captured is still to be applied.
    Idempotent; :func:`remove` later drops the rest."""
    try:
        with conn.transaction():
            _lock_timeout(conn)
            _lock_all(conn, installed_tables(conn), "ACCESS EXCLUSIVE")
            for function in ("record", "record_truncate"):
                conn.execute(
                    sql.SQL("DROP FUNCTION IF EXISTS {}.{}() CASCADE").format(
                        _SCHEMA, sql.Identifier(function)
                    )
                )
    except CaptureError:
        raise
    except psycopg.Error as exc:
        raise CaptureError(f"removing the capture triggers: {_one_line(exc)}") from exc


def snapshot_marker(conn: Connection) -> str:
    """Inside the pre-copy's ``REPEATABLE READ`` transaction: its snapshot, as text."""
    row = conn.execute("SELECT pg_catalog.pg_current_snapshot()::text").fetchone()
    assert row is not None
    return str(row[0])


# What install() created, column by column: the change table is the tenant's, so before it is
# read it must still be that plain table of built-in types (a view, or a column of a type with
# the tenant's own cast or output function, would run the tenant's code in this session).
_CHANGES_SHAPE = [
    ("seq", "int8"),
    ("xid", "xid8"),
    ("tbl", "text"),
    ("op", "char"),
    ("old_row", "jsonb"),
    ("new_row", "jsonb"),
]
_SHAPE_SQL = (
    "SELECT c.relkind::text, a.attname::text, t.typname::text, tn.nspname::text "
    "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
    "AND NOT a.attisdropped JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
    "JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace "
    "WHERE n.nspname = %s AND c.relname = 'changes' ORDER BY a.attnum"
)


def _check_changes_table(conn: Connection) -> None:
    rows = conn.execute(_SHAPE_SQL, (SCHEMA,)).fetchall()
    kinds = {str(r[0]) for r in rows}
    shape = [(str(r[1]), str(r[2])) for r in rows]
    builtin = all(str(r[3]) == "pg_catalog" for r in rows)
    if kinds != {"r"} or shape != _CHANGES_SHAPE or not builtin:
        raise CaptureError(
            f"{SCHEMA}.changes is no longer the table the capture created (a view, or other "
            "columns or types): refusing to read it; the operation rolls back and can run "
            "offline"
        )


def pending(conn: Connection, marker: str) -> Iterator[Change]:
    """The changes the pre-copy did not see, in ``seq`` order (read in batches on ``conn``,
    which must be inside the fenced snapshot's transaction). The change table's shape is
    checked first (invariant 4)."""
    _check_changes_table(conn)
    query = sql.SQL(
        "SELECT seq, tbl, op::text, old_row::text, new_row::text FROM {}.changes "
        "WHERE NOT pg_catalog.pg_visible_in_snapshot(xid, %s::pg_catalog.pg_snapshot) "
        "AND seq > %s ORDER BY seq LIMIT %s"
    ).format(_SCHEMA)
    after = 0
    while True:
        rows = conn.execute(query, (marker, after, FETCH_ROWS)).fetchall()
        for seq, table, op, old, new in rows:
            after = int(seq)
            yield Change(
                int(seq), str(table), str(op), _row(old, seq, "old"), _row(new, seq, "new")
            )
        if len(rows) < FETCH_ROWS:
            return


def rewritten_tables(conn: Connection, marker: str) -> list[str]:
    """The tables with an update or a delete among the changes the pre-copy did not see (the
    ones whose rows the apply must find on the target); the change table checked first."""
    _check_changes_table(conn)
    rows = conn.execute(
        sql.SQL(
            "SELECT DISTINCT tbl FROM {}.changes WHERE op IN ('U', 'D') "
            "AND NOT pg_catalog.pg_visible_in_snapshot(xid, %s::pg_catalog.pg_snapshot) "
            "ORDER BY 1"
        ).format(_SCHEMA),
        (marker,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _row(text: str | None, seq: int, which: str) -> dict[str, Any] | None:
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, dict):
        raise CaptureError(f"change {seq}: the {which} row is not an object")
    return value


def apply(conn: Connection, changes: Iterator[Change], tables: set[str]) -> Applied:
    """Apply ``changes`` to the target on ``conn`` (inside the caller's transaction). Only
    changes of ``tables`` (copied by the pre-copy and still there) are applied; others are
    counted as skipped."""
    done = Applied()
    keys: dict[str, str | None] = {}

    def key(table: str) -> str | None:
        # Looked up per table the first time it has an update or a delete, not for every
        # copied table up front (2,029 of them cost the window 56 ms at 20,000 DuckLake tables).
        if table not in keys:
            keys[table] = first_columns(conn, [table]).get(table)
        return keys[table]

    for change in changes:
        if change.table not in tables:
            done.skipped += 1
            continue
        if change.op == "I":
            _insert(conn, change.table, change.new, change.seq)
            done.inserted += 1
        elif change.op == "U":
            _delete(conn, change.table, change.old, change.seq, key(change.table))
            _insert(conn, change.table, change.new, change.seq)
            done.updated += 1
        elif change.op == "D":
            _delete(conn, change.table, change.old, change.seq, key(change.table))
            done.deleted += 1
        elif change.op == "T":
            conn.execute(sql.SQL("TRUNCATE {}").format(_table(change.table)))
            done.truncated += 1
        else:
            raise CaptureError(f"change {change.seq}: unknown operation {change.op!r}")
    return done


def _record(table: str) -> sql.Composed:
    return sql.SQL("pg_catalog.jsonb_populate_record(NULL::{}, %s::jsonb)").format(_table(table))


def _insert(conn: Connection, table: str, row: dict[str, Any] | None, seq: int) -> None:
    if row is None:
        raise CaptureError(f"change {seq}: an insert into {table} without a row")
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT * FROM {}").format(_table(table), _record(table)),
        (json.dumps(row),),
    )


_FIRST_COLUMNS = """
SELECT c.relname::pg_catalog.text, a.attname::pg_catalog.text FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
 WHERE n.nspname = 'public' AND c.relname = ANY(%s) AND a.attnum = (
         SELECT pg_catalog.min(attnum) FROM pg_catalog.pg_attribute
          WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped)
"""
_NO_INDEX_LEADS = """
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                    WHERE i.indrelid = c.oid AND i.indkey[0] = a.attnum)
"""


def first_columns(
    conn: Connection, tables: Iterable[str], *, unindexed: bool = False
) -> dict[str, str]:
    """Each table's first column (by table name): the one the catch-up's lookup index leads
    with (``reshard.engines.copy.online.add_lookup_indexes``) and its apply matches rows by.
    ``unindexed``: only the tables where no index leads with that column yet."""
    query = _FIRST_COLUMNS + (_NO_INDEX_LEADS if unindexed else "") + " ORDER BY 1"
    rows = conn.execute(query, (sorted(tables),)).fetchall()
    return {str(t): str(c) for t, c in rows}


def _delete(
    conn: Connection, table: str, row: dict[str, Any] | None, seq: int, key: str | None = None
) -> None:
    """Remove ONE row equal to ``row`` (its whole old image); the predicate also names the
    table's first column, so its index finds the candidates instead of a scan of the table."""
    if row is None:
        raise CaptureError(f"change {seq}: a change of {table} without its old row")
    lookup: sql.Composable = sql.SQL("")
    if key is not None:
        column = sql.Identifier(key)
        lookup = (
            sql.SQL(" AND t.{} IS NULL").format(column)
            if row.get(key) is None
            else sql.SQL(" AND t.{} = r.{}").format(column, column)
        )
    cur = conn.execute(
        sql.SQL(
            "DELETE FROM {} WHERE ctid = (SELECT t.ctid FROM {} AS t, {} AS r "
            "WHERE t IS NOT DISTINCT FROM r{} LIMIT 1)"
        ).format(_table(table), _table(table), _record(table), lookup),
        (json.dumps(row),),
    )
    if cur.rowcount != 1:
        raise CaptureError(
            f"change {seq} of {table}: the row it changes is not on the target; "
            "the copy has diverged from the source"
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
