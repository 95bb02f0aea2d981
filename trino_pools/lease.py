"""The ``trino`` leader lease (spec trino-pools §4.3; reshard §4.14 "the trino row works the same").

The same algorithm as the janitor's lease, on the ``trino`` row of ``duckgres_leases``, with the
same duration and renew-deadline settings (``DUCKGRES_JANITOR_LEASE_SECONDS``,
``DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS``):

- take = CAS on an expired row (``expires_at <= now()``), raising the epoch;
- renew = CAS on our live row (holder and epoch match, ``expires_at > now()``);
- the database clock decides expiry; this process may act only while its own monotonic clock
  is before (start of the last successful renew) + renew deadline, which is shorter than the
  lease, so a holder whose renewals fail stops before anyone else can take the row;
- every attempt is bounded by a lock/statement timeout.

It is a deliberate copy of the small core of ``reshard.leadership``: the import-linter contract
keeps the two domains independent. If the generic lease moves to a shared layer
(``duckgres_admin.lib``), this module should become a thin wrapper around it.

The holder identity is the per-process owner identity of §4.3:
``<POD_NAME or hostname>.<16 hex random>`` (also the pools' ``authority_owner``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, connection, transaction

_log = logging.getLogger("duckgres.trino.lease")

LEASE_NAME = "trino"

_TAKE_SQL = """
UPDATE duckgres_leases
   SET holder = %(me)s, epoch = epoch + 1, acquired_at = now(), renewed_at = now(),
       expires_at = now() + make_interval(secs => %(duration)s)
 WHERE name = %(name)s AND expires_at <= now()
RETURNING epoch
"""

_RENEW_SQL = """
UPDATE duckgres_leases
   SET renewed_at = now(), expires_at = now() + make_interval(secs => %(duration)s)
 WHERE name = %(name)s AND holder = %(me)s AND epoch = %(epoch)s AND expires_at > now()
RETURNING epoch
"""

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


class TrinoLease:
    """This process's claim on the ``trino`` row. One per process; the worker is solo."""

    def __init__(
        self,
        *,
        holder: str | None = None,
        name: str = LEASE_NAME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.holder = holder or owner_identity()
        self.epoch: int | None = None
        self._clock = clock
        self._renewed_mono: float | None = None

    @staticmethod
    def duration_seconds() -> int:
        return int(settings.DUCKGRES_JANITOR_LEASE_SECONDS)

    @staticmethod
    def renew_deadline_seconds() -> int:
        return int(settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS)

    def acting_allowed(self) -> bool:
        if self.epoch is None or self._renewed_mono is None:
            return False
        return self._clock() < self._renewed_mono + self.renew_deadline_seconds()

    def _execute(self, sql: str, params: dict[str, int | str]) -> int | None:
        timeout = f"{max(200, min(5000, self.renew_deadline_seconds() * 1000 // 4))}ms"
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
            )
            saved = cursor.fetchone()
            assert saved is not None
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [timeout])
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [timeout])
            cursor.execute(sql, params)
            row = cursor.fetchone()
            # Restore, in case this runs inside a caller's transaction.
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [saved[0]])
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [saved[1]])
        return None if row is None else int(row[0])

    def _take(self) -> bool:
        started = self._clock()
        params: dict[str, int | str] = {
            "me": self.holder,
            "duration": self.duration_seconds(),
            "name": self.name,
        }
        try:
            epoch = self._execute(_TAKE_SQL, params)
        except DatabaseError as exc:
            _log.warning("lease %s: take failed: %s", self.name, exc)
            return False
        if epoch is None:
            return False
        self.epoch, self._renewed_mono = epoch, started
        _log.info("lease %s: taken by %s (epoch %d)", self.name, self.holder, epoch)
        return True

    def renew(self) -> bool:
        if self.epoch is None:
            return False
        started = self._clock()
        params: dict[str, int | str] = {
            "me": self.holder,
            "duration": self.duration_seconds(),
            "name": self.name,
            "epoch": self.epoch,
        }
        try:
            epoch = self._execute(_RENEW_SQL, params)
        except DatabaseError as exc:
            _log.warning("lease %s: renew failed: %s", self.name, exc)
            return False  # keep the last renew time: we may act until the deadline
        if epoch is None:
            _log.warning("lease %s: leadership lost (epoch %s)", self.name, self.epoch)
            self.epoch = self._renewed_mono = None
            return False
        self._renewed_mono = started
        return True

    def acquire(self) -> bool:
        """Renew if held, else try to take. True = this process may act now."""
        if self.epoch is not None:
            self.renew()
            if self.acting_allowed():
                return True
            if self.epoch is not None:
                return False
        return self._take() and self.acting_allowed()

    def release(self) -> None:
        if self.epoch is None:
            return
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE duckgres_leases SET expires_at = now() "
                    "WHERE name = %s AND holder = %s AND epoch = %s",
                    [self.name, self.holder, self.epoch],
                )
        except DatabaseError as exc:
            _log.warning("lease %s: release failed: %s", self.name, exc)
        self.epoch = self._renewed_mono = None


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
