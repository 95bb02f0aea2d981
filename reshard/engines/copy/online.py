"""The online copy's two halves (docs/copy.md "Online copy: the engine"): the **pre-copy**,
under one snapshot while the tenant keeps writing, and the **catch-up**, under the write fence.

- :func:`precopy_catalog` copies, inside one ``REPEATABLE READ READ ONLY`` transaction that
  takes no lock beyond what each ``COPY`` holds while it reads, the tables that carry the
  capture trigger (``reshard.engines.capture``), and records that transaction's snapshot (the
  *marker*). The tenant's commits go on; each changed row is recorded by the trigger.
- :func:`advance` (any number of rounds, the tenant still writing) applies what changed since
  the last marker and moves the marker on, so what is left for the fenced catch-up stays small.
- :func:`catch_up` then takes the same write fence as the offline copy (``SHARE`` locks on every
  ``ducklake_*`` table inside one ``REPEATABLE READ`` transaction, held by the returned
  :class:`~reshard.engines.copy.catalog.ReleaseHandle` for the verification), and in ONE target
  transaction: drops the tables the tenant dropped since, applies every change the marker did
  not see to the tables that stayed, and copies whole every table that has no trigger (created
  after the capture was installed). A table whose columns changed since the pre-copy fails the
  catch-up (its changes could not be applied faithfully); the operation then rolls back and can
  run offline.

Invariants: the pre-copy never writes to the source and holds no lock after it returns; the
catch-up writes the target only after the source is fenced, and commits all of it or nothing;
neither removes the capture (the caller does, on every terminal path:
``reshard.engines.capture.remove``). Whether the target equals the source is not decided here:
the caller verifies through the handle's snapshot (``reshard.engines.verify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from reshard.engines import capture
from reshard.engines.copy import introspection, pump
from reshard.engines.copy.base import (
    PROGRESS_INTERVAL_SECONDS,
    Connection,
    ConnectionFactory,
    CopyError,
    CopyHooks,
    TableCopy,
    close_quietly,
    db_error,
    open_connection,
    qualified,
)
from reshard.engines.copy.catalog import (
    ReleaseHandle,
    copy_tables,
    fence_target,
    lock_source,
)
from reshard.engines.copy.replay import drop_table, durable_commit, recreate_table, replay
from reshard.engines.copy.shape import Catalog, read_catalog


@dataclass(frozen=True)
class Precopied:
    """What the pre-copy copied, and the snapshot it saw."""

    marker: str
    tables: tuple[TableCopy, ...]
    # A digest of each table's pg_attribute rows as the pre-copy's snapshot read them: the
    # fenced catch-up reads them again and compares (no shaping inside the window).
    columns: dict[str, str] = field(repr=False)
    last_round: int = 0  # changes the last catch-up round applied (0 after the pre-copy)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)


@dataclass
class CaughtUp:
    """What the catch-up did; ``release`` holds the fenced source snapshot."""

    applied: capture.Applied
    created: tuple[TableCopy, ...]
    dropped: tuple[str, ...]
    release: ReleaseHandle


def precopy_catalog(
    source: ConnectionFactory,
    target: ConnectionFactory,
    hooks: CopyHooks,
    *,
    parallelism: int = 1,
    progress_interval: float = PROGRESS_INTERVAL_SECONDS,
) -> Precopied:
    """Copy the captured tables under one snapshot, the tenant writing on; see the module."""
    if parallelism < 1:
        raise CopyError(f"copy parallelism must be at least 1 (got {parallelism})")
    opened: list[Connection] = []
    try:
        src = open_connection(source, hooks, opened, "source")
        tgt = open_connection(target, hooks, opened, "target")
        fence_target(tgt)
        marker, tables, catalog, columns = _snapshot(src, hooks)
        copied, _ = copy_tables(
            (src, source), (tgt, target), tables, catalog, hooks, parallelism, progress_interval
        )
        refuse_lookup_prefix(tgt)
        hooks.log("info", f"pre-copy complete: {len(copied)} tables under snapshot {marker}")
        return Precopied(marker, tuple(copied), columns)
    except (capture.CaptureError, psycopg.Error) as exc:
        raise _failed("pre-copy", exc) from exc
    finally:
        for conn in opened:
            close_quietly(conn, hooks, rollback=True)


def _snapshot(src: Connection, hooks: CopyHooks) -> tuple[str, list[str], Catalog, dict[str, str]]:
    try:
        src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        marker = capture.snapshot_marker(src)
        tables = capture.installed_tables(src)
        if not tables:
            raise CopyError(
                "no source table carries the change capture — install it before the pre-copy"
            )
        catalog = read_catalog(src, tables)
        columns = introspection.read_column_digests(src, tables)
    except psycopg.Error as exc:
        raise db_error("opening the pre-copy snapshot", exc) from exc
    hooks.log("info", f"pre-copy snapshot {marker}: {len(tables)} captured tables")
    return marker, tables, catalog, columns


def advance(
    source: ConnectionFactory,
    target: ConnectionFactory,
    hooks: CopyHooks,
    precopied: Precopied,
) -> Precopied:
    """One catch-up round **before** the block, the tenant writing on: in a new ``REPEATABLE
    READ READ ONLY`` snapshot of the source, apply to the target (one transaction) the changes
    that snapshot sees and the previous marker did not, to the tables both still have; return
    the same copy under the new marker. Repeated until few changes are left, it keeps what the
    fenced catch-up must apply, and so the window, small however long the pre-copy took.
    Tables created or dropped meanwhile are left to the fenced catch-up (a new table carries
    no trigger, so only a copy under the fence is exact)."""
    opened: list[Connection] = []
    try:
        src = open_connection(source, hooks, opened, "source")
        tgt = open_connection(target, hooks, opened, "target")
        fence_target(tgt)
        src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        marker = capture.snapshot_marker(src)
        present = set(introspection.discover_tables(src))
        kept = {t for t in precopied.names if t in present}
        large = {t.name for t in precopied.tables if t.rows >= LOOKUP_MIN_ROWS}
        rewritten = capture.rewritten_tables(src, precopied.marker)
        helped = add_lookup_indexes(tgt, [t for t in rewritten if t in kept and t in large])
        if helped:
            hooks.log("info", f"{helped} lookup indexes built for the catch-up")
        with tgt.transaction():
            applied = capture.apply(tgt, capture.pending(src, precopied.marker), kept)
        durable_commit(tgt)
        hooks.log("info", f"catch-up round: {applied.total} changes applied, now at {marker}")
        return Precopied(marker, precopied.tables, precopied.columns, applied.total)
    except (capture.CaptureError, psycopg.Error) as exc:
        raise _failed("catch-up round", exc) from exc
    finally:
        for conn in opened:
            close_quietly(conn, hooks, rollback=True)


def catch_up(
    source: ConnectionFactory,
    target: ConnectionFactory,
    hooks: CopyHooks,
    precopied: Precopied,
) -> CaughtUp:
    """Fence the source and bring the target to it; see the module."""
    opened: list[Connection] = []
    src: Connection | None = None
    try:
        src = open_connection(source, hooks, opened, "source")
        tgt = open_connection(target, hooks, opened, "target")
        # The changes are read on a session of their own, its snapshot taken after the fence
        # is up (so they are all there): the fence's transaction then holds no lock on the
        # change table, and the caller can remove the capture while the fence stays up for the
        # verification. Connected before the fence: a connection costs the window ~20 ms.
        chg = open_connection(source, hooks, opened, "source")
        fence_target(tgt)
        # The fence without the offline copy's shaping of every table: inside the window only
        # the kept tables' columns are read (a digest, compared) and only the tables created
        # since the pre-copy are shaped, for their whole copy.
        now = lock_source(src, hooks)
        chg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # Sets, not lists: at 2,029 catalog tables list membership cost the window 0.5 s.
        present, before = set(now), set(precopied.names)
        kept = [t for t in precopied.names if t in present]
        dropped = tuple(t for t in precopied.names if t not in present)
        created_names = [t for t in now if t not in before]
        _same_columns(kept, introspection.read_column_digests(src, kept), precopied)
        new = read_catalog(src, created_names)
        with tgt.transaction():
            for table in dropped:
                drop_table(tgt, table, hooks)
            applied = capture.apply(tgt, capture.pending(chg, precopied.marker), set(kept))
            created = _copy_whole(src, tgt, created_names, new, hooks)
            drop_lookup_indexes(tgt)
        durable_commit(tgt)
        close_quietly(tgt, hooks)
        close_quietly(chg, hooks, rollback=True)
        hooks.log(
            "info",
            f"catch-up applied {applied.total} changes ({applied.inserted} inserted, "
            f"{applied.updated} updated, {applied.deleted} deleted); copied "
            f"{len(created)} new tables whole, dropped {len(dropped)}",
        )
        return CaughtUp(applied, tuple(created), dropped, ReleaseHandle(src, hooks))
    except BaseException as exc:
        for conn in opened:
            close_quietly(conn, hooks, rollback=True)
        if isinstance(exc, (capture.CaptureError, psycopg.Error)):
            raise _failed("catch-up", exc) from exc
        raise


# --- lookup indexes for the catch-up ------------------------------------------------------------
# A change that updates or deletes a row finds it on the target by its whole old image; most
# ``ducklake_*`` tables have no index, so each such change would scan its whole table (a
# DuckDB commit updates the stats rows of its table, on a 20,000-table catalog a scan of
# hundreds of thousands of rows). Each catch-up round before the block gives the target a btree
# index on the first column (the id a DuckLake table is keyed by: ``table_id``,
# ``data_file_id``, ``row_id``…) of every table that has an update or a delete among its
# changes, has LOOKUP_MIN_ROWS rows or more and no index leading with that column; the apply
# names that column in its predicate. The indexes are the target's own, built before the block,
# and dropped in the catch-up's transaction, so the catalog that is flipped to is the source's,
# index for index. Only those tables: dropping an index costs the window, the more the larger
# its table (its files are unlinked at the commit). Indexing every copied table cost 0.39 s for
# 729 small ones at 7,000 DuckLake tables, and 1.28 s for 10 large ones at 20,000 (one on the
# 200 M-row ``ducklake_schema_versions``, which DuckDB only ever inserts into); a scan of a
# small table costs less than its index.
LOOKUP_PREFIX = "duckgres_catchup_"
LOOKUP_MIN_ROWS = 1000


def refuse_lookup_prefix(tgt: Connection) -> None:
    """Refused when the catalog has a relation of the lookup indexes' prefix already (the
    catch-up drops every index so named)."""
    if _lookup_index_names(tgt):
        raise CopyError(
            f"the catalog has a relation named {LOOKUP_PREFIX}…, a prefix the online copy "
            "reserves for its own lookup indexes: run the operation offline"
        )


def add_lookup_indexes(tgt: Connection, tables: Sequence[str]) -> int:
    """Index the first column of each of ``tables`` on the target that no index leads with
    (numbered after the ones already built); how many were built."""
    rows = capture.first_columns(tgt, tables, unindexed=True)
    start = len(_lookup_index_names(tgt))
    for number, (table, column) in enumerate(rows.items(), start=start):
        tgt.execute(
            sql.SQL("CREATE INDEX {} ON {} ({})").format(
                sql.Identifier(f"{LOOKUP_PREFIX}{number}"), qualified(str(table)),
                sql.Identifier(str(column)),
            )
        )  # fmt: skip
    return len(rows)


def _lookup_index_names(tgt: Connection) -> list[str]:
    rows = tgt.execute(
        "SELECT c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relname LIKE %s",
        (LOOKUP_PREFIX.replace("_", "\\_") + "%",),
    ).fetchall()
    return [str(r[0]) for r in rows]


def drop_lookup_indexes(tgt: Connection) -> None:
    """All of them in ONE statement (inside the window: one per table took 1.6 s at 20,000
    DuckLake tables)."""
    names = _lookup_index_names(tgt)
    if names:
        tgt.execute(
            sql.SQL("DROP INDEX {}").format(
                sql.SQL(", ").join(sql.SQL("public.{}").format(sql.Identifier(n)) for n in names)
            )
        )


def _same_columns(kept: Sequence[str], now: dict[str, str], precopied: Precopied) -> None:
    changed = [t for t in kept if now.get(t) != precopied.columns.get(t)]
    if changed:
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise CopyError(
            f"the columns of {', '.join(changed[:5])}{more} changed since the pre-copy (or the "
            "table was dropped and created again): their changes cannot be applied "
            "faithfully; run the operation offline"
        )


def _copy_whole(
    src: Connection, tgt: Connection, tables: Sequence[str], catalog: Catalog, hooks: CopyHooks
) -> list[TableCopy]:
    copied = []
    for table in tables:
        recreate_table(tgt, table, catalog.columns[table], hooks)
        copied.append(pump.stream_table(src, tgt, table))
    replay(tgt, tables, catalog.constraints, catalog.indexes, hooks)
    return copied


def _failed(what: str, exc: capture.CaptureError | psycopg.Error) -> CopyError:
    if isinstance(exc, capture.CaptureError):
        return CopyError(f"{what}: {exc}")
    return db_error(f"{what} failed", exc)
