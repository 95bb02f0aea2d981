"""The one ownership rule (spec reshard §1 inv. 4, §4.1, §4.13, §4.15): the runner's claim, the
launch task and the janitor agree about which operation needs an owner, because all three compose
``reshard.operation.ownership``; the runner's name and the milestone columns are spelled in one
place."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from duckgres_admin.adminui import progress
from duckgres_admin.models import ReshardOperation
from duckgres_admin.platform import names
from reshard.control import janitor, recovery
from reshard.control.launch import launch_runner
from reshard.operation import ownership
from reshard.runner import fencing
from tests.fixtures.janitor import FakeLauncher, age_op, janitor_env, make_janitor, new_op

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env

ROOT = Path(__file__).resolve().parents[2]

# label: (make the op, needs an owner (claim, launch), needs a runner (janitor)). The janitor
# leaves a pending op to the launch task for the pending grace (120 s), nothing else differs.
# Stale window 300 s (janitor_env).
Case = tuple[Callable[[], ReshardOperation], bool, bool]


def _op(state: str, **ages: str) -> Callable[[], ReshardOperation]:
    def make() -> ReshardOperation:
        extra = {"runner_id": "old-runner", "runner_epoch": 1} if state != "pending" else {}
        op = new_op(state, **extra)
        if ages:
            age_op(op.id, **ages)
        return op

    return make


CASES: dict[str, Case] = {
    "pending, within the pending grace": (_op("pending"), True, False),
    "pending, past the pending grace": (_op("pending", created_at="10 minutes"), True, True),
    "running, null heartbeat": (_op("running", created_at="20 minutes"), True, True),
    "running, stale heartbeat": (
        _op("running", created_at="20 minutes", heartbeat_at="10 minutes"),
        True,
        True,
    ),
    "running, heartbeat just past the stale window": (
        _op("running", created_at="20 minutes", heartbeat_at="310 seconds"),
        True,
        True,
    ),
    "running, heartbeat just inside the stale window": (
        _op("running", created_at="20 minutes", heartbeat_at="290 seconds"),
        False,
        False,
    ),
    "running, fresh heartbeat": (
        _op("running", created_at="20 minutes", heartbeat_at="5 seconds"),
        False,
        False,
    ),
    **{
        f"{state}, old and without heartbeat": (
            _op(state, created_at="20 minutes", finished_at="10 minutes"),
            False,
            False,
        )
        for state in ("succeeded", "failed", "cancelled")
    },
    "failed, stale heartbeat": (
        _op("failed", created_at="20 minutes", heartbeat_at="10 minutes", finished_at="5 minutes"),
        False,
        False,
    ),
}


def _fresh(label: str) -> ReshardOperation:
    return CASES[label][0]()


@pytest.mark.parametrize("label", sorted(CASES))
def test_the_claim_the_launch_check_and_the_janitor_agree(label: str, settings) -> None:
    settings.DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS = 0
    _make, needs_owner, needs_runner = CASES[label]

    # The runner's claim (its compare-and-set) takes the op exactly when it needs an owner.
    op = _fresh(label)
    claimed = fencing.claim(op.id, "probe-runner")
    assert (claimed is not None) is needs_owner, f"claim of a {label} op"

    # The launch task starts a runner exactly then too.
    op = _fresh(label)
    outcome = launch_runner(op.id, launcher_for=lambda kind: FakeLauncher())
    assert outcome == ("launched" if needs_owner else "not-needed"), f"launch of a {label} op"

    # The janitor relaunches it (listing and respawn CAS) exactly when it needs a runner.
    ReshardOperation.objects.all().delete()
    op = _fresh(label)
    launcher = FakeLauncher()
    report = make_janitor(launcher).reconcile()
    assert report.completed
    relaunched = launcher.creates(op.id)
    assert bool(relaunched) is needs_runner, f"janitor on a {label} op: {report.actions}"
    if needs_runner:
        assert ReshardOperation.objects.get(id=op.id).respawn_attempts == 1
    assert needs_owner or not needs_runner, "the janitor never relaunches an owned op"


def test_every_statement_composes_the_one_fragment() -> None:
    fragment = ownership.NEEDS_OWNER_SQL
    assert fragment in ownership.NEEDS_RUNNER_SQL
    assert fragment in fencing._CLAIM_SQL
    for statement in (janitor._INCREMENT_SQL, janitor._FORCE_FAIL_SQL):
        assert ownership.NEEDS_RUNNER_SQL in statement


def _product_sources() -> list[Path]:
    files = [
        path for top in ("reshard", "duckgres_admin") for path in ROOT.joinpath(top).rglob("*.py")
    ]
    return [p for p in files if "migrations" not in p.parts]


def _spelled_in(pattern: str) -> list[str]:
    regex = re.compile(pattern, re.MULTILINE)
    return sorted(
        str(p.relative_to(ROOT)) for p in _product_sources() if regex.search(p.read_text())
    )


def test_the_ownership_predicate_is_spelled_once() -> None:
    assert _spelled_in(r"heartbeat_at IS NULL") == ["reshard/operation/ownership.py"]
    assert _spelled_in(r"heartbeat_at < now\(\)") == ["reshard/operation/ownership.py"]


def test_the_runner_name_is_built_in_one_place() -> None:
    assert _spelled_in(r"duckgres-reshard-op-[{\"']") == ["duckgres_admin/platform/names.py"]
    assert names.runner_name(42) == "duckgres-reshard-op-42"
    assert names.runner_name(42, "-pg_dump") == "duckgres-reshard-op-42-pg_dump"


def test_the_milestones_are_defined_once() -> None:
    assert _spelled_in(r"^MILESTONES\s*=") == ["duckgres_admin/platform/names.py"]
    for user in (progress, recovery):
        assert vars(user)["MILESTONES"] is names.MILESTONES, user.__name__
