"""The pure pool planner (spec trino-pools §4.5): each rule, repair targets, rollouts."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from trino_pools import planner
from trino_pools.planner import Action, InstanceView, PoolDesired, plan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PRE_SERVING = ["PENDING", "CREATING", "PREPARING", "VALIDATING", "ADMITTED"]


BASE = PoolDesired(
    desired=3,
    min_serving=2,
    max_surge=1,
    max_repair=1,
    release_id="rel-2",
    digest="d2",
    frozen=False,
    frozen_reason="",
)


def want(**overrides) -> PoolDesired:
    return dataclasses.replace(BASE, **overrides)


def inst(
    instance_id: str,
    phase: str = "SERVING",
    *,
    release: str = "rel-2",
    outdated: bool = False,
    repair: bool = False,
    repair_for: str = "",
    age: int = 0,
    blocked: bool = False,
) -> InstanceView:
    return InstanceView(
        instance_id=instance_id,
        phase=phase,
        release_id=release,
        spec_outdated=outdated,
        repair=repair,
        repair_for=repair_for,
        created_at=T0 - timedelta(minutes=age),
        rollout_blocked=blocked,
    )


def serving(n: int, **kw) -> list[InstanceView]:
    return [inst(f"cell-s{i:07d}", **kw) for i in range(n)]


def nothing(result: tuple[Action | None, str]) -> str:
    action, reason = result
    assert action is None, action
    assert reason
    return reason


def create(result: tuple[Action | None, str], *, repair_for: str = "") -> Action:
    action, reason = result
    assert action is not None, reason
    assert action.kind == "create"
    assert action.instance_id == ""
    assert action.repair is bool(repair_for)
    assert action.repair_for == repair_for
    assert reason == action.reason
    return action


def drain(result: tuple[Action | None, str], instance_id: str) -> Action:
    action, reason = result
    assert action is not None, reason
    assert action.kind == "drain"
    assert action.instance_id == instance_id
    assert not action.repair
    assert action.repair_for == ""
    return action


# Rule 1


def test_frozen_pool_plans_nothing_and_says_why():
    reason = nothing(
        plan(want(frozen=True, frozen_reason="desired configuration is unreadable"), [])
    )
    assert reason == "pool is frozen: desired configuration is unreadable"


@pytest.mark.parametrize("desired", [0, -1])
def test_desired_below_one_plans_nothing(desired):
    nothing(plan(want(desired=desired, min_serving=1), []))


def test_an_unknown_phase_stops_planning_instead_of_being_counted():
    reason = nothing(plan(want(), [*serving(1), inst("cell-bad00000", "WEIRD")]))
    assert "cell-bad00000" in reason
    assert "unknown phase" in reason


# Rules 2 and 3


def test_empty_pool_creates_one_normal_instance():
    create(plan(want(), []))


def test_terminal_rows_do_not_occupy_capacity():
    rows = [
        *serving(2),
        inst("cell-r0000001", "RETIRED"),
        inst("cell-r0000002", "FAILURE_RETIRED"),
    ]
    create(plan(want(), rows))


@pytest.mark.parametrize("phase", PRE_SERVING)
def test_one_candidate_at_a_time(phase):
    nothing(plan(want(), [*serving(1), inst("cell-c0000000", phase)]))


@pytest.mark.parametrize("phase", PRE_SERVING)
def test_a_pre_serving_repair_also_blocks(phase):
    rows = [
        *serving(2),
        inst("cell-l0000000", "LOST"),
        inst("cell-c0000000", phase, repair=True, repair_for="cell-l0000000"),
    ]
    reason = nothing(plan(want(max_repair=5, max_surge=5), rows))
    assert "one candidate at a time" in reason


def test_counts():
    rows = [
        *serving(2),
        inst("cell-p0000000", "PENDING"),
        inst("cell-d0000000", "DRAINING"),
        inst("cell-l0000000", "LOST"),
        inst("cell-f0000000", "FAILED_PREPARING", repair=True, repair_for="cell-l0000000"),
        inst("cell-x0000000", "RETIRED", repair=True, repair_for="cell-d0000000"),
    ]
    assert planner.count(rows) == planner.Counts(
        live=6, serving=2, pre_serving=1, repairing=1, departing=1
    )


# Rule 4


def test_below_desired_creates_a_normal_instance_even_with_lost_members():
    rows = [*serving(1), inst("cell-l0000000", "LOST")]
    create(plan(want(), rows))


def test_repair_targets_the_lost_instance():
    rows = [*serving(2), inst("cell-l0000000", "LOST")]
    action = create(plan(want(), rows), repair_for="cell-l0000000")
    assert "cell-l0000000" in action.reason


def test_repair_prefers_lost_over_suspect_and_departing_regardless_of_id():
    rows = [
        *serving(1),
        inst("cell-a0000000", "DRAINING"),
        inst("cell-b0000000", "SUSPECT"),
        inst("cell-c0000000", "LOST"),
    ]
    create(plan(want(max_surge=5), rows), repair_for="cell-c0000000")


def test_repair_takes_the_lowest_lost_id():
    rows = [*serving(1), inst("cell-l0000009", "LOST"), inst("cell-l0000001", "LOST")]
    create(plan(want(max_surge=5), rows), repair_for="cell-l0000001")


def test_repair_falls_back_to_suspect_then_departing():
    rows = [*serving(2), inst("cell-b0000000", "SUSPECT"), inst("cell-a0000000", "SEALED")]
    create(plan(want(), rows), repair_for="cell-b0000000")
    rows = [*serving(2), inst("cell-a0000002", "RETIRING"), inst("cell-a0000001", "DRAINING")]
    create(plan(want(), rows), repair_for="cell-a0000001")


def test_repair_skips_a_target_already_replaced_by_a_live_instance():
    rows = [
        *serving(2),
        inst("cell-l0000001", "LOST"),
        inst("cell-l0000002", "LOST"),
        inst("cell-f0000000", "FAILED_PREPARING", repair=True, repair_for="cell-l0000001"),
    ]
    create(plan(want(max_repair=2), rows), repair_for="cell-l0000002")


def test_a_terminal_replacement_does_not_count_as_replacing():
    rows = [
        *serving(2),
        inst("cell-l0000001", "LOST"),
        inst("cell-f0000000", "FAILURE_RETIRED", repair=True, repair_for="cell-l0000001"),
    ]
    create(plan(want(), rows), repair_for="cell-l0000001")


def test_repair_budget_exhausted_plans_nothing():
    rows = [
        *serving(2),
        inst("cell-l0000001", "LOST"),
        inst("cell-l0000002", "LOST"),
        inst("cell-f0000000", "FAILED_PREPARING", repair=True, repair_for="cell-l0000001"),
    ]
    reason = nothing(plan(want(max_repair=1, max_surge=5), rows))
    assert "repair budget" in reason


def test_zero_repair_budget_never_repairs():
    rows = [*serving(2), inst("cell-l0000000", "LOST")]
    nothing(plan(want(max_repair=0, max_surge=5), rows))


def test_a_serving_repair_whose_target_left_no_longer_uses_the_budget():
    rows = [
        inst("cell-s0000001"),
        inst("cell-r0000001", repair=True, repair_for="cell-a0000000"),
        inst("cell-a0000000", "FAILURE_RETIRED"),
        inst("cell-l0000002", "LOST"),
    ]
    create(plan(want(), rows), repair_for="cell-l0000002")


def test_live_ceiling_desired_plus_surge_plus_repair():
    rows = [*serving(2), *(inst(f"cell-l000000{i}", "LOST") for i in range(3))]
    # live 5 >= 3 + 0 + 2
    reason = nothing(plan(want(max_surge=0, max_repair=2), rows))
    assert "desired + surge + repair" in reason
    # one more slot of surge: repair the first lost
    create(plan(want(max_surge=1, max_repair=2), rows), repair_for="cell-l0000000")


def test_no_repair_target_plans_nothing():
    rows = [*serving(2), inst("cell-f0000000", "FAILED_PREPARING")]
    reason = nothing(plan(want(), rows))
    assert "no unreplaced" in reason


def test_rule_four_ends_the_plan_even_with_outdated_serving_instances():
    # serving 2 < desired 3 and nothing to repair: never drain below the desired count here.
    rows = [*serving(2, release="rel-1"), inst("cell-f0000000", "FAILED_PREPARING")]
    nothing(plan(want(min_serving=1), rows))


# Rule 5


def test_any_departing_instance_plans_nothing():
    rows = [*serving(3, release="rel-1"), inst("cell-d0000000", "DRAINING")]
    assert nothing(plan(want(), rows)) == "already draining"


# Rule 6


def test_converged_pool_plans_nothing():
    nothing(plan(want(), serving(3)))


def test_drains_the_oldest_outdated_serving_instance():
    rows = [
        inst("cell-a0000000", release="rel-1", age=1),
        inst("cell-z0000000", release="rel-1", age=9),  # oldest despite the highest id
        inst("cell-m0000000", age=20),  # up to date
    ]
    drain(plan(want(), rows), "cell-z0000000")


def test_spec_outdated_counts_as_outdated():
    rows = [*serving(2), inst("cell-z0000000", outdated=True)]
    drain(plan(want(), rows), "cell-z0000000")


def test_rollout_blocked_instances_are_left_alone():
    rows = [*serving(2), inst("cell-z0000000", release="rel-1", blocked=True)]
    nothing(plan(want(), rows))


def test_surge_replacement_when_draining_would_break_the_floor():
    rows = serving(3, release="rel-1")
    create(plan(want(min_serving=3), rows))


def test_wait_when_floor_and_surge_are_both_used():
    rows = serving(3, release="rel-1")
    reason = nothing(plan(want(min_serving=3, max_surge=0), rows))
    assert "waiting" in reason


def test_after_a_surge_member_serves_the_oldest_outdated_is_drained():
    rows = [*serving(3, release="rel-1", age=5), inst("cell-n0000000", age=0)]
    drain(plan(want(min_serving=3), rows), "cell-s0000000")


def test_dataclasses_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        want().desired = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        inst("cell-a0000000").phase = "LOST"  # type: ignore[misc]
    action = create(plan(want(), []))
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.kind = "drain"  # type: ignore[misc]


# A whole rollout, one planned action and one step per instance per tick.


def _advance(rows: list[InstanceView]) -> list[InstanceView]:
    moved = []
    for row in rows:
        if row.phase in PRE_SERVING:
            row = dataclasses.replace(row, phase="SERVING")
        elif row.phase == "DRAINING":
            row = dataclasses.replace(row, phase="RETIRED")
        moved.append(row)
    return moved


@pytest.mark.parametrize(("min_serving", "surge"), [(2, 1), (3, 1), (1, 0), (3, 2)])
def test_rolling_release_converges_one_candidate_at_a_time(min_serving, surge):
    goal = want(min_serving=min_serving, max_surge=surge)
    rows = serving(3, release="rel-1", age=100)
    seq = 0
    for _tick in range(50):
        action, _ = plan(goal, rows)
        if action is not None and action.kind == "create":
            seq += 1
            rows.append(inst(f"cell-n{seq:07d}", "PENDING", age=-seq))
        elif action is not None:
            rows = [
                dataclasses.replace(r, phase="DRAINING")
                if r.instance_id == action.instance_id
                else r
                for r in rows
            ]
        counts = planner.count(rows)
        assert counts.pre_serving <= 1
        assert counts.serving >= min_serving
        assert counts.live <= goal.desired + goal.max_surge + goal.max_repair
        rows = _advance(rows)
    live = [r for r in rows if r.phase == "SERVING"]
    assert len(live) == 3
    assert {r.release_id for r in live} == {"rel-2"}
    assert plan(goal, rows) == (None, "pool is up to date")
