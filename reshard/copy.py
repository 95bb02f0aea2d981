"""The catalog copy between two PostgreSQL servers (spec reshard §4.9; safeguards 5, 6, 7, 17,
28, 32, 55).

Entry points:

- :func:`copy_catalog` copies every ``ducklake_*`` table of the source's ``public`` schema to
  the target inside ONE ``REPEATABLE READ`` snapshot whose ``SHARE`` locks (the write fence)
  stay held after it returns, through the :class:`ReleaseHandle` it returns. The caller (the
  runner's ``copying`` step) keeps the handle until the source database is dropped or the
  rollback ends, verifies through ``handle.connection`` (``reshard.verify``), and calls
  ``handle.release()`` (idempotent).
- :func:`drop_ducklake_tables` drops every ``ducklake_*`` table on a target (rollback, §4.6
  step 3).

Connections are opened by the caller through factories (sslmode, port, ``application_name``,
``connect_timeout`` set; ``SET ROLE`` done for cnpg sides); this module switches them to
autocommit, runs ``SET search_path = public``, registers every one with the hooks (so fencing
can ``cancel()`` it) and closes every one it was given except the source connection behind the
release handle. On any error every connection is closed at once and :class:`CopyError` is
raised.

Speed (issue 3 benchmark): rows never pass through per-row Python code that parses or formats
them: the source's ``COPY … TO STDOUT (FORMAT binary)`` messages are drained straight off libpq
(``pgconn.get_copy_data``) into 256 KiB blocks that are written to the target's ``COPY … FROM
STDIN (FORMAT binary)``. With ``parallelism`` N > 1 the tables are streamed by N helper
connection pairs sharing the primary's exported snapshot while the primary target connection
creates the tables ahead of them; N = 1 is the plain sequential copy on the primary pair.
Target sessions run with ``synchronous_commit = off`` during the bulk phase; the final statement
of the copy is a commit with ``synchronous_commit = on``, which flushes the WAL of everything
before it, so nothing is reported copied before it is durable.
"""

from __future__ import annotations

import contextlib
import queue
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql

TARGET_LOCK_KEY = 824460
INDEX_CREATE_ATTEMPTS = 3
PROGRESS_INTERVAL_SECONDS = 2.0
# Blocks written to the target: big enough that per-write overhead vanishes, small enough to
# keep the copy's memory flat (one block per stream).
COPY_BLOCK_BYTES = 256 * 1024
_WAIT_SLICE_SECONDS = 1.0

Connection = psycopg.Connection[Any]
ConnectionFactory = Callable[[], Connection]


