"""The pool planner (spec trino-pools §4.5): a pure function choosing at most one lifecycle action.

``plan(desired, instances)`` reads nothing and writes nothing; the operator persists the action
(create = a ``PENDING`` row before anything exists in Kubernetes; drain = Gateway
``DrainMember``, then CAS ``SERVING → DRAINING``). Rules, in order:

1. Frozen → nothing ("pool is frozen: <reason>"); desired < 1 → nothing.
2. Count over capacity-occupying instances (every valid non-terminal phase): ``live``,
   ``serving``, ``pre_serving``, ``repairing``, ``departing``.
3. Any pre-serving instance → nothing: one candidate at a time, repairs included.
4. serving < max(desired, min_serving): live < desired → create; else repairing ≥ max_repair →
   nothing; live ≥ desired + max_surge + max_repair → nothing; else create a **repair** whose
   ``repair_for`` is the first unreplaced ``LOST``, else ``SUSPECT``, else departing instance
   (lowest id first); no such instance → nothing. Rule 4 always ends the plan.
5. Any departing instance → nothing ("already draining").
6. Outdated serving instances (release id ≠ desired or spec outdated, not rollout-blocked), oldest
   first: serving - 1 ≥ min_serving → drain the oldest; else live ≥ desired + max_surge → wait;
   else surge-create a replacement (a normal create).

Definitions the spec leaves implicit (documented in docs/trino-metrics.md):

- *unreplaced*: no capacity-occupying instance has ``repair_for`` equal to its id.
- *repairing*: a capacity-occupying instance with ``repair`` set whose ``repair_for`` target
  still occupies capacity. Once the replaced instance has reached a terminal phase the repair
  is an ordinary member and no longer consumes the repair budget.
- An instance whose phase is not one of the 14 phases stops planning ("unknown phase"): it is
  never defaulted into a count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from duckgres_admin.models.trino import InstancePhase
from trino_pools import phases


@dataclass(frozen=True)
class PoolDesired:
    desired: int
    min_serving: int
    max_surge: int
    max_repair: int
    release_id: str
    digest: str
    frozen: bool = False
    frozen_reason: str = ""


@dataclass(frozen=True)
class InstanceView:
    instance_id: str
    phase: str
    release_id: str
    spec_outdated: bool
    repair: bool
    repair_for: str
    created_at: datetime
    rollout_blocked: bool = False  # always false in this version (§4.5)


@dataclass(frozen=True)
class Action:
    kind: Literal["create", "drain"]
    repair: bool
    repair_for: str
    instance_id: str  # the instance to drain; "" for create
    reason: str


@dataclass(frozen=True)
class Counts:
    live: int
    serving: int
    pre_serving: int
    repairing: int
    departing: int


def count(instances: Sequence[InstanceView]) -> Counts:
    """Rule 2 over valid phases (raises ``phases.UnknownPhase`` for any other)."""
    live = [i for i in instances if phases.occupies_capacity(i.phase)]
    live_ids = {i.instance_id for i in live}
    return Counts(
        live=len(live),
        serving=sum(1 for i in live if phases.is_serving(i.phase)),
        pre_serving=sum(1 for i in live if phases.is_pre_serving(i.phase)),
        repairing=sum(1 for i in live if i.repair and i.repair_for in live_ids),
        departing=sum(1 for i in live if phases.is_departing(i.phase)),
    )


def repair_target(instances: Sequence[InstanceView]) -> str:
    """The first unreplaced ``LOST``, else ``SUSPECT``, else departing instance (lowest id).

    "" when there is none.
    """
    live = [i for i in instances if phases.occupies_capacity(i.phase)]
    replaced = {i.repair_for for i in live if i.repair_for}
    unreplaced = sorted(
        (i for i in live if i.instance_id not in replaced), key=lambda i: i.instance_id
    )
    for wanted in (
        lambda p: p == InstancePhase.LOST,
        lambda p: p == InstancePhase.SUSPECT,
        phases.is_departing,
    ):
        for inst in unreplaced:
            if wanted(inst.phase):
                return inst.instance_id
    return ""


def is_outdated(desired: PoolDesired, inst: InstanceView) -> bool:
    if inst.rollout_blocked:
        return False
    return inst.release_id != desired.release_id or inst.spec_outdated


def _act(action: Action) -> tuple[Action, str]:
    return action, action.reason


def plan(desired: PoolDesired, instances: Sequence[InstanceView]) -> tuple[Action | None, str]:
    """At most one action for the pool, with the reason for it (or for doing nothing)."""
    # Rule 1.
    if desired.frozen:
        return None, f"pool is frozen: {desired.frozen_reason}"
    if desired.desired < 1:
        return None, f"desired instances is {desired.desired} (< 1)"
    unknown = sorted(i.instance_id for i in instances if not phases.is_valid(i.phase))
    if unknown:
        return None, f"instance {unknown[0]} has an unknown phase; refusing to plan"

    # Rule 2.
    c = count(instances)

    # Rule 3.
    if c.pre_serving:
        return None, "a candidate is being prepared (one candidate at a time)"

    # Rule 4.
    target_serving = max(desired.desired, desired.min_serving)
    if c.serving < target_serving:
        if c.live < desired.desired:
            return _act(
                Action("create", False, "", "", f"{c.live} live < {desired.desired} desired")
            )
        if c.repairing >= desired.max_repair:
            return None, (
                f"repair budget exhausted ({c.repairing} repairing, max_repair "
                f"{desired.max_repair})"
            )
        ceiling = desired.desired + desired.max_surge + desired.max_repair
        if c.live >= ceiling:
            return None, f"{c.live} live instances reach desired + surge + repair ({ceiling})"
        target = repair_target(instances)
        if not target:
            return None, (
                f"{c.serving} serving < {target_serving} but no unreplaced lost, suspect or "
                "departing instance to repair"
            )
        return _act(Action("create", True, target, "", f"repair for {target}: {c.serving} serving"))

    # Rule 5.
    if c.departing:
        return None, "already draining"

    # Rule 6.
    outdated = sorted(
        (i for i in instances if phases.is_serving(i.phase) and is_outdated(desired, i)),
        key=lambda i: (i.created_at, i.instance_id),
    )
    if not outdated:
        return None, "pool is up to date"
    oldest = outdated[0]
    if c.serving - 1 >= desired.min_serving:
        return _act(
            Action("drain", False, "", oldest.instance_id, f"{oldest.instance_id} is outdated")
        )
    if c.live >= desired.desired + desired.max_surge:
        return None, (
            f"waiting to replace outdated {oldest.instance_id}: serving floor "
            f"{desired.min_serving} and surge budget {desired.max_surge} are used"
        )
    return _act(
        Action("create", False, "", "", f"surge replacement for outdated {oldest.instance_id}")
    )
