"""Instance phase table and predicates (spec trino-pools §3.1)."""

from __future__ import annotations

import itertools

import pytest

from duckgres_admin.models.trino import InstancePhase
from trino_pools import phases
from trino_pools.phases import InvalidTransition, UnknownPhase, check_transition

P = InstancePhase

TABLE = {
    "PENDING": {"CREATING", "FAILED_PREPARING"},
    "CREATING": {"PREPARING", "FAILED_PREPARING"},
    "PREPARING": {"VALIDATING", "FAILED_PREPARING"},
    "VALIDATING": {"ADMITTED", "PREPARING", "FAILED_PREPARING"},
    "ADMITTED": {"SERVING", "DRAINING", "SUSPECT"},
    "SERVING": {"DRAINING", "SUSPECT"},
    "DRAINING": {"SEALED", "SUSPECT"},
    "SEALED": {"RETIRING", "SUSPECT"},
    "RETIRING": {"RETIRED"},
    "SUSPECT": {"DRAINING", "LOST"},
    "LOST": {"FAILURE_RETIRED"},
    "FAILED_PREPARING": {"FAILURE_RETIRED"},
    "RETIRED": set(),
    "FAILURE_RETIRED": set(),
}


def test_table_covers_every_model_phase():
    assert set(phases.ALLOWED) == {p.value for p in InstancePhase} == set(TABLE)
    assert set(phases.ALL_PHASES) == set(TABLE)


@pytest.mark.parametrize(("frm", "to"), list(itertools.product(TABLE, TABLE)))
def test_every_pair_is_allowed_exactly_as_the_table_says(frm, to):
    if to in TABLE[frm]:
        check_transition(frm, to)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(frm, to)


def test_plain_strings_and_enum_members_are_equivalent():
    check_transition(P.SERVING, P.DRAINING)
    check_transition("SERVING", P.DRAINING)
    check_transition(P.SERVING, "DRAINING")


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        ("SUSPECT", "SERVING"),  # never back to serving
        ("SERVING", "SERVING"),  # no self moves
        ("FAILED_PREPARING", "RETIRED"),
        ("RETIRED", "PENDING"),
        ("LOST", "DRAINING"),
    ],
)
def test_forbidden_moves(frm, to):
    with pytest.raises(InvalidTransition):
        check_transition(frm, to)


@pytest.mark.parametrize(
    ("frm", "to"),
    [("BOGUS", "SERVING"), ("SERVING", "BOGUS"), ("", "PENDING"), ("serving", "DRAINING")],
)
def test_unknown_phase_is_invalid_never_defaulted(frm, to):
    with pytest.raises(UnknownPhase):
        check_transition(frm, to)


@pytest.mark.parametrize(
    "predicate",
    [
        phases.is_serving,
        phases.occupies_capacity,
        phases.is_pre_serving,
        phases.is_departing,
        phases.deletion_permitted,
        phases.is_terminal,
    ],
)
def test_predicates_refuse_unknown_phases(predicate):
    with pytest.raises(UnknownPhase):
        predicate("UNKNOWN")
    assert not phases.is_valid("UNKNOWN")


def _where(predicate) -> set[str]:
    return {p for p in TABLE if predicate(p)}


def test_predicates():
    assert _where(phases.is_serving) == {"SERVING"}
    assert _where(phases.occupies_capacity) == set(TABLE) - {"RETIRED", "FAILURE_RETIRED"}
    assert {"SUSPECT", "LOST", "FAILED_PREPARING"} <= _where(phases.occupies_capacity)
    assert _where(phases.is_pre_serving) == {
        "PENDING",
        "CREATING",
        "PREPARING",
        "VALIDATING",
        "ADMITTED",
    }
    assert _where(phases.is_departing) == {"DRAINING", "SEALED", "RETIRING"}
    assert _where(phases.deletion_permitted) == {
        "RETIRING",
        "RETIRED",
        "FAILURE_RETIRED",
        "FAILED_PREPARING",
    }
    assert _where(phases.is_terminal) == {"RETIRED", "FAILURE_RETIRED"}


def test_terminal_phases_have_no_exit_and_failed_preparing_is_not_terminal():
    for phase in ("RETIRED", "FAILURE_RETIRED"):
        assert phases.ALLOWED[phase] == frozenset()
    assert not phases.is_terminal("FAILED_PREPARING")
    assert phases.ALLOWED["FAILED_PREPARING"] == {"FAILURE_RETIRED"}
