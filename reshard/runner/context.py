"""The run context shared by the runner's main thread, its heartbeat thread and signal handlers.

It holds (spec reshard §4.1, §4.2):
- ``stop``: a ``threading.Event`` set by SIGTERM/SIGINT or by fencing; every wait returns early
  on it (rollback waits ignore it but honour the SIGTERM budget);
- ``fenced``: set when ownership is lost (a fenced write matched zero rows) or given up
  (self-fence); a fenced runner makes no further side effect and no terminal write;
- a registry of interruptible resources (psycopg connections, child processes) that fencing
  interrupts: ``cancel()`` on connections, ``kill()`` on processes;
- ``sigterm_at`` (monotonic) for the rollback budget;
- the monotonic time of the last successful fenced write (for the self-fence);
- the two password slots, never a shared map, wiped at exit.

Signal handlers only call :meth:`RunContext.request_stop`: they never raise into arbitrary code.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from reshard.scrub import Scrubber

# A cancel request opens its own connection; on a partitioned network it must not hang.
CANCEL_TIMEOUT_SECONDS = 5.0


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@dataclass
class Progress:
    """In-memory progress flags, reconstructed from the row on takeover (spec §4.8)."""

    blocked: bool = False
    source_access_verified: bool = False
    fence_requested: bool = False
    compaction_paused: bool = False
    flipped: bool = False
    copied: bool = False


@dataclass
class RunContext:
    op_id: int
    runner_id: str
    scrubber: Scrubber
    epoch: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    sigterm_at: float | None = None
    signal_name: str = ""
    progress: Progress = field(default_factory=Progress)
    # The step the runner is working in (for the SIGTERM error text and logs).
    current_step: str = ""
    late_cancel_logged: bool = False
    # The copy's release handle (``reshard.copy.ReleaseHandle``): the source write fence, held
    # from ``copying`` until the source drop (cleanup) or the end of the rollback.
    release_handle: Any = None
    # Set by the atomic finalize: the op is ``succeeded``.
    finalized: bool = False
    source_password: str = field(default="", repr=False)
    target_password: str = field(default="", repr=False)
    _fenced: threading.Event = field(default_factory=threading.Event)
    _fence_logged: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _connections: list[Cancellable] = field(default_factory=list)
    _processes: list[subprocess.Popen[Any]] = field(default_factory=list)
    _last_write: float = field(default_factory=time.monotonic)

    # --- stop / fencing flags ---------------------------------------------------------------
    def request_stop(self, signal_name: str) -> None:
        """Signal-handler safe: record the first signal's time, set ``stop``."""
        if self.sigterm_at is None:
            self.sigterm_at = time.monotonic()
            self.signal_name = signal_name
        self.stop.set()

    @property
    def fenced(self) -> bool:
        return self._fenced.is_set()

    def mark_fenced(self) -> bool:
        """Set ``fenced`` and ``stop`` and interrupt in-flight work; True the first time only."""
        with self._lock:
            first = not self._fence_logged
            self._fence_logged = True
        self._fenced.set()
        self.stop.set()
        self.interrupt_all()
        return first

    # --- last successful fenced write (self-fence clock) --------------------------------------
    def note_write(self, at: float | None = None) -> None:
        with self._lock:
            stamp = time.monotonic() if at is None else at
            self._last_write = max(self._last_write, stamp)

    def seconds_since_write(self) -> float:
        with self._lock:
            return time.monotonic() - self._last_write

    # --- interruptible resources ---------------------------------------------------------------
    def register_connection(self, conn: Cancellable) -> None:
        with self._lock:
            self._connections.append(conn)

    def unregister_connection(self, conn: Cancellable) -> None:
        with self._lock:
            self._connections = [c for c in self._connections if c is not conn]

    def register_process(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._processes.append(proc)

    def unregister_process(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._processes = [p for p in self._processes if p is not proc]

    def interrupt_all(self) -> None:
        """Cancel every registered connection's running query and kill every child process."""
        with self._lock:
            connections = list(self._connections)
            processes = list(self._processes)
        # Children first: killing is local and instant; a cancel request needs the network.
        for proc in processes:
            try:
                if proc.poll() is None:
                    proc.kill()
            except Exception:  # noqa: BLE001,S112 - best effort: already reaped
                continue
        for conn in connections:
            try:
                cancel_safe = getattr(conn, "cancel_safe", None)
                if cancel_safe is not None:
                    cancel_safe(timeout=CANCEL_TIMEOUT_SECONDS)
                else:
                    conn.cancel()
            except Exception:  # noqa: BLE001,S112 - best effort: a closed connection has nothing to cancel
                continue

    # --- secrets ---------------------------------------------------------------------------------
    def set_target_password(self, value: str) -> None:
        self.scrubber.add(value)
        self.target_password = value

    def set_source_password(self, value: str) -> None:
        self.scrubber.add(value)
        self.source_password = value

    def wipe_passwords(self) -> None:
        self.source_password = ""
        self.target_password = ""
