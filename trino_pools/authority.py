"""Per-pool authority: acquisition, fenced writes, the thread-safe holder (trino-pools §4.3).

Invariants:

1. **One fencing number per pool.** ``acquire`` locks the pool row ``FOR UPDATE`` and, in the
   same transaction, increments ``authority_epoch`` and sets ``authority_owner``. The epoch rises
   on every acquisition, so two terms never share one; the owner identity is unique per process
   (``trino_pools.lease.owner_identity``).
2. **Every pool write is fenced.** ``fenced(auth)`` opens a transaction, locks the pool row and
   requires ``(pool_id, authority_epoch, authority_owner)`` to equal the authority, else raises
   ``PoolConflict``. Writes made inside the block commit only if the fence held when the row was
   locked, and the lock keeps a newer acquirer out until they commit.
3. **A fence refusal ends the term; it never fights back.** Callers that get ``PoolConflict``
   drop the authority (``HOLDER.clear``), release the catalog writer and stop; they never
   re-acquire with a fresher epoch in the same term (``trino_pools.operator``).
4. **Bounded.** Every statement that locks the pool row runs with ``lock_timeout`` 2 s and
   ``statement_timeout`` 5 s (transaction-local): a blocked row fails the write, never hangs
   the tick.
5. **No external call under the row lock.** ``fenced`` is for database writes only; external
   effects happen after commit (``trino_pools.effects``).
6. **The holder is lock-protected.** Org-reconcile code reads the current authority of a pool
   through ``HOLDER`` (never a bare global), so it never sees a torn value (safeguard 10).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from duckgres_admin.models.trino import TrinoPool


class PoolConflict(Exception):
    """A fence refusal: this process no longer holds the pool's authority."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"trino pool conflict: {detail}")


class NotThisReplica(Exception):
    """A catalog call in a process that holds no writer for the pool (non-leader, read-only)."""

    def __init__(self, cell: str) -> None:
        super().__init__(f"shared Trino pool {cell} has no catalog writer on this control plane")
        self.cell = cell


@dataclass(frozen=True)
class Authority:
    """The fencing token ``(pool_id, owner, epoch)`` of one term."""

    pool_id: str
    owner: str
    epoch: int

    @property
    def public_id(self) -> str:
        return self.pool_id.removeprefix("registered:")


LOCK_TIMEOUT = "2s"
STATEMENT_TIMEOUT = "5s"


def _bound(cursor: Any) -> None:
    """Transaction-local timeouts for the statements that lock the pool row."""
    cursor.execute(
        "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)",
        [LOCK_TIMEOUT, STATEMENT_TIMEOUT],
    )


def acquire(pool_id: str, owner: str) -> Authority:
    """Take the pool's authority: one transaction, row locked, epoch incremented."""
    with transaction.atomic(), connection.cursor() as cursor:
        _bound(cursor)
        cursor.execute(
            "SELECT authority_epoch FROM duckgres_trino_pools WHERE pool_id = %s FOR UPDATE",
            [pool_id],
        )
        if cursor.fetchone() is None:
            raise PoolConflict(f"pool {pool_id} has no row (seed it first)")
        cursor.execute(
            "UPDATE duckgres_trino_pools SET authority_epoch = authority_epoch + 1, "
            "authority_owner = %s, updated_at = now() WHERE pool_id = %s "
            "RETURNING authority_epoch",
            [owner, pool_id],
        )
        row = cursor.fetchone()
    if row is None:  # pragma: no cover - the row is locked above
        raise PoolConflict(f"pool {pool_id} vanished during acquisition")
    return Authority(pool_id=pool_id, owner=owner, epoch=int(row[0]))


def check_fence(auth: Authority) -> None:
    """Lock the pool row and verify the fence; must run inside a transaction."""
    with connection.cursor() as cursor:
        _bound(cursor)
        cursor.execute(
            "SELECT authority_epoch, authority_owner FROM duckgres_trino_pools "
            "WHERE pool_id = %s FOR UPDATE",
            [auth.pool_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise PoolConflict(f"pool {auth.pool_id} has no row")
    epoch, owner = int(row[0]), str(row[1])
    if epoch != auth.epoch or owner != auth.owner:
        raise PoolConflict(
            f"pool {auth.pool_id} is held at epoch {epoch} by another owner"
            if owner != auth.owner
            else f"pool {auth.pool_id} moved to epoch {epoch} (this term holds {auth.epoch})"
        )


@contextmanager
def fenced(auth: Authority) -> Iterator[None]:
    """A transaction that commits only while ``auth`` still holds the pool (else PoolConflict)."""
    with transaction.atomic():
        check_fence(auth)
        yield


def read_pool(pool_id: str) -> TrinoPool | None:
    return TrinoPool.objects.filter(pool_id=pool_id).first()


class AuthorityHolder:
    """This process's live authorities, one per pool; every access takes the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pool: dict[str, Authority] = {}

    def get(self, pool_id: str) -> Authority | None:
        with self._lock:
            return self._by_pool.get(pool_id)

    def install(self, auth: Authority) -> None:
        with self._lock:
            self._by_pool[auth.pool_id] = auth

    def clear(self, pool_id: str, auth: Authority | None = None) -> None:
        """Forget the pool's authority (only ``auth``'s, when given: a stale clear is a no-op)."""
        with self._lock:
            if auth is None or self._by_pool.get(pool_id) == auth:
                self._by_pool.pop(pool_id, None)

    def clear_all(self) -> None:
        with self._lock:
            self._by_pool.clear()

    def snapshot(self) -> dict[str, Authority]:
        with self._lock:
            return dict(self._by_pool)


HOLDER = AuthorityHolder()