class CopyError(Exception):
    """The copy failed; the message is operator-facing (it becomes the step error).

    ``sqlstate`` carries the PostgreSQL SQLSTATE when a server error caused it (``57014`` when
    fencing cancelled the copy's queries)."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class CopyHooks(Protocol):
    """What the copy needs from its caller (the runner implements it over its run context).

    Every hook is called from the thread that called :func:`copy_catalog`, never from helper
    threads, except :meth:`register_connection`/:meth:`unregister_connection`, which must be
    thread-safe (the runner's registry takes a lock).
    """

    def log(self, level: str, message: str) -> None:
        """An op-log line; ``level`` is ``info``, ``warn`` or ``error``."""

    def progress(self, values: Mapping[str, int]) -> None:
        """Progress counters (``tables_total``, ``tables_done``, ``rows_copied``,
        ``bytes_copied``); called at most every 2 s."""

    def before_irreversible(self) -> None:
        """The pre-statement heartbeat (§4.1): called immediately before every ``DROP TABLE``;
        raise to keep the statement from being sent (fenced, self-fenced, store error)."""

    def register_connection(self, conn: Connection) -> None:
        """Make ``conn`` interruptible: fencing calls ``conn.cancel()`` on it."""

    def unregister_connection(self, conn: Connection) -> None:
        """``conn`` is about to be closed."""

    def stopped(self) -> bool:
        """True once the runner is stopping (SIGTERM, fencing): the copy aborts."""


@dataclass(frozen=True)
class TableCopy:
    name: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class Constraint:
    name: str
    contype: str
    definition: str


@dataclass(frozen=True)
class IndexDef:
    name: str
    definition: str


@dataclass(frozen=True)
class Column:
    name: str
    type_sql: str
    default: str | None
    not_null: bool


class ReleaseHandle:
    """The open source transaction holding the ``SHARE`` locks on every copied table.

    ``connection`` is usable for reads inside the copy's snapshot (verification).
    :meth:`release` rolls back and closes, idempotently and thread-safely; it never raises.
    """

    def __init__(self, conn: Connection, hooks: CopyHooks) -> None:
        self._conn = conn
        self._hooks = hooks
        self._lock = threading.Lock()
        self._released = False

    @property
    def connection(self) -> Connection:
        return self._conn

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        _close_quietly(self._conn, self._hooks, rollback=True)

    def __enter__(self) -> ReleaseHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class CopyResult:
    tables: tuple[TableCopy, ...]
    release: ReleaseHandle
    parallelism: int = 1

    @property
    def tables_copied(self) -> int:
        return len(self.tables)

    @property
    def rows_copied(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def bytes_copied(self) -> int:
        return sum(t.bytes for t in self.tables)


# --- catalog introspection (source side) ------------------------------------------------------

_DISCOVER = """
SELECT table_name::text FROM information_schema.tables
WHERE table_schema = 'public' AND table_type = 'BASE TABLE'
  AND table_name LIKE 'ducklake\\_%'
ORDER BY table_name COLLATE "C"
"""

_COLUMNS = """
SELECT c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod),
       pg_get_expr(d.adbin, d.adrelid), a.attnotnull
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = 'public' AND c.relname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""

# contype is the internal "char" type: cast to text, or psycopg hands back bytes (safeguard 32).
_CONSTRAINTS = """
SELECT c.relname::text, con.conname::text, con.contype::text, pg_get_constraintdef(con.oid)
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relname = ANY(%s)
ORDER BY c.relname, con.conname
"""

_INDEXES = """
SELECT i.tablename::text, i.indexname::text, i.indexdef
FROM pg_indexes i
WHERE i.schemaname = 'public' AND i.tablename = ANY(%s)
  AND NOT EXISTS (
    SELECT 1 FROM pg_constraint con
    WHERE con.conindid = format('%%I.%%I', i.schemaname, i.indexname)::regclass
      AND con.contype IN ('p', 'u', 'x'))
ORDER BY i.tablename, i.indexname
"""


def discover_tables(conn: Connection) -> list[str]:
    """The ``ducklake_*`` base tables of ``public``, sorted (byte order)."""
    return [str(row[0]) for row in conn.execute(_DISCOVER).fetchall()]


def table_columns(conn: Connection, tables: Sequence[str]) -> dict[str, list[Column]]:
    """Columns per table from ``pg_attribute``/``pg_attrdef`` in ``attnum`` order."""
    out: dict[str, list[Column]] = {t: [] for t in tables}
    for rel, name, type_sql, default, not_null in conn.execute(_COLUMNS, (list(tables),)):
        out[str(rel)].append(
            Column(str(name), str(type_sql), None if default is None else str(default),
                   bool(not_null))
        )  # fmt: skip
    return out


def create_table_sql(table: str, columns: Sequence[Column]) -> sql.Composed:
    """``CREATE TABLE "<t>" (…)`` from introspected columns; zero columns is an error."""
    if not columns:
        raise CopyError(f"table {table} has no columns on the source; refusing to copy it")
    parts = []
    for col in columns:
        part = sql.SQL("{} {}").format(sql.Identifier(col.name), sql.SQL(col.type_sql))
        if col.default is not None:
            part = sql.SQL("{} DEFAULT {}").format(part, sql.SQL(col.default))
        if col.not_null:
            part = sql.SQL("{} NOT NULL").format(part)
        parts.append(part)
    return sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(", ").join(parts))


