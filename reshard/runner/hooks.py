"""The run context seen through the hook protocols of ``reshard.engines.copy.catalog`` and
``reshard.engines.backup``."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError
from django.db.models.functions import Now

from reshard.runner.env import StepEnv
from reshard.runner.errors import Fenced


class RunnerHooks:
    """CopyHooks and BackupHooks over a ``StepEnv``: op log, fenced progress writes, the
    pre-statement heartbeat, interruptible resources and the stop flag."""

    def __init__(self, env: StepEnv, *, progress_keys: tuple[str, ...] = ()) -> None:
        self.env = env
        self._progress: dict[str, Any] = {}
        self._reset_keys = progress_keys
        self._reset = False

    def log(self, level: str, message: str) -> None:
        self.env.log.append(level if level in ("info", "warn", "error") else "info", message)

    def progress(self, values: Mapping[str, int]) -> None:
        """A fenced ``progress`` update (merged with the other keys; ``updated_at`` = DB time).
        A store error is a warning; ``Fenced`` propagates (spec §2.5).

        Two hooks may write at once (the backup runs beside the copy): each owns its keys
        (``progress_keys`` plus the ones it wrote), and every write merges them into the op's
        current progress under the run context's progress lock, so neither erases the
        other's figures. The first write of a hook drops its keys' values of an earlier attempt.
        """
        self._progress.update({k: int(v) for k, v in values.items()})
        with self.env.ctx.progress_lock:
            current = dict(self.env.op.progress or {})
            if not self._reset:
                for key in self._reset_keys:
                    current.pop(key, None)
                self._reset = True
            merged = {**current, **self._progress}
            try:
                self.env.fence.update(progress=_with_db_time(merged))
            except Fenced:
                raise
            except DatabaseError as exc:
                self.env.log.warn(f"progress write failed (continuing): {exc}")
                self.env.op.progress = current
                return
            self.env.op.progress = merged

    def before_irreversible(self) -> None:
        self.env.fence.pre_statement_heartbeat()

    def register_connection(self, conn: Any) -> None:
        self.env.ctx.register_connection(conn)

    def unregister_connection(self, conn: Any) -> None:
        self.env.ctx.unregister_connection(conn)

    def register_process(self, proc: subprocess.Popen[bytes]) -> None:
        self.env.ctx.register_process(proc)

    def unregister_process(self, proc: subprocess.Popen[bytes]) -> None:
        self.env.ctx.unregister_process(proc)

    def stopped(self) -> bool:
        return self.env.ctx.stop.is_set()


class StepHooks(RunnerHooks):
    """``RunnerHooks`` whose connections a stop or an acted-on cancel interrupts, and whose
    ``stopped()`` also turns true on that cancel (the copy and the backup abort promptly)."""

    def __init__(
        self,
        env: StepEnv,
        *,
        cancelled: threading.Event | None = None,
        progress_keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(env, progress_keys=progress_keys)
        self.cancelled = cancelled or threading.Event()

    def register_connection(self, conn: Any) -> None:
        self.env.ctx.register_connection(conn, interrupt_on_stop=True)

    def stopped(self) -> bool:
        return super().stopped() or self.cancelled.is_set()


class BackgroundHooks(StepHooks):
    """``StepHooks`` of work running beside the steps (the overlapped backup): it also keeps
    its own connections and children, so :meth:`abandon` stops exactly this work — not the
    step the main thread is in — when the run ends without it (a rollback, a stop)."""

    def __init__(self, env: StepEnv, *, progress_keys: tuple[str, ...] = ()) -> None:
        super().__init__(env, progress_keys=progress_keys)
        self._lock = threading.Lock()
        self._connections: list[Any] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    def register_connection(self, conn: Any) -> None:
        with self._lock:
            self._connections.append(conn)
        super().register_connection(conn)

    def unregister_connection(self, conn: Any) -> None:
        with self._lock:
            self._connections = [c for c in self._connections if c is not conn]
        super().unregister_connection(conn)

    def register_process(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._processes.append(proc)
        super().register_process(proc)

    def unregister_process(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._processes = [p for p in self._processes if p is not proc]
        super().unregister_process(proc)

    def progress(self, values: Mapping[str, int]) -> None:
        if not self.cancelled.is_set():  # an abandoned backup writes nothing more
            super().progress(values)

    def abandon(self) -> None:
        """Stop this work: ``stopped()`` turns true, its children are killed and its running
        statements cancelled (best effort; the work then aborts its own upload)."""
        self.cancelled.set()
        with self._lock:
            processes, connections = list(self._processes), list(self._connections)
        for proc in processes:
            with contextlib.suppress(Exception):
                if proc.poll() is None:
                    proc.kill()
        for conn in connections:
            with contextlib.suppress(Exception):
                conn.cancel()


def _with_db_time(values: dict[str, Any]) -> Any:
    """``progress || {"updated_at": now()}`` evaluated by the config store (database clock)."""
    from django.db.models import JSONField, Value
    from django.db.models.expressions import CombinedExpression, Func

    stamp = Func(
        Value("updated_at"),
        Func(Now(), function="to_jsonb"),
        function="jsonb_build_object",
        output_field=JSONField(),
    )
    return CombinedExpression(
        Value(values, output_field=JSONField()), "||", stamp, output_field=JSONField()
    )


def monotonic() -> float:
    return time.monotonic()
