"""The parallel copy: N helper connection pairs importing the primary's exported snapshot,
fed whole tables and page ranges of large ones (TID range scans, PostgreSQL 14+), while the
primary target connection keeps every irreversible ``DROP`` behind the heartbeat."""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from reshard.engines.copy import pump
from reshard.engines.copy.base import (
    Connection,
    ConnectionFactory,
    CopyError,
    CopyHooks,
    Progress,
    TableCopy,
    close_quietly,
    db_error,
    execute_one,
    open_connection,
)
from reshard.engines.copy.replay import drop_table, recreate_table
from reshard.engines.copy.shape import Column, create_table_sql

# The parallel copy splits tables larger than this into chunks of about this size, so one big
# table (ducklake_file_column_stats holds most of a large catalog) is streamed by every helper
# instead of bounding the copy's wall time alone. PostgreSQL 14+ (TID range scans) only.
CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    table: str
    pages: tuple[int, int | None] | None  # None: the whole table
    # For a whole table in the parallel copy: the CREATE TABLE the helper runs first (the
    # primary target connection has dropped the table after the heartbeat).
    create: sql.Composed | None = None


def plan_chunks(
    src: Connection, tables: Sequence[str], chunk_bytes: int = CHUNK_BYTES
) -> dict[str, list[Chunk]]:
    """Per table the work items of the parallel copy: the whole table, or page ranges of about
    ``chunk_bytes`` covering it (the last one open-ended). Page counts are read under the write
    fence, so no row can move to a page outside them."""
    whole = {t: [Chunk(t, None)] for t in tables}
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
            Chunk(str(name), (first, starts[i + 1] if i + 1 < len(starts) else None))
            for i, first in enumerate(starts)
        ]
    return whole


@dataclass
class _Helper:
    src: Connection
    tgt: Connection
    thread: threading.Thread | None = None


@dataclass
class _Pool:
    """The helper pairs of the parallel copy, their work queue and the events they report."""

    helpers: list[_Helper] = field(default_factory=list)
    opened: list[Connection] = field(default_factory=list)
    work: queue.Queue[Chunk | None] = field(default_factory=queue.Queue)
    events: queue.Queue[tuple[Chunk, TableCopy | BaseException]] = field(
        default_factory=queue.Queue
    )
    abort: threading.Event = field(default_factory=threading.Event)

    def open(
        self,
        source: ConnectionFactory,
        target: ConnectionFactory,
        hooks: CopyHooks,
        snapshot: str,
        n: int,
    ) -> None:
        """Open ``n`` helper pairs, each source importing ``snapshot``."""
        for i in range(n):
            hsrc = open_connection(source, hooks, self.opened, "source")
            try:
                hsrc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                hsrc.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            except psycopg.Error as exc:
                raise db_error(f"helper {i + 1} importing the source snapshot", exc) from exc
            htgt = open_connection(target, hooks, self.opened, "target")
            self.helpers.append(_Helper(hsrc, htgt))

    def start(self, progress: Progress) -> None:
        """Start one worker thread per helper pair."""
        for helper in self.helpers:
            helper.thread = threading.Thread(
                target=self._worker,
                args=(helper, progress),
                name="reshard-copy-helper",
                daemon=True,
            )
            helper.thread.start()

    def _worker(self, helper: _Helper, progress: Progress) -> None:
        """Thread body: copy chunks until a sentinel or the abort; report each result or error."""
        try:
            while not self.abort.is_set():
                chunk = self.work.get()
                if chunk is None:
                    return
                try:
                    if chunk.create is not None:
                        try:
                            execute_one(helper.tgt, chunk.create)
                        except psycopg.Error as exc:
                            raise db_error(f"creating {chunk.table} on the target", exc) from exc
                    done = pump.stream_table(
                        helper.src, helper.tgt, chunk.table, progress.add_bytes,
                        pages=chunk.pages,
                    )  # fmt: skip
                except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                    self.events.put((chunk, exc))
                    return
                self.events.put((chunk, done))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.events.put((Chunk("", None), exc))

    def release(self) -> None:
        """Queue one stop sentinel per helper."""
        for _ in self.helpers:
            self.work.put(None)

    def close(self, hooks: CopyHooks) -> None:
        """Join the workers, then end the helper sources' snapshots and close every helper."""
        for helper in self.helpers:
            if helper.thread is not None:
                helper.thread.join()
        for helper in self.helpers:
            helper.src.rollback()
            close_quietly(helper.src, hooks)
            close_quietly(helper.tgt, hooks)

    def shut_down(self, hooks: CopyHooks) -> None:
        """On failure: cancel the helpers' queries, stop the workers, close every connection."""
        self.abort.set()
        for helper in self.helpers:  # unblock helpers stuck in a query, then let them exit
            for conn in (helper.src, helper.tgt):
                try:
                    conn.cancel_safe(timeout=5)
                except Exception:  # noqa: BLE001,S112 - best effort: closed already
                    continue
        while True:
            try:
                self.work.get_nowait()
            except queue.Empty:
                break
        self.release()
        for helper in self.helpers:
            if helper.thread is not None:
                helper.thread.join(timeout=30)
        for conn in self.opened:
            close_quietly(conn, hooks, rollback=True)


