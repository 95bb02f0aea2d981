"""The heartbeat thread: proves ownership and enforces the self-fence (spec reshard §4.1).

A daemon thread with its own config-store connection (Django connections are per thread; it
closes its own at exit). Every ``DUCKGRES_RESHARD_HEARTBEAT_SECONDS`` it sends the fenced
heartbeat write:
- ``Fenced`` → the run context's ``fenced`` and ``stop`` are set and in-flight work is
  interrupted (registered psycopg connections get ``cancel()``, child processes are killed);
- any other error (store outage, broken connection) is a warning: ownership is kept and the
  next tick retries; the broken connection is dropped so the next tick reconnects.

A second daemon thread checks, at most every ``DUCKGRES_RESHARD_POLL_SECONDS``, the age of the
last successful fenced write; past ``stale - 60`` seconds it self-fences exactly as for
``Fenced``. It never touches the store, so a beat hanging on a partitioned network cannot delay
it. Every beat also retries buffered op-log lines.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection

from reshard.runner.context import RunContext
from reshard.runner.errors import Fenced
from reshard.runner.logwriter import OpLogWriter

FENCED_MESSAGE = "operation fenced: another runner took over; this runner abandons it"


def log_fenced_once(ctx: RunContext, oplog: OpLogWriter, message: str = FENCED_MESSAGE) -> None:
    """Set the fencing flags and log the one ERROR line, once per runner."""
    if ctx.mark_fenced():
        oplog.error(message)


class Heartbeat:
    def __init__(
        self,
        ctx: RunContext,
        oplog: OpLogWriter,
        beat: Callable[[], None],
        *,
        interval: float | None = None,
        stale_seconds: float | None = None,
        poll_seconds: float | None = None,
    ) -> None:
        self.ctx = ctx
        self.oplog = oplog
        self.beat = beat
        self.interval = float(interval or settings.DUCKGRES_RESHARD_HEARTBEAT_SECONDS)
        self.stale = float(stale_seconds or settings.DUCKGRES_RESHARD_STALE_SECONDS)
        poll = float(poll_seconds or settings.DUCKGRES_RESHARD_POLL_SECONDS)
        self.slice = max(0.05, min(poll, self.interval))
        self._done = threading.Event()
        # Two threads, so a beat blocked on an unreachable store (no RST, no timeout) can
        # never delay the self-fence check.
        self._beater = threading.Thread(
            target=self._beat_loop, name="reshard-heartbeat", daemon=True
        )
        self._watcher = threading.Thread(
            target=self._watch_loop, name="reshard-self-fence", daemon=True
        )

    @property
    def self_fence_after(self) -> float:
        return self.stale - 60

    def start(self) -> None:
        self._beater.start()
        self._watcher.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop both threads; joins the beater so no beat is in flight afterwards."""
        self._done.set()
        for thread in (self._watcher, self._beater):
            if thread.is_alive():
                thread.join(timeout)

    def _beat_loop(self) -> None:
        try:
            while not self._done.wait(self.interval) and not self.ctx.fenced:
                self.tick()
                if self.ctx.fenced:
                    break
                with contextlib.suppress(Exception):
                    self.oplog.flush()
        finally:
            with contextlib.suppress(DatabaseError, InterfaceError):
                connection.close()

    def _watch_loop(self) -> None:
        while not self._done.wait(self.slice) and not self.ctx.fenced:
            self.check_self_fence()

    def tick(self) -> None:
        """One heartbeat: ``Fenced`` fences, any other error is a warning (retry next tick)."""
        try:
            self.beat()
        except Fenced:
            log_fenced_once(self.ctx, self.oplog)
        except Exception as exc:  # noqa: BLE001 - anything but Fenced is transient (spec §4.1)
            self.oplog.warn(
                f"heartbeat write failed (will retry in {self.interval:g} s; ownership kept): {exc}"
            )
            with contextlib.suppress(DatabaseError, InterfaceError):
                connection.close()

    def check_self_fence(self) -> None:
        age = self.ctx.seconds_since_write()
        if age > self.self_fence_after and not self.ctx.fenced:
            log_fenced_once(
                self.ctx,
                self.oplog,
                f"runner self-fenced: no successful heartbeat for {int(age)} s (stale window "
                f"{int(self.stale)} s); abandoning the operation to a takeover",
            )
