"""What every step function receives, and the step-function signature."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from duckgres_admin.models import ReshardOperation
from reshard.runner.context import RunContext
from reshard.runner.fencing import Fencer
from reshard.runner.oplog import OpLogWriter


@dataclass
class StepEnv:
    """The runner's state for one operation; ``op`` is the in-memory row the steps update."""

    ctx: RunContext
    op: ReshardOperation
    fence: Fencer
    log: OpLogWriter

    @property
    def app_name(self) -> str:
        return f"duckgres-reshard-op-{self.op.id}"


StepFn = Callable[[StepEnv], None]
