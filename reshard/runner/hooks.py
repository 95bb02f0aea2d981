"""The run context seen through the hook protocols of ``reshard.copy`` and ``reshard.backup``."""

from __future__ import annotations

import subprocess
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
        A store error is a warning; ``Fenced`` propagates (spec §2.5)."""
        if not self._reset:
            current = dict(self.env.op.progress or {})
            for key in self._reset_keys:
                current.pop(key, None)
            self._progress = current
            self._reset = True
        self._progress.update({k: int(v) for k, v in values.items()})
        merged = dict(self._progress)
        try:
            self.env.fence.update(progress=_with_db_time(merged))
        except Fenced:
            raise
        except DatabaseError as exc:
            self.env.log.warn(f"progress write failed (continuing): {exc}")
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
