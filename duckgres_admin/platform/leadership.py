"""Leader leases in the config store (spec reshard §2.9, §4.14; trino-pools §4.3).

One row per lease name in ``duckgres_leases`` (``janitor`` for the reshard reconciler,
``trino`` for the Trino pool worker). Both rows are seeded with ``expires_at = '-infinity'``.

Invariants:

1. **One actor.** Taking is a compare-and-swap on an expired row::

       UPDATE duckgres_leases SET holder=:me, epoch=epoch+1, acquired_at=now(),
              renewed_at=now(), expires_at=now()+D
        WHERE name=:name AND expires_at <= now()

   and renewing is a compare-and-swap on *our* live row::

       UPDATE duckgres_leases SET renewed_at=now(), expires_at=now()+D
        WHERE name=:name AND holder=:me AND epoch=:epoch AND expires_at > now()

   Zero rows on renew means leadership is lost; the epoch rises on every take, so a holder
   that lost and retook the row is a new leader with a new epoch.
2. **Database clock for expiry.** ``now()`` of the config store decides whether a lease is
   live; no process compares its own wall clock with ``expires_at``.
3. **Monotonic renew deadline.** A holder may act only while its own monotonic clock is before
   (start of the last successful renew) + ``DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS``. The
   deadline is shorter than the lease duration (``DUCKGRES_JANITOR_LEASE_SECONDS``), so a
   holder whose renewals are failing (store outage, a blocked row) stops acting before any
   other process can take the expired row. A renew attempt is bounded by a lock/statement
   timeout so a blocked renewal cannot hold the caller past its deadline.
4. **Renew before acting** and again before each intervention (``ensure()``): a leader task
   calls ``acquire()`` at the start of a tick and ``ensure()`` before every side effect; a
   ``False`` means stop at once (mid-tick if need be).

Holder identity: ``<POD_NAME or hostname>.<pid>.<8 hex random>``, fixed for the life of the
lease object (one per process and lease name, see ``lease()``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import Error as DbError
from django.db import connection, transaction

_log = logging.getLogger("duckgres.leadership")

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


def holder_identity() -> str:
    """``<POD_NAME or hostname>.<pid>.<8 hex>``: unique per process and lease object."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "unknown"
    return f"{base}.{os.getpid()}.{secrets.token_hex(4)}"


@dataclass(frozen=True)
class LeaseRow:
    """A read-only view of a lease row (``expires_at`` as text: it may be ``-infinity``)."""

    name: str
    holder: str
    epoch: int
    expires_at: str
    live: bool


def read_lease(name: str) -> LeaseRow | None:
    """The row as the database sees it now (for status displays and tests)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, holder, epoch, expires_at::text, expires_at > now() "
            "FROM duckgres_leases WHERE name = %s",
            [name],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return LeaseRow(name=row[0], holder=row[1], epoch=int(row[2]), expires_at=row[3], live=row[4])


class LeaderLease:
    """One process's claim on one lease row. Not thread-safe by design: one actor per process."""

    def __init__(
        self,
        name: str,
        *,
        holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.holder = holder or holder_identity()
        self.epoch: int | None = None
        self._clock = clock
        self._renewed_mono: float | None = None

    # --- settings (read per call so tests can shorten them) ---------------------------------
    @staticmethod
    def duration_seconds() -> int:
        return int(settings.DUCKGRES_JANITOR_LEASE_SECONDS)

    @staticmethod
    def renew_deadline_seconds() -> int:
        return int(settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS)

    def _attempt_timeout_ms(self) -> int:
        # A single take/renew may never eat the whole renew deadline.
        return max(200, min(5000, self.renew_deadline_seconds() * 1000 // 4))

    # --- state ---------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Leader in the sense of "allowed to act now" (held and inside the renew deadline)."""
        return self.acting_allowed()

    def acting_allowed(self) -> bool:
        if self.epoch is None or self._renewed_mono is None:
            return False
        return self._clock() < self._renewed_mono + self.renew_deadline_seconds()

    def seconds_left(self) -> float:
        if self.epoch is None or self._renewed_mono is None:
            return 0.0
        return self._renewed_mono + self.renew_deadline_seconds() - self._clock()

    # --- CAS ------------------------------------------------------------------------------------
    def _execute(self, sql: str, params: dict[str, int | str]) -> int | None:
        """Run one guarded UPDATE ... RETURNING epoch with a bounded wait; None = zero rows."""
        timeout = f"{self._attempt_timeout_ms()}ms"
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
            # Restore in case we run inside an outer transaction (tests, callers' atomics).
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [saved[0]])
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [saved[1]])
        return None if row is None else int(row[0])

    def take(self) -> bool:
        started = self._clock()
        try:
            epoch = self._execute(
                _TAKE_SQL,
                {"me": self.holder, "duration": self.duration_seconds(), "name": self.name},
            )
        except DbError as exc:
            _log.warning("lease %s: take failed: %s", self.name, exc)
            return False
        if epoch is None:
            return False
        self.epoch = epoch
        self._renewed_mono = started
        _log.info("lease %s: taken by %s (epoch %d)", self.name, self.holder, epoch)
        return True

    def renew(self) -> bool:
        """Extend our lease. False when lost (zero rows) or when the attempt failed.

        A failed attempt (error, timeout) keeps the last successful renew time, so the caller
        may still act until the renew deadline; a lost lease stops acting at once.
        """
        if self.epoch is None:
            return False
        started = self._clock()
        try:
            epoch = self._execute(
                _RENEW_SQL,
                {
                    "me": self.holder,
                    "duration": self.duration_seconds(),
                    "name": self.name,
                    "epoch": self.epoch,
                },
            )
        except DbError as exc:
            _log.warning(
                "lease %s: renew failed (%.1f s left before the renew deadline): %s",
                self.name,
                self.seconds_left(),
                exc,
            )
            return False
        if epoch is None:
            _log.warning("lease %s: leadership lost (epoch %s)", self.name, self.epoch)
            self.epoch = None
            self._renewed_mono = None
            return False
        self._renewed_mono = started
        return True

    def acquire(self) -> bool:
        """Renew if we hold the lease, else try to take it. True = may act now."""
        if self.epoch is not None:
            self.renew()
            if self.acting_allowed():
                return True
            if self.epoch is not None:
                return False  # still ours in the row, maybe, but past our own deadline
        return self.take() and self.acting_allowed()

    def ensure(self) -> bool:
        """Renew before an intervention; True only while inside the renew deadline."""
        self.renew()
        return self.acting_allowed()

    def release(self) -> None:
        """Give the row up early (clean shutdown); expiry does the same job otherwise."""
        if self.epoch is None:
            return
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE duckgres_leases SET expires_at = now() "
                    "WHERE name = %s AND holder = %s AND epoch = %s",
                    [self.name, self.holder, self.epoch],
                )
        except DbError as exc:
            _log.warning("lease %s: release failed: %s", self.name, exc)
        self.epoch = None
        self._renewed_mono = None


_leases: dict[str, LeaderLease] = {}
_leases_lock = threading.Lock()


def lease(name: str) -> LeaderLease:
    """This process's lease object for ``name`` (one stable holder identity per process)."""
    with _leases_lock:
        obj = _leases.get(name)
        if obj is None or obj.holder.split(".")[-2:-1] != [str(os.getpid())]:
            obj = LeaderLease(name)
            _leases[name] = obj
        return obj
