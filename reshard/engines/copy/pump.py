"""The row pump: a binary ``COPY … TO STDOUT`` drained straight off libpq into the target's
``COPY … FROM STDIN`` in 256 KiB blocks. Rows are never parsed or formatted in Python; the two
command-tag row counts are compared. ``stream_table`` is the seam the tests and the bench wrap."""

from __future__ import annotations

import select
from collections.abc import Callable

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql

from reshard.engines.copy.base import Connection, CopyError, TableCopy, db_error, qualified

# Blocks written to the target: big enough that per-write overhead vanishes, small enough to
# keep the copy's memory flat (one block per stream).
COPY_BLOCK_BYTES = 256 * 1024


_WAIT_SLICE_SECONDS = 1.0


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
    ident = qualified(table)
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
        raise db_error(f"copying {table}{where}", exc) from exc
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
