"""Instance phases of a Trino pool (spec trino-pools §3.1): the transition table and predicates.

Invariants:

- The table is the only source of allowed moves. ``check_transition`` refuses anything else,
  including a move to the same phase; a phase outside ``InstancePhase`` is invalid (raises
  ``UnknownPhase``), never defaulted to a neighbouring phase.
- ``SUSPECT`` never returns to ``SERVING``; ``FAILED_PREPARING`` is not terminal (its resources
  still exist and are removed by guarded failure retirement); only ``RETIRED`` and
  ``FAILURE_RETIRED`` are terminal.
- Every predicate raises ``UnknownPhase`` for an unrecognised value instead of answering
  ``False``: a corrupt row must stop the planner, not silently stop counting as capacity.
- Kubernetes objects of an instance may be deleted only in ``RETIRING``, ``RETIRED``,
  ``FAILURE_RETIRED`` or ``FAILED_PREPARING`` (invariant 6).

Every phase change is a fenced CAS ``from → to`` done by the operator; this module only decides
whether the move is allowed.
"""

from __future__ import annotations

from duckgres_admin.models.trino import InstancePhase

P = InstancePhase


class InvalidTransition(ValueError):
    """A phase change the §3.1 table does not allow."""


class UnknownPhase(InvalidTransition):
    """A value that is not one of the 14 instance phases."""


ALLOWED: dict[str, frozenset[str]] = {
    P.PENDING: frozenset({P.CREATING, P.FAILED_PREPARING}),
    P.CREATING: frozenset({P.PREPARING, P.FAILED_PREPARING}),
    P.PREPARING: frozenset({P.VALIDATING, P.FAILED_PREPARING}),
    P.VALIDATING: frozenset({P.ADMITTED, P.PREPARING, P.FAILED_PREPARING}),
    P.ADMITTED: frozenset({P.SERVING, P.DRAINING, P.SUSPECT}),
    P.SERVING: frozenset({P.DRAINING, P.SUSPECT}),
    P.DRAINING: frozenset({P.SEALED, P.SUSPECT}),
    P.SEALED: frozenset({P.RETIRING, P.SUSPECT}),
    P.RETIRING: frozenset({P.RETIRED}),
    P.SUSPECT: frozenset({P.DRAINING, P.LOST}),
    P.LOST: frozenset({P.FAILURE_RETIRED}),
    P.FAILED_PREPARING: frozenset({P.FAILURE_RETIRED}),
    P.RETIRED: frozenset(),
    P.FAILURE_RETIRED: frozenset(),
}
"""``from`` phase → the phases it may move to (spec §3.1)."""

ALL_PHASES: tuple[str, ...] = tuple(p.value for p in InstancePhase)

TERMINAL: frozenset[str] = frozenset({P.RETIRED, P.FAILURE_RETIRED})
PRE_SERVING: frozenset[str] = frozenset(
    {P.PENDING, P.CREATING, P.PREPARING, P.VALIDATING, P.ADMITTED}
)
DEPARTING: frozenset[str] = frozenset({P.DRAINING, P.SEALED, P.RETIRING})
DELETION_PERMITTED: frozenset[str] = frozenset(
    {P.RETIRING, P.RETIRED, P.FAILURE_RETIRED, P.FAILED_PREPARING}
)


def _known(phase: str) -> str:
    if phase not in ALLOWED:
        raise UnknownPhase(f"unknown Trino instance phase {phase!r}")
    return phase


def is_valid(phase: str) -> bool:
    """True for the 14 phases of §3.1; the one predicate that never raises."""
    return phase in ALLOWED


def check_transition(frm: str, to: str) -> None:
    """Raise ``InvalidTransition`` unless ``frm → to`` is in the §3.1 table."""
    _known(frm)
    _known(to)
    if to not in ALLOWED[frm]:
        raise InvalidTransition(f"Trino instance phase {frm} cannot move to {to}")


def is_serving(phase: str) -> bool:
    return _known(phase) == P.SERVING


def occupies_capacity(phase: str) -> bool:
    """Every valid non-terminal phase, including ``SUSPECT``, ``LOST`` and ``FAILED_PREPARING``."""
    return _known(phase) not in TERMINAL


def is_pre_serving(phase: str) -> bool:
    """``PENDING`` .. ``ADMITTED``: a candidate that has not served yet."""
    return _known(phase) in PRE_SERVING


def is_departing(phase: str) -> bool:
    return _known(phase) in DEPARTING


def deletion_permitted(phase: str) -> bool:
    """Whether the instance's own Kubernetes objects may be deleted in this phase."""
    return _known(phase) in DELETION_PERMITTED


def is_terminal(phase: str) -> bool:
    return _known(phase) in TERMINAL