def order_constraints(rows: Iterable[tuple[str, str, str]]) -> list[Constraint]:
    """``(name, contype, definition)`` rows ordered by name → constraints to replay.

    ``contype 'n'`` (PostgreSQL 18's catalogued NOT NULL) is skipped: older servers reject its
    syntax and ``CREATE TABLE`` already carries NOT NULL (safeguard 5). Foreign keys are moved
    last, keeping the name order otherwise (stable)."""
    kept = [Constraint(n, t, d) for n, t, d in sorted(rows, key=lambda r: r[0]) if t != "n"]
    return [c for c in kept if c.contype != "f"] + [c for c in kept if c.contype == "f"]


def table_constraints(conn: Connection, tables: Sequence[str]) -> dict[str, list[Constraint]]:
    raw: dict[str, list[tuple[str, str, str]]] = {t: [] for t in tables}
    for rel, name, contype, definition in conn.execute(_CONSTRAINTS, (list(tables),)):
        if not isinstance(contype, str):  # safeguard 32: never a "char" decoded as bytes
            raise CopyError(f"constraint {name} on {rel}: contype was not read as text")
        raw[str(rel)].append((str(name), contype, str(definition)))
    return {t: order_constraints(rows) for t, rows in raw.items()}


def table_indexes(conn: Connection, tables: Sequence[str]) -> dict[str, list[IndexDef]]:
    """Indexes not backing a ``p``/``u``/``x`` constraint, by name."""
    out: dict[str, list[IndexDef]] = {t: [] for t in tables}
    for rel, name, definition in conn.execute(_INDEXES, (list(tables),)):
        out[str(rel)].append(IndexDef(str(name), str(definition)))
    return out


# --- constraint and index replay (target side) --------------------------------------------------


def _drop_index_sql(name: str) -> sql.Composed:
    return sql.SQL("DROP INDEX IF EXISTS public.{}").format(sql.Identifier(name))


def apply_constraints(conn: Connection, table: str, constraints: Sequence[Constraint]) -> None:
    """``ALTER TABLE … ADD CONSTRAINT`` for each; ``p``/``u``/``x`` first drop a same-named
    index (a stale one on a reused target). Any error fails the copy."""
    for con in constraints:
        try:
            if con.contype in ("p", "u", "x"):
                conn.execute(_drop_index_sql(con.name))
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                    sql.Identifier(table), sql.Identifier(con.name), sql.SQL(con.definition)
                )
            )
        except psycopg.Error as exc:
            raise _db_error(f"constraint {con.name} on {table}", exc) from exc


