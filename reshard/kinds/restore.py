"""The restore onto another store: a backup object of the org's own replaces the catalog
(docs/restore.md; its start checks are ``reshard.start.restores``).

It runs the reshard's steps but two: ``copying`` streams the backup into the target
(``reshard.runner.steps.restoring``) and ``verifying`` compares the result with the backup's
recorded fingerprint. Its cancel cutoff is ``cleaning_up`` (nothing before the drop of the
replaced catalog is irreversible), and its pre-flip backup is mandatory: the cleanup drops the
catalog it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from duckgres_admin.models import OpKind, ReshardOperation
from reshard.kinds.base import BaseKind
from reshard.kinds.restore_checks import RestoreStart
from reshard.operation.sequences import CancelCutoff
from reshard.runner.steps import restoring

MANDATORY_PREFIX = "a backup of the current catalog is mandatory before a restore replaces it"


@dataclass(frozen=True)
class RestoreKind(BaseKind):
    where: str = "onto another store"

    def cancel_cutoff(self, target_kind: str) -> CancelCutoff:
        return CancelCutoff(
            "cleaning_up",
            f"a restore {self.where} can be cancelled until cleaning_up, when the replaced "
            "catalog is dropped",
        )

    def start(self, **details: str) -> RestoreStart:
        """The restore's rows (target, backup) and fields (``reshard.kinds.restore_checks``); the
        in-place one is the same start: the row is in place when its stores are one."""
        return RestoreStart(details["backup_key"])

    def describe(self, op: ReshardOperation) -> str:
        return f"restore of {op.restore_backup_key}"

    def backup_mandatory(self, op: ReshardOperation) -> bool:
        return True

    def backup_failure(self, error: str, *, mandatory: bool) -> str:
        return f"{MANDATORY_PREFIX}: {error}"


RESTORE = RestoreKind(
    key=(OpKind.RESTORE.value, False, "offline"),
    label="restore onto another store",
    overrides=restoring.step_functions(restoring.OTHER_STORE),
)
