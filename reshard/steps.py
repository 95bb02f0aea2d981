"""Stamped step names and sequences per direction (spec reshard §3.2; tests pin them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

CNPG_TO_CNPG = (
    "blocking",
    "preparing_access",
    "draining",
    "fencing_source",
    "pausing_compaction",
    "backup_catalog",
    "cutover",
    "copying",
    "verifying",
    "cleaning_up",
    "finalizing",
)
EXTERNAL_TO_CNPG = (
    "blocking",
    "draining",
    "pausing_compaction",
    "backup_catalog",
    "cutover",
    "copying",
    "verifying",
    "cleaning_up",
    "finalizing",
)
CNPG_TO_EXTERNAL = (
    "blocking",
    "preparing_access",
    "draining",
    "fencing_source",
    "pausing_compaction",
    "backup_catalog",
    "copying",
    "verifying",
    "orphaning_source",
    "cutover",
    "verifying_external",
    "cleaning_up",
    "finalizing",
)
ALL_STEPS = tuple(dict.fromkeys(CNPG_TO_CNPG + CNPG_TO_EXTERNAL))


def sequence(source_kind: str, target_kind: str) -> tuple[str, ...]:
    if source_kind == "cnpg" and target_kind == "cnpg":
        return CNPG_TO_CNPG
    if source_kind == "external" and target_kind == "cnpg":
        return EXTERNAL_TO_CNPG
    if source_kind == "cnpg" and target_kind == "external":
        return CNPG_TO_EXTERNAL
    raise ValueError(f"unsupported direction {source_kind} -> {target_kind}")


def ordering_list(target_kind: str) -> tuple[str, ...]:
    """The list "at or past step X" is judged on (§3.2)."""
    return CNPG_TO_EXTERNAL if target_kind == "external" else CNPG_TO_CNPG


def at_or_past(step: str, reference: str, target_kind: str) -> bool:
    """True when ``step`` is ``reference`` or later; an empty or unknown step is not reached."""
    order = ordering_list(target_kind)
    if step not in order:
        return False
    return order.index(step) >= order.index(reference)


@dataclass(frozen=True)
class CancelCutoff:
    """Where a cancel stops being honoured (docs/runner.md "Cancel cutoffs"): from ``step`` on
    (or, for a reshard to a cnpg store, once the target login was seen ready in the cutover) the
    operation completes instead. ``description`` is the operator's wording (dry run, admin,
    the cancel answer)."""

    step: str
    description: str
    login_ready_ends_it: bool = False


def cancel_cutoff(*, kind: str, in_place: bool, source_kind: str, target_kind: str) -> CancelCutoff:
    """Each kind's cutoff is its real commit point: nothing before it is irreversible.

    - a restore (onto another store or in place): ``cleaning_up``, the drop of the replaced
      catalog; until then the binding can be pointed back and the restored copy dropped;
    - a reshard to an external store: ``orphaning_source``;
    - a reshard to a cnpg store: the target login ready in the cutover (at the latest when
      ``copying`` is stamped) — the spec's cutoff for the rendered tenant.
    """
    if kind == "restore":
        where = "in place" if in_place else "onto another store"
        return CancelCutoff(
            "cleaning_up",
            f"a restore {where} can be cancelled until cleaning_up, when the replaced catalog "
            "is dropped",
        )
    if target_kind == "external":
        return CancelCutoff(
            "orphaning_source",
            "a reshard to an external store can be cancelled until orphaning_source",
        )
    return CancelCutoff(
        "copying",
        "a reshard to a cnpg store can be cancelled until the target login is ready in the "
        "cutover (before copying)",
        login_ready_ends_it=True,
    )


class _OpShape(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def in_place(self) -> bool: ...
    @property
    def source_kind(self) -> str: ...
    @property
    def target_kind(self) -> str: ...


def cutoff_for(op: _OpShape) -> CancelCutoff:
    """:func:`cancel_cutoff` of an operation row."""
    return cancel_cutoff(
        kind=op.kind, in_place=op.in_place, source_kind=op.source_kind, target_kind=op.target_kind
    )


def before_cutoff(cutoff: CancelCutoff, step: str, target_kind: str, login_ready: bool) -> bool:
    """True while a cancel at ``step`` is still honoured."""
    if cutoff.login_ready_ends_it and login_ready:
        return False
    return not at_or_past(step, cutoff.step, target_kind)