def apply_index(
    conn: Connection,
    table: str,
    index: IndexDef,
    log: Callable[[str, str], None],
    *,
    attempts: int = INDEX_CREATE_ATTEMPTS,
) -> int:
    """Drop the index by name, then run its definition as is (never ``IF NOT EXISTS``: that
    would keep a wrong stale index). On 42P07 (a stale or concurrently created relation of that
    name) drop again and retry, ``attempts`` creates in all; any other error fails at once, as
    does a failing ``DROP INDEX``. Returns the number of create attempts used."""
    drop = _drop_index_sql(index.name)
    for attempt in range(1, attempts + 1):
        try:
            conn.execute(drop)
        except psycopg.Error as exc:
            raise _db_error(f"DROP INDEX {index.name} on {table}", exc) from exc
        try:
            conn.execute(sql.SQL(index.definition))
            return attempt
        except pg_errors.DuplicateTable as exc:
            if attempt >= attempts:
                raise CopyError(
                    f"index {index.name} on {table}: still colliding after {attempts} "
                    f"drop+create attempts (last error: {_one_line(exc)})",
                    sqlstate=exc.sqlstate,
                ) from exc
            log("warn", f"index {index.name} on {table} collided (42P07); dropping and retrying "
                        f"(attempt {attempt + 1} of {attempts})")  # fmt: skip
        except psycopg.Error as exc:
            raise _db_error(f"index {index.name} on {table}", exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


# --- the copy --------------------------------------------------------------------------------


@dataclass
class _Progress:
    hooks: CopyHooks
    tables_total: int
    interval: float
    tables_done: int = 0
    rows_copied: int = 0
    bytes_copied: int = 0
    _last: float = field(default=float("-inf"))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_copied += n

    def table_done(self, rows: int) -> None:
        with self._lock:
            self.tables_done += 1
            self.rows_copied += rows

    def maybe_emit(self, *, force_first: bool = False) -> None:
        """Main thread only. Writes when the interval elapsed since the last write."""
        now = time.monotonic()
        if now - self._last < self.interval and not (force_first and self._last == float("-inf")):
            return
        self._last = now
        with self._lock:
            values = {
                "tables_total": self.tables_total,
                "tables_done": self.tables_done,
                "rows_copied": self.rows_copied,
                "bytes_copied": self.bytes_copied,
            }
        self.hooks.progress(values)


def copy_catalog(
    source: ConnectionFactory,
    target: ConnectionFactory,
    hooks: CopyHooks,
    *,
    parallelism: int = 1,
    progress_interval: float = PROGRESS_INTERVAL_SECONDS,
) -> CopyResult:
    """Copy the source's ``ducklake_*`` tables to the target (spec §4.9).

    ``parallelism`` is ``DUCKGRES_RESHARD_COPY_PARALLELISM`` (the runner passes the setting):
    1 copies sequentially on the primary connections; N > 1 streams with N helper pairs.
    Returns per-table totals and the :class:`ReleaseHandle` holding the source write fence.
    Raises :class:`CopyError`; every connection is closed by then.
    """
    if parallelism < 1:
        raise CopyError(f"copy parallelism must be at least 1 (got {parallelism})")
    opened: list[Connection] = []
    src: Connection | None = None
    try:
        src = _open(source, hooks, opened, "source")
        tgt = _open(target, hooks, opened, "target")
        _fence_target(tgt)
        tables, columns, constraints, indexes = _fence_source(src, hooks)
        progress = _Progress(hooks, len(tables), progress_interval)
        progress.maybe_emit(force_first=True)
        if parallelism == 1 or len(tables) == 1:
            copied = _copy_sequential(src, tgt, tables, columns, hooks, progress)
            used = 1
        else:
            used = min(parallelism, len(tables))
            copied = _copy_parallel(
                src, tgt, source, target, tables, columns, hooks, progress, used
            )
        progress.maybe_emit()
        _replay(tgt, tables, constraints, indexes, hooks)
        _durable_commit(tgt)
        _close_quietly(tgt, hooks)  # releases the advisory-lock fence
        return CopyResult(tuple(copied), ReleaseHandle(src, hooks), used)
    except BaseException as exc:
        for conn in opened:
            _close_quietly(conn, hooks, rollback=True)
        if isinstance(exc, CopyError):
            raise
        if isinstance(exc, psycopg.Error):
            raise _db_error("copy failed", exc) from exc
        raise


def _open(factory: ConnectionFactory, hooks: CopyHooks, opened: list[Connection],
          side: str) -> Connection:  # fmt: skip
    try:
        conn = factory()
    except psycopg.Error as exc:
        raise _db_error(f"cannot connect to the {side}", exc) from exc
    opened.append(conn)
    hooks.register_connection(conn)
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise CopyError(
            f"the {side} connection factory returned a connection inside a transaction; "
            "open it with autocommit (a SET ROLE must already be in effect)"
        )
    try:
        conn.autocommit = True
        conn.execute("SET search_path = public")
        if side != "source":
            conn.execute("SET synchronous_commit = off")
    except psycopg.Error as exc:
        raise _db_error(f"cannot prepare the {side} connection", exc) from exc
    return conn


def _fence_target(tgt: Connection) -> None:
    try:
        row = tgt.execute("SELECT pg_try_advisory_lock(%s)", (TARGET_LOCK_KEY,)).fetchone()
    except psycopg.Error as exc:
        raise _db_error("target advisory lock", exc) from exc
    if not row or row[0] is not True:
        raise CopyError("target catalog is locked by another copier — refusing to interleave")


def _fence_source(
    src: Connection, hooks: CopyHooks
) -> tuple[list[str], dict[str, list[Column]], dict[str, list[Constraint]],
           dict[str, list[IndexDef]]]:  # fmt: skip
    try:
        src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        tables = discover_tables(src)
        if not tables:
            raise CopyError("source has no ducklake_% tables — refusing to copy an empty catalog")
        hooks.log("info", f"acquiring the source write fence on {len(tables)} tables…")
        src.execute(
            sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in tables)
            )
        )
        again = discover_tables(src)
        if again != tables:
            added = sorted(set(again) - set(tables))
            gone = sorted(set(tables) - set(again))
            raise CopyError(
                "source catalog table set changed while acquiring the write fence "
                f"(added: {', '.join(added) or 'none'}; removed: {', '.join(gone) or 'none'})"
            )
        columns = table_columns(src, tables)
        for table in tables:
            create_table_sql(table, columns[table])  # zero columns fails before any target write
        constraints = table_constraints(src, tables)
        indexes = table_indexes(src, tables)
    except psycopg.Error as exc:
        raise _db_error("acquiring the source write fence", exc) from exc
    hooks.log("info", f"source write fence held: SHARE locks on {len(tables)} tables")
    return tables, columns, constraints, indexes


