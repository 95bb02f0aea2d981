"""The ``trino`` leader lease (spec trino-pools §4.3; reshard §4.14 "the trino row works the same").

The algorithm (take/renew by compare-and-swap on the database clock, a monotonic renew deadline
shorter than the lease, bounded attempts) lives once, in ``duckgres_admin.platform.leadership``;
this
module only fixes the row name and the holder identity the Trino spec asks for: the per-process
owner identity ``<POD_NAME or hostname>.<16 hex random>`` (also the pools' ``authority_owner``).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from duckgres_admin.platform.leadership import LeaderLease

LEASE_NAME = "trino"

_identity_lock = threading.Lock()
_identity: str | None = None


def owner_identity() -> str:
    """This process's owner identity (stable for its life, never shared by two processes)."""
    global _identity
    with _identity_lock:
        if _identity is None or not _identity.endswith(f"#{os.getpid()}"):
            base = os.environ.get("POD_NAME") or socket.gethostname() or "unknown"
            _identity = f"{base}.{secrets.token_hex(8)}#{os.getpid()}"
        return _identity.rsplit("#", 1)[0]


class TrinoLease(LeaderLease):
    """This process's claim on the ``trino`` row. One per process; the worker is solo."""

    def __init__(
        self,
        *,
        holder: str | None = None,
        name: str = LEASE_NAME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name, holder=holder or owner_identity(), clock=clock)


_lease_lock = threading.Lock()
_lease: TrinoLease | None = None
_lease_pid: int | None = None


def lease() -> TrinoLease:
    """This process's ``trino`` lease object (recreated after a fork)."""
    global _lease, _lease_pid
    with _lease_lock:
        if _lease is None or _lease_pid != os.getpid():
            _lease, _lease_pid = TrinoLease(), os.getpid()
        return _lease
