"""Restore operations: the start and its dry run (docs/restore.md).

A restore is an operation of kind ``restore`` (``reshard.kinds.restore``) run by the reshard
machinery (the same launch, claim, fencing, heartbeats, janitor, cancel and rollback): its
catalog comes from a backup object instead of the live source
(``reshard.runner.steps.restoring``). Its own checks are two rows walked before the reshard's
table (``reshard.kinds.restore_checks``): the start refuses at the first that fails, the dry run
reports every row, the restore's and the shared ones alike, and creates nothing.
"""

from __future__ import annotations

from typing import Any

from duckgres_admin.models import StoreKind
from reshard.kinds import RESTORE, restore_kind
from reshard.kinds.checks import StartRequest
from reshard.start import dryrun, operations


def restore_start(
    *, org_id: str, key: str, request: StartRequest, actor: str
) -> operations.StartOutcome:
    return operations.op_start(RESTORE.start(backup_key=key), org_id=org_id, request=request,
                               actor=actor)  # fmt: skip


def restore_dry_run(org_id: str, key: str, request: StartRequest) -> dict[str, Any]:
    """The reshard's dry run to the target with the restore's rows first, and the backup's
    facts; creates nothing."""
    start = RESTORE.start(backup_key=key)
    plan = dryrun.dry_run(org_id, request, start)
    plan["kind"] = RESTORE.event
    plan["cancel_cutoff"] = (
        restore_kind(in_place=bool(start.in_place_database))
        .cancel_cutoff(StoreKind.CNPG.value)
        .description
    )
    plan["restore"] = start.dry_run_section(request.target.cnpg_shard)
    plan["backup"]["mandatory"] = True
    return plan
