"""The kinds of operation (``reshard.runner.kind.Kind``): the reshard, the restore onto another
store and the in-place restore, one object each.

Importing this package registers them (``duckgres_admin.apps`` does so when Django starts);
everything above the runner asks :func:`kind_of` instead of testing ``op.kind``. Adding a kind
is one module here, one ``OpKind`` member and its migration, and its face registrations
(docs/architecture.md "Add a kind").
"""

from __future__ import annotations

from reshard.kinds.base import BaseKind
from reshard.kinds.in_place import IN_PLACE_RESTORE
from reshard.kinds.online import ONLINE_RESHARD, ONLINE_RESHARD_BACKUP_FIRST, online_kind
from reshard.kinds.reshard import RESHARD
from reshard.kinds.restore import RESTORE
from reshard.runner.kind import Kind, kind_of, register

SHIPPED: tuple[Kind, ...] = (
    RESHARD,
    ONLINE_RESHARD,
    ONLINE_RESHARD_BACKUP_FIRST,
    RESTORE,
    IN_PLACE_RESTORE,
)
register(*SHIPPED)


def restore_kind(*, in_place: bool) -> Kind:
    """The restore's kind, in place or onto another store (its dry run, before any row)."""
    return IN_PLACE_RESTORE if in_place else RESTORE


__all__ = [
    "ONLINE_RESHARD",
    "RESHARD",
    "RESTORE",
    "SHIPPED",
    "BaseKind",
    "Kind",
    "kind_of",
    "online_kind",
    "restore_kind",
]
