"""Stamped step names and sequences per direction (spec reshard §3.2; tests pin them), and the
cancel cutoff's shape; each operation kind picks its sequence and cutoff (``reshard.kinds``)."""

from __future__ import annotations

from dataclasses import dataclass

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


def before_cutoff(cutoff: CancelCutoff, step: str, target_kind: str, login_ready: bool) -> bool:
    """True while a cancel at ``step`` is still honoured."""
    if cutoff.login_ready_ends_it and login_ready:
        return False
    return not at_or_past(step, cutoff.step, target_kind)
