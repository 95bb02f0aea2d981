"""Step F ``pausing_compaction`` (spec §4.4 F; safeguard 30).

One transaction: read ``compaction_enabled`` ``FOR UPDATE`` as the prior (tri-state), fenced
``compaction_prior = COALESCE(compaction_prior, :prior)`` (a replay keeps the first prior), then
``compaction_enabled = false``. A takeover redoing the steps (safeguard reshard-73) reads the
already-paused ``false`` here: the ``COALESCE`` keeps the prior the first attempt recorded, so
finalize and rollback restore the warehouse's original setting, never the paused value.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import JSONField, Value
from django.db.models.functions import Coalesce, Now

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError


def prior_of(flag: bool | None) -> dict[str, bool]:
    return {"present": False} if flag is None else {"present": True, "value": bool(flag)}


def describe_prior(prior: object) -> str:
    if isinstance(prior, dict) and prior.get("present"):
        return str(bool(prior.get("value"))).lower()
    return "unset"


def run(env: StepEnv) -> None:
    org = env.op.org_id
    with transaction.atomic():
        wh = Warehouse.objects.select_for_update().filter(org_id=org).first()
        if wh is None or wh.state != "resharding":
            raise StepError("warehouse is not in the resharding state; cannot pause compaction")
        prior = prior_of(wh.compaction_enabled)
        env.fence.update(
            compaction_prior=Coalesce("compaction_prior", Value(prior, output_field=JSONField()))
        )
        moved = Warehouse.objects.filter(org_id=org, state="resharding").update(
            compaction_enabled=False, updated_at=Now()
        )
        if moved != 1:
            raise StepError("warehouse state mismatch while pausing compaction")
        recorded = (
            ReshardOperation.objects.filter(id=env.op.id)
            .values_list("compaction_prior", flat=True)
            .first()
        )
    env.op.compaction_prior = recorded
    env.ctx.progress.compaction_paused = True
    kept = recorded != prior
    env.log.info(
        f"compaction paused (recorded prior: {describe_prior(recorded)}"
        + ("; kept from an earlier attempt" if kept else "")
        + "); a compaction already "
        "running can outlive the pause (it holds a lease, so the drain waited for it; on "
        "external sources the SHARE locks block its writes during the copy)"
    )
