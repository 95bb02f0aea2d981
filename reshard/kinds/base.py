"""What every kind shares: the reshard's behaviour, which a kind changes by overriding.

``BaseKind`` implements ``reshard.runner.kind.Kind`` with the reshard's answers: the step
sequence per direction (``reshard.operation.sequences``), the cancel cutoff per target (→external:
``orphaning_source``; →cnpg: the target login ready in the cutover), the shared commit point
(``source_drop_committed_at`` / ``external_verified_at``), the steps before the point of no
return as the redoable ones, the shared step registry, and the backup gate by direction
(mandatory for cnpg→external only). A kind is a frozen instance (or subclass) of it: everything
it does not say is the reshard's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from duckgres_admin.models import ReshardOperation
from reshard.engines import backup
from reshard.kinds.checks import SHARED_ONLY, KindStart
from reshard.operation import sequences
from reshard.operation.sequences import CancelCutoff
from reshard.runner.env import StepEnv, StepFn
from reshard.runner.steps import REGISTRY


@dataclass(frozen=True)
class BaseKind:
    key: tuple[str, bool, str]
    label: str
    # Step functions of this kind's own, by stamped step name (the rest: the shared registry).
    overrides: Mapping[str, StepFn] = field(default_factory=dict)
    reruns_cleanup_on_takeover: bool = False
    # The target is rendered by this kind before the block (the online mode): a takeover may
    # still redo the steps from the start (it re-renders its own target).
    renders_before_block: bool = False
    source_role_after_drop: str = "stays NOLOGIN there"

    @property
    def event(self) -> str:
        return self.key[0]

    def describe(self, op: ReshardOperation) -> str:
        return self.label

    def start(self, **details: str) -> KindStart:
        """What this kind adds to a start (``operations.op_start``): the reshard, nothing."""
        return SHARED_ONLY

    def sequence(self, source_kind: str, target_kind: str) -> tuple[str, ...]:
        return sequences.sequence(source_kind, target_kind)

    def cancel_cutoff(self, target_kind: str) -> CancelCutoff:
        if target_kind == "external":
            return CancelCutoff(
                "orphaning_source",
                "a reshard to an external store can be cancelled until orphaning_source",
            )
        return CancelCutoff(
            "copying",
            "a reshard to a cnpg store can be cancelled until the target login is ready in the "
            "cutover (before copying)",
            login_ready_ends_it=True,
        )

    def commit_point_passed(self, op: ReshardOperation) -> bool:
        return op.source_drop_committed_at is not None or op.external_verified_at is not None

    def redoable_steps(self, source_kind: str, target_kind: str) -> tuple[str, ...]:
        """Those before the binding can switch and before anything irreversible (→cnpg:
        before ``cutover``; cnpg→external: before ``orphaning_source``, its cancel cutoff)."""
        full = self.sequence(source_kind, target_kind)
        end = "orphaning_source" if target_kind == "external" else "cutover"
        return full[: full.index(end)]

    def step(self, name: str) -> StepFn | None:
        return self.overrides.get(name) or REGISTRY.get(name)

    def backup_mandatory(self, op: ReshardOperation) -> bool:
        """cnpg→external: its source is dropped once the external copy is verified."""
        return op.source_kind == "cnpg" and op.target_kind == "external"

    def backup_failure(self, error: str, *, mandatory: bool) -> str:
        return backup.gated_failure(error, mandatory=mandatory)

    def after_source_drop(self, env: StepEnv) -> None:
        return None

    def rollback_target(self, env: StepEnv) -> bool | None:
        return None

    def may_give_source_login(self, env: StepEnv) -> bool:
        return True

    def keep_source(self, env: StepEnv) -> str:
        """'' when the cleanup (or a roll-forward) may drop the source; else why it is kept."""
        return ""
