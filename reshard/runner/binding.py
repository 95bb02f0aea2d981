"""The binding as the runner sees it: the one module for what a warehouse row's binding fields
say and how they change.

- **Reads** (fresh, from the config store): :func:`names_source`, :func:`names_cnpg_target`
  (a takeover resumes forward only when the still-blocked warehouse names the cnpg target,
  §4.8), :func:`named_side` and :func:`describe` (the op log's and recovery's wording).
- **The fields** of each side: :func:`target_binding`, :func:`source_binding`.
- **Writes** (spec §4.1 rule): :func:`switch` updates the warehouse and a guarded op row in ONE
  transaction, after the pre-statement heartbeat; used by the →cnpg and →external cutovers and
  the rollback's flip-back. ``env.fence`` may be the runner's ``Fencer`` or a recovery writer
  (same interface); its update matching zero rows raises ``Fenced`` and rolls the switch back.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from duckgres_admin.lib import pgadmin
from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError


def target_binding(op: ReshardOperation) -> dict[str, Any]:
    if op.target_kind == "cnpg":
        return {
            "metadata_store_kind": "cnpg",
            "metadata_store_id": op.to_shard,
            "metadata_store_host": "",
            "metadata_store_port": None,
            "metadata_store_sslmode": "",
            "metadata_store_database": op.target_database,
            "metadata_store_user": op.target_user,
            "metadata_store_password_ref": op.target_password_secret_ref,
        }
    return {
        "metadata_store_kind": "external",
        "metadata_store_id": None,
        "metadata_store_host": op.target_endpoint,
        "metadata_store_port": op.target_port or 5432,
        "metadata_store_sslmode": op.target_sslmode or pgadmin.DEFAULT_SSLMODE,
        "metadata_store_database": op.target_database,
        "metadata_store_user": op.target_user,
        "metadata_store_password_ref": op.target_password_secret_ref,
    }


def source_binding(op: ReshardOperation) -> dict[str, Any]:
    if op.source_kind == "cnpg":
        return {
            "metadata_store_kind": "cnpg",
            "metadata_store_id": op.from_shard,
            "metadata_store_host": "",
            "metadata_store_port": None,
            "metadata_store_sslmode": "",
            "metadata_store_database": op.source_database,
            "metadata_store_user": op.source_user,
            "metadata_store_password_ref": op.source_password_secret_ref,
        }
    return {
        "metadata_store_kind": "external",
        "metadata_store_id": None,
        "metadata_store_host": op.source_endpoint,
        "metadata_store_port": op.source_port or 5432,
        "metadata_store_sslmode": op.source_sslmode or pgadmin.DEFAULT_SSLMODE,
        "metadata_store_database": op.source_database,
        "metadata_store_user": op.source_user,
        "metadata_store_password_ref": op.source_password_secret_ref,
    }


def switch(env: StepEnv, fields: dict[str, Any], *, what: str) -> None:
    """Fenced binding update (also guarded by the warehouse ``state='resharding'``)."""
    env.fence.pre_statement_heartbeat()
    with transaction.atomic():
        moved = Warehouse.objects.filter(org_id=env.op.org_id, state="resharding").update(
            **fields, updated_at=Now()
        )
        if moved != 1:
            raise StepError(f"{what}: the warehouse is not in the resharding state")
        env.fence.update()


def names_source(op: ReshardOperation) -> bool:
    """Fresh read-back: does the binding name the op's source?"""
    wh = Warehouse.objects.filter(org_id=op.org_id).first()
    if wh is None:
        return False
    if op.source_kind == "cnpg":
        return (
            wh.metadata_store_kind == "cnpg"
            and (wh.metadata_store_id or "") == op.from_shard
            and wh.metadata_store_database == op.source_database
            and wh.metadata_store_user == op.source_user
        )
    return (
        wh.metadata_store_kind == "external"
        and wh.metadata_store_host == op.source_endpoint
        and int(wh.metadata_store_port or 0) == int(op.source_port or 0)
        and wh.metadata_store_database == op.source_database
        and wh.metadata_store_user == op.source_user
    )


def names_cnpg_target(op: ReshardOperation) -> bool:
    """Fresh read-back: is the warehouse still blocked, never unblocked by this op, and bound
    to the op's cnpg target? (A takeover resumes forward only then, §4.8.)"""
    wh = Warehouse.objects.filter(org_id=op.org_id).first()
    return (
        wh is not None
        and wh.state == "resharding"
        and wh.metadata_store_kind == "cnpg"
        and (wh.metadata_store_id or "") == op.to_shard
        and wh.metadata_store_database == op.target_database
        and wh.metadata_store_user == op.target_user
    )


def describe(org_id: str) -> str:
    wh = Warehouse.objects.filter(org_id=org_id).first()
    if wh is None:
        return "no warehouse row"
    if wh.metadata_store_kind == "cnpg":
        return f"cnpg {wh.metadata_store_id}/{wh.metadata_store_database}"
    return (
        f"external {wh.metadata_store_host}:{wh.metadata_store_port}/{wh.metadata_store_database}"
    )


def named_side(op: ReshardOperation) -> str:
    """Which side of ``op`` the binding names now: the source, the target, neither, nothing."""
    if names_source(op):
        return "the source"
    wh = Warehouse.objects.filter(org_id=op.org_id).first()
    if wh is None:
        return "nothing"
    if (
        op.target_kind == "cnpg"
        and wh.metadata_store_kind == "cnpg"
        and (wh.metadata_store_id or "") == op.to_shard
    ):
        return "the target"
    if op.target_kind == "external" and wh.metadata_store_host == op.target_endpoint:
        return "the target"
    return "neither the source nor the target"
