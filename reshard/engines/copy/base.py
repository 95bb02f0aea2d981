"""What every part of the catalog copy shares: its connection type, its one error, the hooks its
caller implements, per-table totals, the progress counter, and the few statement helpers that
keep every target statement alone on the extended query protocol and every name qualified."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from psycopg import pq, sql

from duckgres_admin.lib.pgadmin import pin_session
from reshard.engines import testhooks

PROGRESS_INTERVAL_SECONDS = 2.0


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


def execute_one(conn: Connection, statement: sql.SQL | sql.Composed) -> None:
    """One composed statement on the target, sent with the extended query protocol (binary
    results), which carries exactly one statement: nothing can ride along."""
    conn.execute(statement, binary=True)


@dataclass
class Progress:
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
        testhooks.kill_point("copy_table_done")  # tests only: a copy killed part-way

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


def open_connection(factory: ConnectionFactory, hooks: CopyHooks, opened: list[Connection],
          side: str) -> Connection:  # fmt: skip
    try:
        conn = factory()
    except psycopg.Error as exc:
        raise db_error(f"cannot connect to the {side}", exc) from exc
    opened.append(conn)
    hooks.register_connection(conn)
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise CopyError(
            f"the {side} connection factory returned a connection inside a transaction; "
            "open it with autocommit (a SET ROLE must already be in effect)"
        )
    try:
        conn.autocommit = True
        # search_path empty and row_security off (safeguard reshard-60), whatever the factory
        # did: every name below is schema-qualified, and a row-security policy on the source
        # fails the copy instead of running the tenant's code as this session's user.
        pin_session(conn)
        if side != "source":
            conn.execute("SET synchronous_commit = off")
    except psycopg.Error as exc:
        raise db_error(f"cannot prepare the {side} connection", exc) from exc
    return conn


def qualified(table: str) -> sql.Composed:
    return sql.SQL("public.{}").format(sql.Identifier(table))


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def db_error(context: str, exc: psycopg.Error) -> CopyError:
    state = exc.sqlstate
    suffix = f" (SQLSTATE {state})" if state else ""
    return CopyError(f"{context}: {one_line(exc)}{suffix}", sqlstate=state)


def close_quietly(conn: Connection, hooks: CopyHooks, *, rollback: bool = False) -> None:
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


def show(value: object) -> str:
    """An untrusted name as it appears in a message: quoted, escaped, at most 80 characters."""
    text = repr(str(value))
    return text if len(text) <= 80 else text[:77] + "…"