def _recreate(tgt: Connection, table: str, columns: Sequence[Column], hooks: CopyHooks) -> None:
    """Pre-statement heartbeat, then ``DROP TABLE IF EXISTS … CASCADE; CREATE TABLE …`` in one
    round trip (a leftover of an earlier attempt is replaced)."""
    hooks.before_irreversible()
    statement = sql.SQL("DROP TABLE IF EXISTS {} CASCADE; {}").format(
        sql.Identifier(table), create_table_sql(table, columns)
    )
    try:
        tgt.execute(statement)
    except psycopg.Error as exc:
        raise _db_error(f"recreating {table} on the target", exc) from exc


def _drop(tgt: Connection, table: str, hooks: CopyHooks) -> None:
    """Pre-statement heartbeat, then ``DROP TABLE IF EXISTS … CASCADE``."""
    hooks.before_irreversible()
    try:
        tgt.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table)))
    except psycopg.Error as exc:
        raise _db_error(f"dropping {table} on the target", exc) from exc


def _copy_sequential(
    src: Connection,
    tgt: Connection,
    tables: Sequence[str],
    columns: Mapping[str, list[Column]],
    hooks: CopyHooks,
    progress: _Progress,
) -> list[TableCopy]:
    def on_block(n: int) -> None:
        progress.add_bytes(n)
        progress.maybe_emit()
        if hooks.stopped():
            raise CopyError("copy interrupted: the runner is stopping")

    copied: list[TableCopy] = []
    for table in tables:
        if hooks.stopped():
            raise CopyError("copy interrupted: the runner is stopping")
        _recreate(tgt, table, columns[table], hooks)
        done = stream_table(src, tgt, table, on_block)
        progress.table_done(done.rows)
        hooks.log("info", f"copied {table}: {done.rows} rows, {done.bytes} bytes")
        copied.append(done)
        progress.maybe_emit()
    return copied


