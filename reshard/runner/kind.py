"""The operation kind as the runner drives it: the ``Kind`` protocol and the registry of kinds.

A kind (``reshard.kinds``: the reshard, the restore onto another store, the in-place restore) is
one object that says everything the runner would otherwise learn by testing ``op.kind`` or
``op.in_place``: its step sequence per direction, its cancel cutoff, its commit point, the steps
a takeover may redo, its step functions (overrides, falling back to the shared registry of
``reshard.runner.steps``) and the few hooks where a shared step differs per kind.

Invariants:

- **The runner never branches on the kind.** No module of ``reshard.runner`` tests ``OpKind``
  or ``in_place``; it asks :func:`kind_of` (a keyed lookup on ``ReshardOperation.kind_key``)
  and calls the kind.
- **One kind per key, registered once.** ``reshard.kinds`` registers the shipped kinds when
  Django starts (``duckgres_admin.apps``); a second registration of a key is refused, and an
  operation whose key no kind claims fails loudly (``LookupError`` naming the key), never as
  a reshard by default.
- **The runner does not import the kinds** (they import it, for their step functions): the
  registry is how it finds them, which keeps ``reshard.kinds`` → ``reshard.runner`` one-way.
"""

from __future__ import annotations

from typing import Protocol

from duckgres_admin.models import ReshardOperation
from reshard.operation.sequences import CancelCutoff
from reshard.runner.env import StepEnv, StepFn


class Kind(Protocol):
    """One kind of operation (see the module docstring; defaults in ``reshard.kinds.base``)."""

    @property
    def key(self) -> tuple[str, bool, str]:
        """``(OpKind value, in place, copy variant)``: what :func:`kind_of` matches on the row."""
        ...

    @property
    def label(self) -> str:
        """How it names itself to an operator ("reshard", "in-place restore", ...)."""
        ...

    @property
    def event(self) -> str:
        """The notification event prefix (``<event>.<state>``); the row's ``kind`` value."""
        ...

    @property
    def reruns_cleanup_on_takeover(self) -> bool:
        """A takeover at ``cleaning_up`` before the commit point runs the cleanup again
        (instead of finalizing without the drop)."""
        ...

    @property
    def source_role_after_drop(self) -> str:
        """What becomes of the source's tenant role, for the source-drop log line."""
        ...

    @property
    def renders_before_block(self) -> bool:
        """The kind renders its target before the block (the online mode): a takeover before
        the cutover may redo the steps although the target was rendered."""
        ...

    def describe(self, op: ReshardOperation) -> str:
        """The operation in the admin's words ("reshard", "restore of <key>")."""
        ...

    def sequence(self, source_kind: str, target_kind: str) -> tuple[str, ...]:
        """The stamped step names, in order, for this direction."""
        ...

    def cancel_cutoff(self, target_kind: str) -> CancelCutoff:
        """Where a cancel stops being honoured (its real commit point)."""
        ...

    def commit_point_passed(self, op: ReshardOperation) -> bool:
        """After this, failures roll forward and the source is never re-pointed."""
        ...

    def redoable_steps(self, source_kind: str, target_kind: str) -> tuple[str, ...]:
        """The steps a takeover may redo from the start (safeguard reshard-73)."""
        ...

    def step(self, name: str) -> StepFn | None:
        """The function of step ``name``: the kind's own, else the shared registry's."""
        ...

    def backup_mandatory(self, op: ReshardOperation) -> bool:
        """A failed pre-flip backup fails the operation (else: a warning, the run goes on)."""
        ...

    def backup_failure(self, error: str, *, mandatory: bool) -> str:
        """The operator's text for a failed backup."""
        ...

    def after_source_drop(self, env: StepEnv) -> None:
        """Runs after the cleanup's (or a roll-forward's) source drop."""
        ...

    def rollback_target(self, env: StepEnv) -> bool | None:
        """The rollback of a target of the kind's own (True: nothing left, False: the
        warehouse stays blocked); ``None``: the shared rule for a reshard's target."""
        ...

    def may_give_source_login(self, env: StepEnv) -> bool:
        """False while giving the source's tenant role LOGIN back must wait (rollback)."""
        ...

    def keep_source(self, env: StepEnv) -> str:
        """'' when the cleanup or a roll-forward may drop the source; else why it is kept (the
        operation then ends ``failed`` with that reason, the warehouse on its target)."""
        ...


_KINDS: dict[tuple[str, bool, str], Kind] = {}


def register(*kinds: Kind) -> None:
    """Add kinds to the registry; a key registered twice by different objects is refused."""
    for kind in kinds:
        known = _KINDS.get(kind.key)
        if known is not None and known is not kind:
            raise ValueError(f"operation kind {kind.key} is already registered ({known.label})")
        _KINDS[kind.key] = kind


def unregister(kind: Kind) -> None:
    """Remove ``kind`` (a test's own kind, when the test ends)."""
    if _KINDS.get(kind.key) is kind:
        del _KINDS[kind.key]


def kind_of(op: ReshardOperation) -> Kind:
    """The registered kind of ``op`` (``LookupError`` when none claims its key)."""
    key = op.kind_key
    try:
        return _KINDS[key]
    except KeyError:
        raise LookupError(
            f"no operation kind is registered for {key} (reshard.kinds registers the shipped "
            "kinds when Django starts)"
        ) from None


def registered() -> tuple[Kind, ...]:
    return tuple(_KINDS.values())
