"""The reshard: move one tenant's catalog to another metadata store (docs/runner.md).

Every answer is ``BaseKind``'s: the reshard is the shape the other kinds vary."""

from __future__ import annotations

from duckgres_admin.models import OpKind
from reshard.kinds.base import BaseKind

RESHARD = BaseKind(key=(OpKind.RESHARD.value, False, "offline"), label="reshard")
