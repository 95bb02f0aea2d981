"""The step registry: one function per stamped step name (spec reshard §3.2, §4.4).

The runner walks the direction's sequence from ``reshard.steps`` and, for each name, stamps the
step and calls the registered function. A name with no function is a step this build does not
have: the runner fails the operation honestly (``StepUnavailable``) and rolls back — it never
skips a step or reports success for work not done. A later build adds a step by writing its
function and registering it here; nothing else in the runner changes.
"""

from __future__ import annotations

from reshard.runner.steps import blocking
from reshard.runner.steps.base import StepEnv, StepFn

REGISTRY: dict[str, StepFn] = {
    "blocking": blocking.run,
}


def lookup(step: str) -> StepFn | None:
    return REGISTRY.get(step)


__all__ = ["REGISTRY", "StepEnv", "StepFn", "lookup"]
