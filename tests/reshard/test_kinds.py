"""Operation kinds as objects (``reshard.kinds``, ``reshard.runner.kind``; issue 27 item 1).

The runner never branches on the kind: no module under ``reshard/runner`` reads ``OpKind`` or
``in_place``. A new kind is one module (here, the toy kind below: two steps of its own and the
shared finalize), registered, and the real runner walks it to ``succeeded``; an operation whose
kind nobody registered fails loudly instead of running as a reshard."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, models
from django.db.models.functions import Now

from duckgres_admin.models import OpKind, ReshardOperation, Warehouse
from reshard import kinds
from reshard.kinds.base import BaseKind
from reshard.runner import execute
from reshard.runner import kind as registry
from reshard.runner.env import StepEnv
from reshard.runner.steps import finalize
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.runner import op_log, step_rows

RUNNER = Path(__file__).resolve().parents[2] / "reshard" / "runner"


def _kind_tests(path: Path) -> list[str]:
    """Every read of ``OpKind`` or ``<x>.in_place`` in ``path`` (its code, not its text)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name) and node.id == "OpKind":
            found.append(f"{path.name}:{node.lineno} OpKind")
        if isinstance(node, ast.Attribute) and node.attr in ("in_place", "OpKind"):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.ImportFrom) and any(a.name == "OpKind" for a in node.names):
            found.append(f"{path.name}:{node.lineno} import OpKind")
    return found


def test_no_runner_module_tests_the_operation_kind() -> None:
    modules = sorted(RUNNER.rglob("*.py"))
    assert len(modules) > 20, modules
    found = [hit for path in modules for hit in _kind_tests(path)]
    assert found == [], f"the runner asks reshard.runner.kind.kind_of instead: {found}"


def test_the_scan_sees_a_kind_test(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from m import OpKind\nif op.in_place or op.kind == OpKind.RESTORE:\n    x\n")
    assert _kind_tests(probe) == [
        "probe.py:1 import OpKind",
        "probe.py:2 .in_place",
        "probe.py:2 OpKind",
    ]


def test_the_shipped_kinds_answer_for_their_rows() -> None:
    reshard = ReshardOperation(kind=OpKind.RESHARD, source_kind="cnpg", target_kind="cnpg")
    restore = ReshardOperation(
        kind=OpKind.RESTORE, source_kind="cnpg", target_kind="cnpg", from_shard="a", to_shard="b"
    )
    in_place = ReshardOperation(
        kind=OpKind.RESTORE, source_kind="cnpg", target_kind="cnpg", from_shard="a", to_shard="a"
    )
    assert registry.kind_of(reshard) is kinds.RESHARD
    assert registry.kind_of(restore) is kinds.restore_kind(in_place=False)
    assert registry.kind_of(in_place) is kinds.restore_kind(in_place=True)
    assert {k.event for k in kinds.SHIPPED} == {"reshard", "restore"}
    assert kinds.RESHARD.cancel_cutoff("external").step == "orphaning_source"
    assert kinds.RESHARD.cancel_cutoff("cnpg").login_ready_ends_it
    assert kinds.restore_kind(in_place=True).cancel_cutoff("cnpg").step == "cleaning_up"
    assert kinds.restore_kind(in_place=True).step("cutover") is not kinds.RESHARD.step("cutover")
    assert kinds.RESHARD.redoable_steps("cnpg", "external")[-1] == "verifying"
    assert kinds.RESHARD.redoable_steps("cnpg", "cnpg")[-1] == "backup_catalog"


def test_a_second_kind_for_a_key_is_refused() -> None:
    impostor = BaseKind(key=kinds.RESHARD.key, label="impostor")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(impostor)
    assert registry.kind_of(ReshardOperation(kind=OpKind.RESHARD)) is kinds.RESHARD


# --- the toy kind: one module's worth ------------------------------------------------------------
TOY_STEPS = ("toy_marking", "finalizing")


def _toy_marking(env: StepEnv) -> None:
    """The toy's own step: block the warehouse (as the reshard's block would) and say so."""
    moved = Warehouse.objects.filter(org_id=env.op.org_id, state="ready").update(
        state="resharding", updated_at=Now()
    )
    env.fence.update(blocked_at=Now())
    env.log.info(f"toy kind marked warehouse {env.op.org_id} ({moved} row)")


@dataclass(frozen=True)
class ToyKind(BaseKind):
    def sequence(self, source_kind: str, target_kind: str) -> tuple[str, ...]:
        return TOY_STEPS


TOY = ToyKind(
    key=("toy", False, "offline"),
    label="toy",
    overrides={"toy_marking": _toy_marking, "finalizing": finalize.run},
)


KIND_CONSTRAINT = "reshard_op_restore_has_key_and_cnpg_target"


def _kind_constraint() -> models.CheckConstraint:
    found = [c for c in ReshardOperation._meta.constraints if c.name == KIND_CONSTRAINT]
    assert len(found) == 1, found
    assert isinstance(found[0], models.CheckConstraint), found
    return found[0]


@pytest.fixture
def toy_schema(transactional_db: None) -> Iterator[None]:
    """What the toy kind's one migration does: the row constraint that names every kind
    admits ``toy`` too (undone after the test; each test worker has its own database)."""
    shipped = _kind_constraint()
    assert isinstance(shipped.condition, models.Q), shipped.condition
    widened = models.CheckConstraint(
        condition=shipped.condition | (models.Q(kind="toy") & models.Q(restore_backup_key="")),
        name=KIND_CONSTRAINT,
    )
    with connection.schema_editor() as editor:
        editor.remove_constraint(ReshardOperation, shipped)
        editor.add_constraint(ReshardOperation, widened)
    try:
        yield
    finally:
        ReshardOperation.objects.filter(kind="toy").delete()
        with connection.schema_editor() as editor:
            editor.remove_constraint(ReshardOperation, widened)
            editor.add_constraint(ReshardOperation, shipped)


@pytest.fixture
def toy_kind(toy_schema: None) -> Iterator[ToyKind]:
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY)