def stream_table(
    src: Connection,
    tgt: Connection,
    table: str,
    on_block: Callable[[int], None] | None = None,
    *,
    pages: tuple[int, int | None] | None = None,
) -> TableCopy:
    """Binary ``COPY TO STDOUT`` of ``table`` on ``src`` streamed into ``COPY FROM STDIN`` on
    ``tgt`` (the table must exist there). Compares the two command-tag row counts.

    ``pages`` = ``(first, end)`` copies only the rows stored on heap pages ``first`` up to (not
    including) ``end`` (``None``: to the end), through a TID range scan (PostgreSQL 14+): the
    parallel copy splits large tables into such chunks."""
    ident = sql.Identifier(table)
    where = ""
    if pages is None:
        out_sql = sql.SQL("COPY {} TO STDOUT (FORMAT binary)").format(ident)
    else:
        first, end = pages
        cond = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({first},0)"))
        if end is not None:
            cond = sql.SQL("{} AND ctid < {}::tid").format(cond, sql.Literal(f"({end},0)"))
        out_sql = sql.SQL("COPY (SELECT * FROM {} WHERE {}) TO STDOUT (FORMAT binary)").format(
            ident, cond
        )
        where = f" (pages {first}..{'end' if end is None else end - 1})"
    try:
        in_sql = sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(ident)
        with src.cursor() as scur, tgt.cursor() as tcur:
            with scur.copy(out_sql), tcur.copy(in_sql) as inp:
                source_rows, nbytes = _pump(src.pgconn, src.info.encoding, inp.write, on_block)
            # Rows the target's COPY FROM command tag reported (psycopg: cursor.rowcount).
            target_rows = tcur.rowcount
    except psycopg.Error as exc:
        raise _db_error(f"copying {table}{where}", exc) from exc
    if source_rows != target_rows:
        raise CopyError(
            f"COPY row count mismatch on {table}: source COPY TO reported {source_rows} rows, "
            f"target COPY FROM reported {target_rows}{where}"
        )
    return TableCopy(table, source_rows, nbytes)


def _wait_readable(pgconn: pq.abc.PGconn) -> None:
    sock = pgconn.socket
    while True:
        ready, _, _ = select.select([sock], [], [], _WAIT_SLICE_SECONDS)
        if ready:
            pgconn.consume_input()
            return


def _pump(
    pgconn: pq.abc.PGconn, encoding: str, write: Callable[[bytearray], None],
    on_block: Callable[[int], None] | None,
) -> tuple[int, int]:  # fmt: skip
    """Drain a ``COPY TO STDOUT`` already started on ``pgconn`` into ``write`` in blocks;
    returns (rows from the command tag, bytes). Rows are never parsed."""
    block = bytearray()
    total = 0
    get = pgconn.get_copy_data
    while True:
        nbytes, data = get(1)
        if nbytes > 0:
            block += data
            if len(block) >= COPY_BLOCK_BYTES:
                write(block)
                total += len(block)
                if on_block is not None:
                    on_block(len(block))
                block = bytearray()
        elif nbytes == 0:
            _wait_readable(pgconn)
        elif nbytes == -1:
            break
        else:
            raise psycopg.OperationalError(pgconn.get_error_message())
    if block:
        write(block)
        total += len(block)
        if on_block is not None:
            on_block(len(block))
    rows = -1
    error: psycopg.Error | None = None
    while True:
        while pgconn.is_busy():
            _wait_readable(pgconn)
        res = pgconn.get_result()
        if res is None:
            break
        if res.status == pq.ExecStatus.COMMAND_OK:
            rows = res.command_tuples if res.command_tuples is not None else -1
        elif error is None:
            error = pg_errors.error_from_result(res, encoding=encoding)
    if error is not None:
        raise error
    return rows, total


# The parallel copy splits tables larger than this into chunks of about this size, so one big
# table (ducklake_file_column_stats holds most of a large catalog) is streamed by every helper
# instead of bounding the copy's wall time alone. PostgreSQL 14+ (TID range scans) only.
CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class _Chunk:
    table: str
    pages: tuple[int, int | None] | None  # None: the whole table
    # For a whole table in the parallel copy: the CREATE TABLE the helper runs first (the
    # primary target connection has dropped the table after the heartbeat).
    create: sql.Composed | None = None