@dataclass
class _Results:
    """Sums the chunks the helpers report into finished tables (raising a helper's error)."""

    events: queue.Queue[tuple[Chunk, TableCopy | BaseException]]
    chunks: Mapping[str, list[Chunk]]
    progress: Progress
    hooks: CopyHooks
    copied: dict[str, TableCopy] = field(default_factory=dict)
    partial: dict[str, list[TableCopy]] = field(default_factory=dict)

    def drain(self, timeout: float) -> None:
        """Take every reported event, waiting at most ``timeout`` for the first one."""
        try:
            chunk, payload = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            if isinstance(payload, BaseException):
                raise payload
            parts = self.partial.setdefault(chunk.table, [])
            parts.append(payload)
            if len(parts) == len(self.chunks[chunk.table]):
                done = TableCopy(
                    chunk.table, sum(p.rows for p in parts), sum(p.bytes for p in parts)
                )
                self.copied[chunk.table] = done
                self.progress.table_done(done.rows)
                self.hooks.log("info", f"copied {done.name}: {done.rows} rows, {done.bytes} bytes")
            try:
                chunk, payload = self.events.get_nowait()
            except queue.Empty:
                return


def _export_snapshot(src: Connection) -> str:
    """Export the primary source's snapshot for the helpers to import."""
    try:
        row = src.execute("SELECT pg_export_snapshot()").fetchone()
    except psycopg.Error as exc:
        raise db_error("exporting the source snapshot", exc) from exc
    return str(row[0]) if row else ""


def _hand_out(
    tgt: Connection,
    tables: Sequence[str],
    columns: Mapping[str, list[Column]],
    hooks: CopyHooks,
    progress: Progress,
    pool: _Pool,
    results: _Results,
) -> None:
    """Drop (or recreate) each table on the primary target and queue its chunks."""
    for table in tables:
        if hooks.stopped():
            raise CopyError("copy interrupted: the runner is stopping")
        if len(results.chunks[table]) > 1:
            recreate_table(tgt, table, columns[table], hooks)
            for chunk in results.chunks[table]:
                pool.work.put(chunk)
        else:
            # CREATE TABLE costs milliseconds (catalog rows, files): done by the helpers in
            # parallel; the irreversible DROP stays here, after the heartbeat.
            drop_table(tgt, table, hooks)
            pool.work.put(Chunk(table, None, create_table_sql(table, columns[table])))
        results.drain(0)
        progress.maybe_emit()


def copy_parallel(
    src: Connection,
    tgt: Connection,
    source: ConnectionFactory,
    target: ConnectionFactory,
    tables: Sequence[str],
    columns: Mapping[str, list[Column]],
    hooks: CopyHooks,
    progress: Progress,
    n: int,
) -> list[TableCopy]:
    """The primary target connection drops each table (heartbeat first) and hands it to N helper
    pairs importing the primary's snapshot, which create and fill it (tables split into page
    ranges are created by the primary before their ranges are handed out). Helper targets take
    no lock and are committed and closed before this returns. Any helper error fails the copy."""
    snapshot = _export_snapshot(src)
    chunks = plan_chunks(src, tables, CHUNK_BYTES)
    pool = _Pool()
    try:
        pool.open(source, target, hooks, snapshot, n)
        pool.start(progress)
        results = _Results(pool.events, chunks, progress, hooks)
        _hand_out(tgt, tables, columns, hooks, progress, pool, results)
        pool.release()
        while len(results.copied) < len(tables):
            if hooks.stopped():
                raise CopyError("copy interrupted: the runner is stopping")
            results.drain(0.2)
            progress.maybe_emit()
        pool.close(hooks)
        return [results.copied[t] for t in tables]
    except BaseException:
        pool.shut_down(hooks)
        raise
