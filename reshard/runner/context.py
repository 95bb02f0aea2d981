"""The run context shared by the runner's main thread, its heartbeat thread and signal handlers.

It holds (spec reshard §4.1, §4.2):
- ``stop``: a ``threading.Event`` set by SIGTERM/SIGINT or by fencing; every wait returns early
  on it (rollback waits ignore it but honour the SIGTERM budget);
- ``fenced``: set when ownership is lost (a fenced write matched zero rows) or given up
  (self-fence); a fenced runner makes no further side effect and no terminal write;
- a registry of interruptible resources (psycopg connections, child processes) that fencing
  interrupts: ``cancel()`` on connections, ``kill()`` on processes. Connections registered with
  ``interrupt_on_stop`` (every metadata-store connection of the steps) are also cancelled when
  ``stop`` is set (SIGTERM) or an operator cancel is acted on (:meth:`interrupt`): a stop
  watcher thread, alive while such a connection is registered and ``stop`` is not yet set,
  cancels their running statements within :data:`STOP_WATCH_SECONDS` (a signal handler itself
  never touches a lock or the network). Only connections registered *before* the stop are
  cancelled, so the rollback's own statements run. :meth:`was_interrupted` tells a
  ``QueryCanceled`` caused by us from a server-side timeout;
- the step deadline (safeguard reshard-67): set whenever ``current_step`` changes to
  ``DUCKGRES_RESHARD_FLIP_TIMEOUT`` from then, pushed out by a wait with a later deadline
  (:meth:`extend_deadline`), capped by the SIGTERM budget once a signal came.
  :meth:`statement_seconds` is what a connection opened now gets as ``statement_timeout`` and
  ``lock_timeout`` (never less than :data:`MIN_STATEMENT_SECONDS`, never unlimited);
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

from django.conf import settings

from duckgres_admin.base.scrub import Scrubber

# A cancel request opens its own connection; on a partitioned network it must not hang.
CANCEL_TIMEOUT_SECONDS = 5.0
# How often the stop watcher looks at ``stop`` (the bound on "promptly" for SIGTERM).
STOP_WATCH_SECONDS = 0.2
# The floor of a statement's timeout once the step's deadline has passed (0 would mean "none").
MIN_STATEMENT_SECONDS = 5.0


def step_budget_seconds() -> float:
    """How long one step may take before its statements stop getting time (the full source
    timeout, spec §4.4)."""
    return float(settings.DUCKGRES_RESHARD_FLIP_TIMEOUT)


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
    late_cancel_logged: bool = False
    # The copy's release handle (``reshard.engines.copy.catalog.ReleaseHandle``): the source write
    # fence, held from ``copying`` until the source drop (cleanup) or the end of the rollback.
    release_handle: Any = None
    # The backup step's preparation (``steps.backup_catalog.prepare``: a Future of its S3 client
    # and source facts), started before the block's propagation wait, taken once by the step.
    backup_prep: Any = None
    # The backup running beside the cutover and the copy (``steps.backup_catalog``: started by
    # ``backup_catalog`` when ``DUCKGRES_RESHARD_BACKUP_OVERLAP`` is on, joined at the end of
    # ``verifying``, abandoned by any other end of the run).
    background_backup: Any = None
    # The online mode (``steps.online``): the pre-copy's marker and copied set, from
    # ``precopying`` to ``catching_up``; and the target's snapshot held from the flip for the
    # verification after the unblock (closed by it, or at the end of the run).
    precopied: Any = None
    flip_snapshot: Any = None
    # The backup step ran in this process (a takeover resuming at copying starts none twice).
    backup_attempted: bool = False
    # Held while a progress write merges its keys (the backup and the copy write at once).
    progress_lock: threading.Lock = field(default_factory=threading.Lock)
    # Set by the atomic finalize: the op is ``succeeded``.
    finalized: bool = False
    source_password: str = field(default="", repr=False)
    target_password: str = field(default="", repr=False)
    # An in-place restore's login role password: made fresh by each runner that needs it.
    restore_login_password: str = field(default="", repr=False)
    _fenced: threading.Event = field(default_factory=threading.Event)
    _fence_logged: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _connections: list[Cancellable] = field(default_factory=list)
    _on_stop: list[Cancellable] = field(default_factory=list)
    _interrupted: set[int] = field(default_factory=set)
    _watcher: threading.Thread | None = None
    _processes: list[subprocess.Popen[Any]] = field(default_factory=list)
    _last_write: float = field(default_factory=time.monotonic)
    _step: str = ""
    _deadline: float | None = None

    # --- the current step and its deadline -------------------------------------------------------
    @property
    def current_step(self) -> str:
        """The step the runner is working in (for the SIGTERM error text and logs)."""
        return self._step

    @current_step.setter
    def current_step(self, step: str) -> None:
        with self._lock:
            self._step = step
            self._deadline = time.monotonic() + step_budget_seconds()

    def extend_deadline(self, at: float) -> None:
        """A wait with deadline ``at`` (monotonic) runs inside the step: its statements get
        time until then."""
        with self._lock:
            self._deadline = at if self._deadline is None else max(self._deadline, at)

    def statement_seconds(self) -> float:
        """``statement_timeout``/``lock_timeout`` for a connection opened now: what is left of
        the step's deadline (the full budget before any step), capped by the SIGTERM budget once
        a signal came, never below :data:`MIN_STATEMENT_SECONDS`."""
        now = time.monotonic()
        with self._lock:
            deadline = self._deadline if self._deadline is not None else now + step_budget_seconds()
        if self.sigterm_at is not None:
            budget = float(settings.DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS)
            deadline = min(deadline, self.sigterm_at + budget)
        return max(MIN_STATEMENT_SECONDS, deadline - now)

    # --- stop / fencing flags ---------------------------------------------------------------
    def request_stop(self, signal_name: str) -> None:
        """Signal-handler safe: record the first signal's time, set ``stop`` (the stop watcher
        then cancels the running statements of ``interrupt_on_stop`` connections)."""
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
    def register_connection(self, conn: Cancellable, *, interrupt_on_stop: bool = False) -> None:
        """Fencing cancels ``conn``; with ``interrupt_on_stop`` a stop (SIGTERM) or an acted-on
        operator cancel does too (registered before the stop only: see the module docstring)."""
        with self._lock:
            self._connections.append(conn)
            if not interrupt_on_stop or self.stop.is_set():
                return
            self._on_stop.append(conn)
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch_stop, name="reshard-stop-watch", daemon=True
                )
                self._watcher.start()

    def unregister_connection(self, conn: Cancellable) -> None:
        with self._lock:
            self._connections = [c for c in self._connections if c is not conn]
            self._on_stop = [c for c in self._on_stop if c is not conn]
            self._interrupted.discard(id(conn))

    def was_interrupted(self, conn: object) -> bool:
        """True when this context cancelled ``conn``'s statement (stop, cancel or fencing)."""
        with self._lock:
            return id(conn) in self._interrupted

    def _watch_stop(self) -> None:
        """Until ``stop`` is set, or no ``interrupt_on_stop`` connection is left: then cancel."""
        while True:
            if self.stop.wait(STOP_WATCH_SECONDS):
                self.interrupt(stop_only=True)
                with self._lock:
                    self._watcher = None
                return
            with self._lock:
                if not self._on_stop:
                    self._watcher = None
                    return

    def register_process(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._processes.append(proc)

    def unregister_process(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._processes = [p for p in self._processes if p is not proc]

    def interrupt_all(self) -> None:
        """Cancel every registered connection's running query and kill every child process."""
        self.interrupt(stop_only=False)

    def interrupt(self, *, stop_only: bool) -> None:
        """Kill every child process and cancel the running statement of every registered
        connection (``stop_only``: of the ``interrupt_on_stop`` ones), remembering which."""
        with self._lock:
            connections = list(self._on_stop if stop_only else self._connections)
            processes = list(self._processes)
            self._interrupted.update(id(c) for c in connections)
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
        self.restore_login_password = ""
