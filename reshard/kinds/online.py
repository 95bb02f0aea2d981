"""The online reshard: the reshard with its copy split around the block (docs/copy.md "Online
copy", docs/runner.md "The online mode"; the steps' own text is ``reshard.runner.steps.online``).

The target is rendered and the catalog pre-copied while the tenant runs, the change capture on
the source recording what it writes; the block then pays for the catch-up, the in-window check
and the flip. Two variants, by where the whole-catalog comparison and the pre-flip backup run
(the op's ``backup_after_unblock``): after the unblock, whose ``opening`` step is the commit
point and whose source is dropped only once both passed; or before the flip, in the window, as
the offline move has them. cnpg → cnpg only: every other direction runs offline (the start
says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from duckgres_admin.models import OpKind, ReshardOperation
from reshard.kinds.base import BaseKind
from reshard.operation import sequences
from reshard.operation.sequences import CancelCutoff
from reshard.runner.env import StepEnv
from reshard.runner.steps import backup_catalog, online

_STEPS = {
    "rendering_target": online.run_rendering_target,
    "precopying": online.run_precopying,
    "catching_up": online.run_catching_up,
    "cutover": online.run_cutover,
    "opening": online.run_opening,
    "verifying": online.run_verifying,
}


@dataclass(frozen=True)
class OnlineReshardKind(BaseKind):
    backup_after_unblock: bool = True

    def sequence(self, source_kind: str, target_kind: str) -> tuple[str, ...]:
        if (source_kind, target_kind) != ("cnpg", "cnpg"):
            raise ValueError(
                f"the online mode moves cnpg -> cnpg only, not {source_kind} -> {target_kind}"
            )
        if self.backup_after_unblock:
            return sequences.ONLINE_CNPG_TO_CNPG
        return sequences.ONLINE_BACKUP_FIRST

    def cancel_cutoff(self, target_kind: str) -> CancelCutoff:
        return CancelCutoff(
            "opening" if self.backup_after_unblock else "verifying",
            "an online reshard can be cancelled until the target login is ready in the cutover "
            "(the pre-copy and the catch-up included)",
            login_ready_ends_it=True,
        )

    def commit_point_passed(self, op: ReshardOperation) -> bool:
        return super().commit_point_passed(op) or op.target_opened_at is not None

    def keep_source(self, env: StepEnv) -> str:
        if not self.backup_after_unblock:
            return ""
        return online.keep_source_reason(env)


ONLINE_RESHARD = OnlineReshardKind(
    key=(OpKind.RESHARD.value, False, sequences.ONLINE),
    label="online reshard",
    overrides={**_STEPS, "backup_catalog": online.run_backup_after_unblock},
    renders_before_block=True,
)
ONLINE_RESHARD_BACKUP_FIRST = OnlineReshardKind(
    key=(OpKind.RESHARD.value, False, sequences.ONLINE_BACKUP_FIRST_VARIANT),
    label="online reshard (backup before the flip)",
    overrides={**_STEPS, "backup_catalog": backup_catalog.run},
    renders_before_block=True,
    backup_after_unblock=False,
)


def online_kind(*, backup_after_unblock: bool) -> OnlineReshardKind:
    return ONLINE_RESHARD if backup_after_unblock else ONLINE_RESHARD_BACKUP_FIRST
