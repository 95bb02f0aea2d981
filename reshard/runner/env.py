"""What every step function receives (``StepEnv``), and the step-function signature.

A module of the runner, below the steps: the steps, the binding, the hooks and the report import
it, and it imports none of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from duckgres_admin.models import ReshardOperation
from duckgres_admin.platform.names import runner_name
from reshard.runner.context import RunContext
from reshard.runner.fencing import Fencer
from reshard.runner.logwriter import OpLogWriter


class Stoppable(Protocol):
    def stop(self, timeout: float = ...) -> None: ...


@dataclass
class StepEnv:
    """The runner's state for one operation; ``op`` is the in-memory row the steps update."""

    ctx: RunContext
    op: ReshardOperation
    fence: Fencer
    log: OpLogWriter
    # The heartbeat thread; stopped (joined) right before the terminal write, so that no tick
    # races the op leaving `running` and mistakes it for a takeover.
    heartbeat: Stoppable | None = None

    @property
    def app_name(self) -> str:
        return runner_name(self.op.id)


StepFn = Callable[[StepEnv], None]
