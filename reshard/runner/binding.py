"""Binding writes (spec §4.1 rule): the warehouse update and a guarded op update in ONE
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
