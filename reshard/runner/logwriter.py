"""The runner's buffered op-log writer (spec reshard §2.7, §4.2 step 5).

Appends never fail a step: a line that cannot be inserted stays in a bounded in-memory buffer
(10,000 lines; overflow is counted as dropped) and is retried on every heartbeat tick and at
exit. The writer has its **own** autocommit connection to the config store, so a line written
while the main thread is inside a transaction persists even when that transaction rolls back,
and a failed insert never poisons the caller's transaction.

Every line is scrubbed here (the one place this sink is written) and mirrored to the process
log as structured JSON bound with ``op_id``, ``org_id`` and ``epoch``.

Tracebacks (safeguard reshard-70): :meth:`OpLogWriter.exception` renders an exception with its
traceback and chained causes and scrubs the *rendered text* with the per-op scrubber (resolved
provisioner, source and target passwords, SCRAM verifiers) before it reaches the op log or the
process log. :meth:`OpLogWriter.install_excepthooks` routes every uncaught exception of the
process (any thread) through it: Python's default hooks print raw tracebacks to stderr, which is
the runner's pod log, and the janitor copies a pod log into the op log masking only the shared
secrets (it does not know the op's). ``run_process`` is to install them right after creating its
writer.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg
import structlog
from django.conf import settings

from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.platform.names import runner_name

MAX_BUFFERED_LINES = 10_000
_LEVELS = {"info": "info", "warn": "warning", "error": "error"}


def config_store_connect(application_name: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A fresh autocommit psycopg connection to the config store (password as its own arg)."""
    db = settings.DATABASES["default"]
    options = {k: v for k, v in db.get("OPTIONS", {}).items() if k != "application_name"}
    return psycopg.connect(
        host=db.get("HOST") or None,
        port=int(db["PORT"]) if db.get("PORT") else None,
        dbname=db["NAME"],
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        application_name=application_name,
        connect_timeout=10,
        autocommit=True,
        # Detect a dead peer instead of hanging on a partitioned network (libpq settings).
        **{
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": 10_000,
            **options,
        },
    )


@dataclass
class _Line:
    level: str
    message: str
    epoch: int | None


class OpLogWriter:
    """Thread-safe, bounded, retrying op-log appender for one operation."""

    def __init__(self, op_id: int, scrubber: Scrubber, *, source: str = "runner") -> None:
        self.op_id = op_id
        self.scrubber = scrubber
        self.source = source
        self.epoch: int | None = None
        self.written = 0
        self.dropped = 0
        self._buffer: collections.deque[_Line] = collections.deque()
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._log: Any = structlog.get_logger("duckgres.reshard.runner").bind(op_id=op_id)

    def bind(self, **values: Any) -> None:
        """Bind process-log context (``org_id``, ``epoch``)."""
        self._log = self._log.bind(**values)
        if "epoch" in values:
            self.epoch = values["epoch"]

    # --- appends ----------------------------------------------------------------------------------
    def info(self, message: str) -> None:
        self.append("info", message)

    def warn(self, message: str) -> None:
        self.append("warn", message)

    def error(self, message: str) -> None:
        self.append("error", message)

    def exception(self, message: str, exc: BaseException, *, level: str = "error") -> None:
        """``message``, then the rendered traceback of ``exc`` (causes included), scrubbed as
        one text: a secret inside an exception message, an argument repr or a chained cause
        is masked like any other."""
        rendered = "".join(traceback.format_exception(exc)).rstrip()
        self.append(level, f"{message}\n{rendered}")

    def install_excepthooks(self) -> Callable[[], None]:
        """Send uncaught exceptions of every thread through :meth:`exception` (op log and
        process log, scrubbed) and print only the scrubbed text on stderr. Returns a function
        restoring the previous hooks."""
        previous_sys, previous_thread = sys.excepthook, threading.excepthook

        def report(kind: str, exc: BaseException) -> None:
            with contextlib.suppress(Exception):  # a failing sink must not hide the error
                self.exception(f"uncaught exception in {kind}", exc)
            text = "".join(traceback.format_exception(exc))
            with contextlib.suppress(Exception):
                sys.stderr.write(self.scrubber.scrub(text))

        def on_main(
            kind: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            report("the runner", exc.with_traceback(tb))

        def on_thread(args: threading.ExceptHookArgs) -> None:
            if args.exc_value is None or isinstance(args.exc_value, SystemExit):
                return
            name = args.thread.name if args.thread is not None else "a thread"
            report(f"thread {name}", args.exc_value.with_traceback(args.exc_traceback))

        sys.excepthook = on_main
        threading.excepthook = on_thread

        def restore() -> None:
            sys.excepthook = previous_sys
            threading.excepthook = previous_thread

        return restore

    def append(self, level: str, message: str) -> None:
        text = self.scrubber.scrub(message)
        getattr(self._log, _LEVELS[level])(text, source=self.source)
        with self._lock:
            if len(self._buffer) >= MAX_BUFFERED_LINES:
                self._buffer.popleft()
                self.dropped += 1
            self._buffer.append(_Line(level, text, self.epoch))
            self._flush_locked()

    def flush(self) -> bool:
        """Try to write every buffered line; True when the buffer is empty afterwards."""
        with self._lock:
            return self._flush_locked()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._buffer)

    def _flush_locked(self) -> bool:
        while self._buffer:
            line = self._buffer[0]
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = config_store_connect(runner_name(self.op_id, "-log"))
                self._conn.execute(
                    "INSERT INTO duckgres_reshard_operation_log "
                    "(operation_id, ts, level, message, runner_epoch, source) "
                    "VALUES (%s, now(), %s, %s, %s, %s)",
                    (self.op_id, line.level, line.message, line.epoch, self.source),
                )
            except psycopg.Error as exc:
                self._close_locked()
                self._log.warning(
                    "op-log append failed; line kept in the buffer",
                    error=self.scrubber.scrub(str(exc)),
                    buffered=len(self._buffer),
                )
                return False
            self._buffer.popleft()
            self.written += 1
        return True

    def _close_locked(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None

    def persist_marker(self, pod_name: str, pod_uid: str, epoch: int) -> None:
        """Flush, then append the ``runner log persisted`` marker (spec §4.2 step 5)."""
        with self._lock:
            self._flush_locked()
            lines = self.written
            dropped = self.dropped + len(self._buffer)
            marker = (
                f"runner log persisted: pod {pod_name} uid {pod_uid} epoch {epoch}, "
                f"{lines} lines ({dropped} dropped)"
            )
        self.append("info", marker)

    def close(self) -> None:
        with self._lock:
            self._close_locked()