def _toy_op(**extra: Any) -> ReshardOperation:
    wh = new_warehouse(
        store=new_store(),
        metadata_store_kind="cnpg",
        metadata_store_database="toy_db",
        metadata_store_user="toy_user",
        metadata_store_password_ref="env:TOY_PASSWORD",
    )
    return new_op(wh, to_store=new_store(), **extra)


def _run_toy(claimed_env: Any) -> ReshardOperation:
    """A ``toy`` operation claimed and executed in this process by the runner's ``execute``."""
    op = _toy_op(kind="toy")
    execute.execute(claimed_env(op))
    op.refresh_from_db()
    return op


def test_a_toy_kind_with_two_steps_runs_through_the_runner(
    toy_kind: ToyKind, claimed_env: Any
) -> None:
    op = _run_toy(claimed_env)
    assert op.state == "succeeded", (op.state, op.error)
    assert [(step, outcome) for step, outcome, _ in step_rows(op.id)] == [
        ("toy_marking", "ok"),
        ("finalizing", "ok"),
    ]
    lines = op_log(op.id)
    assert any(line.startswith("toy kind marked warehouse") for line in lines), lines
    assert Warehouse.objects.get(org_id=op.org_id).state == "ready"


@pytest.mark.safeguard("reshard-142")
def test_an_operation_of_an_unregistered_kind_fails_loudly(
    toy_schema: None, claimed_env: Any
) -> None:
    op = _run_toy(claimed_env)
    assert op.state == "failed"
    assert "no operation kind is registered for ('toy', False, 'offline')" in op.error, op.error
    assert "touched nothing" in op.error
    assert step_rows(op.id) == []
    assert not op.recovery_required
    assert Warehouse.objects.get(org_id=op.org_id).state == "ready"
