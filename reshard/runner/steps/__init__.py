"""The shared step registry: one function per stamped step name (spec reshard §3.2, §4.4).

The runner walks its operation kind's sequence (``Kind.sequence``) and, for each name, stamps
the step and calls the kind's function for it (``Kind.step``: the kind's override, else this
registry's). A name with no function is a step this build does not have: the runner fails the
operation honestly (``StepUnavailable``) and rolls back — it never skips a step or reports
success for work not done. Steps whose behaviour differs per direction (``cutover``,
``cleaning_up``) dispatch on the op's store kinds (cnpg, external) inside their module; what
differs per operation kind is the kind's (``reshard.kinds``).
"""

from __future__ import annotations

from reshard.runner.env import StepEnv, StepFn
from reshard.runner.steps import (
    access,
    backup_catalog,
    blocking,
    cleanup,
    compaction,
    copying,
    cutover,
    draining,
    fence_source,
    finalize,
)

REGISTRY: dict[str, StepFn] = {
    "blocking": blocking.run,
    "preparing_access": access.run,
    "draining": draining.run,
    "fencing_source": fence_source.run,
    "pausing_compaction": compaction.run,
    "backup_catalog": backup_catalog.run,
    "cutover": cutover.run,
    "copying": copying.run,
    "verifying": copying.run_verify,
    "orphaning_source": cleanup.run_orphaning,
    "verifying_external": cleanup.run_verifying_external,
    "cleaning_up": cleanup.run,
    "finalizing": finalize.run,
}


__all__ = ["REGISTRY", "StepEnv", "StepFn", "finalize"]
