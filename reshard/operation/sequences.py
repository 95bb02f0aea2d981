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
# The online mode (docs/copy.md "Online copy"), cnpg→cnpg only: the target is rendered and the
# catalog pre-copied while the tenant runs; the block's part that grows with the catalog is left
# to the catch-up. Two placements of the full verification and the backup (the op's
# ``backup_after_unblock``, frozen at its start from DUCKGRES_RESHARD_ONLINE_BACKUP; docs/runner.md
# "The backup in the online mode"): after the unblock (``opening`` is the commit point), or
# inside the window before the flip, as the offline move has them.
_ONLINE_TO_CATCH_UP = (
    "rendering_target",
    "precopying",
    "blocking",
    "preparing_access",
    "draining",
    "fencing_source",
    "pausing_compaction",
    "catching_up",
)
ONLINE_CNPG_TO_CNPG = (
    *_ONLINE_TO_CATCH_UP,
    "cutover",
    "opening",
    "verifying",
    "backup_catalog",
    "cleaning_up",
    "finalizing",
)
ONLINE_BACKUP_FIRST = (
    *_ONLINE_TO_CATCH_UP,
    "backup_catalog",
    "cutover",
    "verifying",
    "cleaning_up",
    "finalizing",
)
ALL_STEPS = tuple(dict.fromkeys(ONLINE_CNPG_TO_CNPG + CNPG_TO_CNPG + CNPG_TO_EXTERNAL))
# The op's copy variant (``ReshardOperation.copy_variant``) → its ordering.
OFFLINE = "offline"
ONLINE = "online"
ONLINE_BACKUP_FIRST_VARIANT = "online-backup-first"


def sequence(source_kind: str, target_kind: str) -> tuple[str, ...]:
    if source_kind == "cnpg" and target_kind == "cnpg":
        return CNPG_TO_CNPG
    if source_kind == "external" and target_kind == "cnpg":
        return EXTERNAL_TO_CNPG
    if source_kind == "cnpg" and target_kind == "external":
        return CNPG_TO_EXTERNAL
    raise ValueError(f"unsupported direction {source_kind} -> {target_kind}")


def ordering_list(target_kind: str, variant: str = OFFLINE) -> tuple[str, ...]:
    """The list "at or past step X" is judged on (§3.2), per copy variant."""
    if variant == ONLINE:
        return ONLINE_CNPG_TO_CNPG
    if variant == ONLINE_BACKUP_FIRST_VARIANT:
        return ONLINE_BACKUP_FIRST
    return CNPG_TO_EXTERNAL if target_kind == "external" else CNPG_TO_CNPG


def at_or_past(step: str, reference: str, target_kind: str, variant: str = OFFLINE) -> bool:
    """True when ``step`` is ``reference`` or later; an empty or unknown step is not reached,
    and so is a reference the ordering does not have."""
    order = ordering_list(target_kind, variant)
    if step not in order or reference not in order:
        return False
    return order.index(step) >= order.index(reference)


def first_target_write(variant: str) -> str:
    """The first step that writes the target's tables: the pre-copy online, else the copy."""
    return "precopying" if variant in (ONLINE, ONLINE_BACKUP_FIRST_VARIANT) else "copying"


@dataclass(frozen=True)
class CancelCutoff:
    """Where a cancel stops being honoured (docs/runner.md "Cancel cutoffs"): from ``step`` on
    (or, for a reshard to a cnpg store, once the target login was seen ready in the cutover) the
    operation completes instead. ``description`` is the operator's wording (dry run, admin,
    the cancel answer)."""

    step: str
    description: str
    login_ready_ends_it: bool = False


def before_cutoff(
    cutoff: CancelCutoff, step: str, target_kind: str, login_ready: bool, variant: str = OFFLINE
) -> bool:
    """True while a cancel at ``step`` is still honoured."""
    if cutoff.login_ready_ends_it and login_ready:
        return False
    return not at_or_past(step, cutoff.step, target_kind, variant)