def plan_chunks(
    src: Connection, tables: Sequence[str], chunk_bytes: int = CHUNK_BYTES
) -> dict[str, list[_Chunk]]:
    """Per table the work items of the parallel copy: the whole table, or page ranges of about
    ``chunk_bytes`` covering it (the last one open-ended). Page counts are read under the write
    fence, so no row can move to a page outside them."""
    whole = {t: [_Chunk(t, None)] for t in tables}
    if src.info.server_version < 140000:
        return whole
    rows = src.execute(
        "SELECT c.relname::text, pg_relation_size(c.oid), current_setting('block_size')::bigint "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relname = ANY(%s)",
        (list(tables),),
    ).fetchall()
    for name, size, block in rows:
        if int(size) < 2 * chunk_bytes:
            continue
        pages = int(size) // int(block)
        step = max(1, chunk_bytes // int(block))
        starts = list(range(0, pages, step))
        whole[str(name)] = [
            _Chunk(str(name), (first, starts[i + 1] if i + 1 < len(starts) else None))
            for i, first in enumerate(starts)
        ]
    return whole


@dataclass
class _Helper:
    src: Connection
    tgt: Connection
    thread: threading.Thread | None = None


def _copy_parallel(
    src: Connection,
    tgt: Connection,
    source: ConnectionFactory,
    target: ConnectionFactory,
    tables: Sequence[str],
    columns: Mapping[str, list[Column]],
    hooks: CopyHooks,
    progress: _Progress,
    n: int,
) -> list[TableCopy]:
    """The primary target connection drops each table (heartbeat first) and hands it to N helper
    pairs importing the primary's snapshot, which create and fill it (tables split into page
    ranges are created by the primary before their ranges are handed out). Helper targets take
    no lock and are committed and closed before this returns. Any helper error fails the copy."""
    try:
        row = src.execute("SELECT pg_export_snapshot()").fetchone()
    except psycopg.Error as exc:
        raise _db_error("exporting the source snapshot", exc) from exc
    snapshot = str(row[0]) if row else ""
    chunks = plan_chunks(src, tables, CHUNK_BYTES)
    helpers: list[_Helper] = []
    work: queue.Queue[_Chunk | None] = queue.Queue()
    events: queue.Queue[tuple[_Chunk, TableCopy | BaseException]] = queue.Queue()
    abort = threading.Event()
    opened: list[Connection] = []
    try:
        for i in range(n):
            hsrc = _open(source, hooks, opened, "source")
            try:
                hsrc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                hsrc.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            except psycopg.Error as exc:
                raise _db_error(f"helper {i + 1} importing the source snapshot", exc) from exc
            htgt = _open(target, hooks, opened, "target")
            helpers.append(_Helper(hsrc, htgt))

        def worker(helper: _Helper) -> None:
            try:
                while not abort.is_set():
                    chunk = work.get()
                    if chunk is None:
                        return
                    try:
                        if chunk.create is not None:
                            try:
                                helper.tgt.execute(chunk.create)
                            except psycopg.Error as exc:
                                raise _db_error(
                                    f"creating {chunk.table} on the target", exc
                                ) from exc
                        done = stream_table(
                            helper.src, helper.tgt, chunk.table, progress.add_bytes,
                            pages=chunk.pages,
                        )  # fmt: skip
                    except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                        events.put((chunk, exc))
                        return
                    events.put((chunk, done))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                events.put((_Chunk("", None), exc))

        for helper in helpers:
            helper.thread = threading.Thread(
                target=worker, args=(helper,), name="reshard-copy-helper", daemon=True
            )
            helper.thread.start()

        copied: dict[str, TableCopy] = {}
        partial: dict[str, list[TableCopy]] = {}

        def drain(timeout: float) -> None:
            try:
                chunk, payload = events.get(timeout=timeout)
            except queue.Empty:
                return
            while True:
                if isinstance(payload, BaseException):
                    raise payload
                parts = partial.setdefault(chunk.table, [])
                parts.append(payload)
                if len(parts) == len(chunks[chunk.table]):
                    done = TableCopy(
                        chunk.table, sum(p.rows for p in parts), sum(p.bytes for p in parts)
                    )
                    copied[chunk.table] = done
                    progress.table_done(done.rows)
                    hooks.log("info", f"copied {done.name}: {done.rows} rows, {done.bytes} bytes")
                try:
                    chunk, payload = events.get_nowait()
                except queue.Empty:
                    return

        for table in tables:
            if hooks.stopped():
                raise CopyError("copy interrupted: the runner is stopping")
            if len(chunks[table]) > 1:
                _recreate(tgt, table, columns[table], hooks)
                for chunk in chunks[table]:
                    work.put(chunk)
            else:
                # CREATE TABLE costs milliseconds (catalog rows, files): done by the helpers in
                # parallel; the irreversible DROP stays here, after the heartbeat.
                _drop(tgt, table, hooks)
                work.put(_Chunk(table, None, create_table_sql(table, columns[table])))
            drain(0)
            progress.maybe_emit()
        for _ in helpers:
            work.put(None)
        while len(copied) < len(tables):
            if hooks.stopped():
                raise CopyError("copy interrupted: the runner is stopping")
            drain(0.2)
            progress.maybe_emit()
        for helper in helpers:
            if helper.thread is not None:
                helper.thread.join()
        for helper in helpers:
            helper.src.rollback()
            _close_quietly(helper.src, hooks)
            _close_quietly(helper.tgt, hooks)
        return [copied[t] for t in tables]
    except BaseException:
        abort.set()
        for helper in helpers:  # unblock helpers stuck in a query, then let them exit
            for conn in (helper.src, helper.tgt):
                try:
                    conn.cancel_safe(timeout=5)
                except Exception:  # noqa: BLE001,S112 - best effort: closed already
                    continue
        while True:
            try:
                work.get_nowait()
            except queue.Empty:
                break
        for _ in helpers:
            work.put(None)
        for helper in helpers:
            if helper.thread is not None:
                helper.thread.join(timeout=30)
        for conn in opened:
            _close_quietly(conn, hooks, rollback=True)
        raise


def _replay(
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


def _durable_commit(tgt: Connection) -> None:
    """Flush the WAL of every asynchronously committed copy statement: a synchronous commit of a
    transaction with an xid waits for the WAL up to its commit record, which follows them all."""
    try:
        tgt.execute("SET synchronous_commit = on")
        tgt.execute("SELECT txid_current()")  # assigns an xid on every server version
    except psycopg.Error as exc:
        raise _db_error("flushing the target's WAL", exc) from exc


# --- rollback -----------------------------------------------------------------------------------


def drop_ducklake_tables(target_conn: Connection, hooks: CopyHooks) -> list[str]:
    """Drop every ``ducklake_*`` table of the target's ``public`` schema (``CASCADE``), each
    after the pre-statement heartbeat, logging each (rollback, spec §4.6 step 3). The caller
    opens and closes ``target_conn`` (autocommit is switched on here). Returns the names."""
    dropped: list[str] = []
    try:
        target_conn.autocommit = True
        names = [
            str(row[0])
            for row in target_conn.execute(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'ducklake\\_%' ORDER BY tablename COLLATE \"C\""
            )
        ]
        for name in names:
            hooks.before_irreversible()
            target_conn.execute(
                sql.SQL("DROP TABLE IF EXISTS public.{} CASCADE").format(sql.Identifier(name))
            )
            hooks.log("info", f"dropped {name} on the target")
            dropped.append(name)
    except psycopg.Error as exc:
        raise _db_error("dropping the target's ducklake_* tables", exc) from exc
    return dropped


# --- helpers ---------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _db_error(context: str, exc: psycopg.Error) -> CopyError:
    state = exc.sqlstate
    suffix = f" (SQLSTATE {state})" if state else ""
    return CopyError(f"{context}: {_one_line(exc)}{suffix}", sqlstate=state)


def _close_quietly(conn: Connection, hooks: CopyHooks, *, rollback: bool = False) -> None:
    """Unregister and close ``conn``; never raises. A query still running on it is cancelled
    first (a backend waiting on a lock does not notice a closed socket), and with ``rollback``
    an open transaction is rolled back explicitly before the close."""
    with contextlib.suppress(Exception):
        hooks.unregister_connection(conn)
    if conn.closed:
        return
    status = conn.info.transaction_status
    try:
        if status == pq.TransactionStatus.ACTIVE:
            conn.cancel_safe(timeout=2)
        elif rollback and status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
            conn.rollback()
    except Exception:  # noqa: BLE001,S110 - the close below ends the session anyway
        pass
    with contextlib.suppress(Exception):
        conn.close()
