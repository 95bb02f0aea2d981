"""The catalog-store writer, the catalog client and the revision watermark (spec trino-pools
§2.7, §4.3 "Writer install", §4.9).

This control plane is the catalog store's only writer. Per pool, the writer row
``trino_catalog_writer_state`` carries the fence ``(writer_epoch, writer_identity)`` — the pool's
``authority_epoch`` and owner identity — and the pool's catalog ``revision``.

Invariants:

1. **Every write is row-locked and fenced.** ``takeover`` and ``apply`` lock the writer row
   ``FOR UPDATE`` (``lock_timeout`` 1 s, ``statement_timeout`` 3 s, 5 s for the whole call).
   ``takeover`` refuses a higher recorded epoch and an equal epoch held by another identity;
   ``apply`` requires the exact epoch **and** identity. Refusals raise ``WriterFenced`` — a
   decision, never retried with another epoch. ``list_catalogs`` (the reconciler's first
   call) also checks the fence, so a fenced writer is found before any config-store write.
2. **One transaction per change.** ``apply`` writes or deletes the definition, bumps
   ``revision``, recomputes ``catalog_count`` from the rows and journals ``(revision,
   operation_id, ADD_OR_REPLACE|REMOVE, catalog, version, payload_hash, writer_epoch)`` in the
   same transaction. ``version`` is monotone per catalog name (the journal's highest + 1), so a
   re-created catalog never reuses a version a reader may have cached.
3. **Operation ids carry the current revision** (``catalog.<name>.r<revision>.<16 hex>``): a
   create/drop/create of an identical catalog is three operations, never a replay. A journal hit
   on the id with the same hash is a replay (its revision is returned); another hash is
   ``IntentChanged``.
4. **A lost COMMIT is resolved by intent.** When the connection breaks after the writer row was
   read, a fresh connection looks for a journal entry for the same catalog and payload hash with
   a revision above the one read before the attempt: found = success (no second write).
   ``WriterFenced``, ``IntentChanged`` and other server refusals are decisions and never enter
   resolution.
5. **Seeding never invents zero.** A missing writer row is created with ``catalog_count`` =
   the pool's existing rows and ``revision`` = the highest revision already recorded.
6. **Only the live term's writer is used.** ``client_for`` returns the installed writer only
   while its epoch and identity equal the authority in ``authority.HOLDER``; otherwise an
   ``Unavailable`` client whose every method raises ``NotThisReplica``.
7. **The watermark is monotone and fenced.** ``checkpoint_revision`` raises
   ``duckgres_trino_pools.publication_revision`` inside ``authority.fenced`` and ignores lower
   values; its failure is returned to the caller (the org stays not ready).
8. **The DSN never leaves this module**: not in logs, exceptions or ``repr``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg
from django.db import connection
from psycopg.types.json import Jsonb

from trino_pools import authority
from trino_pools.authority import Authority, NotThisReplica
from trino_pools.catalog_store import CatalogStoreError, _read_dsn, _scrub
from trino_pools.catalogs import REMOVED_HASH
from trino_pools.config import TrinoSettings

_log = logging.getLogger("duckgres.trino.catalogs")

LOCK_TIMEOUT_MS = 1000
STATEMENT_TIMEOUT_MS = 3000
OVERALL_BUDGET_SECONDS = 5.0
MIN_CONNECT_SECONDS = 2  # libpq treats smaller connect timeouts as 2 s
RESOLVE_FLOOR_SECONDS = 2.0
APPLICATION_NAME = "duckgres-admin-trino-writer"

ADD_OR_REPLACE = "ADD_OR_REPLACE"
REMOVE = "REMOVE"


class WriterFenced(Exception):
    """The writer row is held by a newer epoch or another identity (or is missing)."""


class IntentChanged(Exception):
    """An operation id already journalled with another payload hash."""


class NodeInventoryUnavailable(Exception):
    """Pool cells have no fixed coordinator: node inventory is "probe not applicable"."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    payload_hash: str
    revision: int
    version: int
    connector: str


def operation_id(name: str, revision: int, payload_hash: str) -> str:
    return f"catalog.{name}.r{revision}.{payload_hash[:16]}"


class CatalogClient(Protocol):
    """What the org reconciler publishes through (§4.9)."""

    def list_catalogs(self) -> dict[str, str]: ...
    def describe(self, name: str) -> CatalogEntry | None: ...
    def owners(self) -> dict[str, str]: ...
    def nodes(self) -> list[str]: ...
    def connectors(self) -> dict[str, str]: ...
    def revision(self) -> int: ...
    def create(self, name: str, definition: Mapping[str, Any], payload_hash: str) -> int: ...
    def alter(self, name: str, definition: Mapping[str, Any], payload_hash: str) -> int: ...
    def drop(self, name: str) -> int: ...


_T = TypeVar("_T")


class CatalogWriter:
    """The fenced writer of one pool's catalogs; thread-safe (one connection, one lock)."""

    def __init__(self, dsn: str, schema: str, pool_key: str, epoch: int, identity: str) -> None:
        self._dsn = dsn
        self.schema = schema
        self.pool_key = pool_key
        self.epoch = epoch
        self.identity = identity
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"CatalogWriter(pool_key={self.pool_key!r}, epoch={self.epoch})"

    @property
    def public_id(self) -> str:
        return self.pool_key.removeprefix("registered:")

    # -- connection ---------------------------------------------------------------------------

    def _error(self, exc: BaseException, what: str) -> CatalogStoreError:
        return CatalogStoreError(
            f"the Trino catalog store ({what} for {self.pool_key}): "
            f"{_scrub(str(exc).strip(), self._dsn)}"
        )

    def _connection(self, deadline: float) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._discard()
        timeout = max(MIN_CONNECT_SECONDS, int(deadline - time.monotonic() + 0.999))
        self._conn = psycopg.connect(
            self._dsn,
            options=f"-c search_path={self.schema}",
            connect_timeout=timeout,
            application_name=APPLICATION_NAME,
            autocommit=True,
        )
        return self._conn

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                _log.debug("catalog writer: closing a broken connection failed")

    def close(self) -> None:
        with self._lock:
            self._discard()

    @staticmethod
    def _limits(conn: psycopg.Connection[Any], deadline: float) -> None:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise CatalogStoreError("the Trino catalog store call ran out of its 5 s budget")
        statement = max(1, min(STATEMENT_TIMEOUT_MS, remaining_ms))
        conn.execute(f"SET LOCAL lock_timeout = {min(LOCK_TIMEOUT_MS, statement)}")
        conn.execute(f"SET LOCAL statement_timeout = {statement}")

    def _transaction(self, what: str, body: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        deadline = time.monotonic() + OVERALL_BUDGET_SECONDS
        try:
            conn = self._connection(deadline)
            with conn.transaction():
                self._limits(conn, deadline)
                return body(conn)
        except (WriterFenced, IntentChanged, CatalogStoreError):
            raise
        except psycopg.Error as exc:
            if self._conn is not None and (self._conn.broken or self._conn.closed):
                self._discard()
            raise self._error(exc, what) from None

    def _read(self, what: str, body: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """A read-only transaction; retried once on a fresh connection when the connection
        was lost (reads are idempotent)."""
        with self._lock:
            had = self._conn is not None and not self._conn.closed and not self._conn.broken
            try:
                return self._transaction(what, body)
            except CatalogStoreError:
                if not had or self._conn is not None:
                    raise
            return self._transaction(what, body)

    # -- writer protocol ----------------------------------------------------------------------

    def _seed(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO trino_catalog_writer_state (pool_key, writer_epoch, writer_identity, "
            "revision, catalog_count) VALUES (%(k)s, 0, '', "
            "GREATEST((SELECT max(revision) FROM trino_catalog_journal WHERE pool_key = %(k)s), "
            "(SELECT max(revision) FROM trino_catalogs WHERE pool_key = %(k)s), 0), "
            "(SELECT count(*) FROM trino_catalogs WHERE pool_key = %(k)s)) "
            "ON CONFLICT (pool_key) DO NOTHING",
            {"k": self.pool_key},
        )

    def takeover(self) -> int:
        """Claim the pool's writer row for ``(epoch, identity)``; returns the store revision."""

        def body(conn: psycopg.Connection[Any]) -> int:
            self._seed(conn)
            row = conn.execute(
                "SELECT writer_epoch, writer_identity, revision FROM trino_catalog_writer_state "
                "WHERE pool_key = %s FOR UPDATE",
                [self.pool_key],
            ).fetchone()
            assert row is not None
            epoch, identity, revision = int(row[0]), str(row[1]), int(row[2])
            if epoch > self.epoch:
                raise WriterFenced(
                    f"catalog writer of {self.pool_key}: epoch {epoch} is recorded, this term "
                    f"holds {self.epoch}"
                )
            if epoch == self.epoch and identity not in ("", self.identity):
                raise WriterFenced(
                    f"catalog writer of {self.pool_key}: epoch {epoch} is held by another identity"
                )
            conn.execute(
                "UPDATE trino_catalog_writer_state SET writer_epoch = %(e)s, "
                "writer_identity = %(i)s, catalog_count = (SELECT count(*) FROM trino_catalogs "
                "WHERE pool_key = %(k)s), updated_at = now() WHERE pool_key = %(k)s",
                {"e": self.epoch, "i": self.identity, "k": self.pool_key},
            )
            return revision

        with self._lock:
            revision = self._transaction("takeover", body)
        _log.info(
            "catalog writer of %s taken over at epoch %d (store revision %d)",
            self.pool_key,
            self.epoch,
            revision,
        )
        return revision

    def _apply_tx(
        self,
        conn: psycopg.Connection[Any],
        name: str,
        definition: Mapping[str, Any] | None,
        digest: str,
        read: list[int],
    ) -> int:
        row = conn.execute(
            "SELECT writer_epoch, writer_identity, revision FROM trino_catalog_writer_state "
            "WHERE pool_key = %s FOR UPDATE",
            [self.pool_key],
        ).fetchone()
        if row is None:
            raise WriterFenced(f"catalog writer of {self.pool_key}: no writer row (not the writer)")
        epoch, identity, revision = int(row[0]), str(row[1]), int(row[2])
        if epoch != self.epoch or identity != self.identity:
            raise WriterFenced(
                f"catalog writer of {self.pool_key}: the store is held at epoch {epoch}"
                + (" by another identity" if identity != self.identity else "")
                + f"; this term holds {self.epoch}"
            )
        read.append(revision)
        op = operation_id(name, revision, digest)
        hit = conn.execute(
            "SELECT revision, payload_hash FROM trino_catalog_journal "
            "WHERE pool_key = %s AND operation_id = %s",
            [self.pool_key, op],
        ).fetchone()
        if hit is not None:
            if str(hit[1]) == digest:
                return int(hit[0])
            raise IntentChanged(f"catalog operation {op} was journalled with another payload")
        version_row = conn.execute(
            "SELECT GREATEST((SELECT max(version) FROM trino_catalog_journal "
            "WHERE pool_key = %(k)s AND catalog_name = %(n)s), (SELECT version FROM "
            "trino_catalogs WHERE pool_key = %(k)s AND catalog_name = %(n)s), 0)",
            {"k": self.pool_key, "n": name},
        ).fetchone()
        version = int(version_row[0] if version_row else 0) + 1
        new_revision = revision + 1
        if definition is None:
            gone = conn.execute(
                "DELETE FROM trino_catalogs WHERE pool_key = %s AND catalog_name = %s",
                [self.pool_key, name],
            )
            if gone.rowcount == 0:
                return revision  # nothing to remove: no change, no revision
            operation = REMOVE
        else:
            conn.execute(
                "INSERT INTO trino_catalogs (pool_key, catalog_name, definition, version, "
                "payload_hash, revision) VALUES (%(k)s, %(n)s, %(d)s, %(v)s, %(h)s, %(r)s) "
                "ON CONFLICT (pool_key, catalog_name) DO UPDATE SET definition = EXCLUDED."
                "definition, version = EXCLUDED.version, payload_hash = EXCLUDED.payload_hash, "
                "revision = EXCLUDED.revision",
                {
                    "k": self.pool_key,
                    "n": name,
                    "d": Jsonb(dict(definition)),
                    "v": version,
                    "h": digest,
                    "r": new_revision,
                },
            )
            operation = ADD_OR_REPLACE
        updated = conn.execute(
            "UPDATE trino_catalog_writer_state SET revision = %(r)s, catalog_count = "
            "(SELECT count(*) FROM trino_catalogs WHERE pool_key = %(k)s), updated_at = now() "
            "WHERE pool_key = %(k)s AND writer_epoch = %(e)s AND writer_identity = %(i)s "
            "AND revision = %(old)s",
            {
                "r": new_revision,
                "k": self.pool_key,
                "e": self.epoch,
                "i": self.identity,
                "old": revision,
            },
        )
        if updated.rowcount != 1:  # pragma: no cover - the row is locked above
            raise WriterFenced(f"catalog writer of {self.pool_key}: the writer row moved")
        conn.execute(
            "INSERT INTO trino_catalog_journal (pool_key, revision, operation_id, operation, "
            "catalog_name, version, payload_hash, writer_epoch) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [self.pool_key, new_revision, op, operation, name, version, digest, self.epoch],
        )
        return new_revision

    def _resolve(self, name: str, digest: str, before: int, deadline: float) -> int | None:
        """After a lost COMMIT: the journal entry of this intent above ``before``, if any.

        Runs in what is left of the call's budget, but gets at least ``RESOLVE_FLOOR_SECONDS``
        (a reconnect and one indexed read) so a late loss can still be resolved."""
        deadline = max(deadline, time.monotonic() + RESOLVE_FLOOR_SECONDS)
        try:
            conn = self._connection(deadline)
            with conn.transaction():
                self._limits(conn, deadline)
                row = conn.execute(
                    "SELECT revision FROM trino_catalog_journal WHERE pool_key = %s AND "
                    "catalog_name = %s AND payload_hash = %s AND revision > %s "
                    "ORDER BY revision LIMIT 1",
                    [self.pool_key, name, digest, before],
                ).fetchone()
        except psycopg.Error:
            self._discard()
            return None
        return int(row[0]) if row else None

    def apply(self, catalog: str, definition: Mapping[str, Any] | None, payload_hash: str) -> int:
        """Write (``definition``) or remove (``None``) one catalog; returns the store revision."""
        with self._lock:
            read: list[int] = []
            deadline = time.monotonic() + OVERALL_BUDGET_SECONDS
            try:
                conn = self._connection(deadline)
                with conn.transaction():
                    self._limits(conn, deadline)
                    revision = self._apply_tx(conn, catalog, definition, payload_hash, read)
            except (WriterFenced, IntentChanged, CatalogStoreError):
                raise
            except psycopg.Error as exc:
                lost = self._conn is None or self._conn.broken or self._conn.closed
                if not lost:
                    raise self._error(exc, f"apply {catalog}") from None
                self._discard()
                if not read:  # the writer row was never read: nothing can have committed
                    raise self._error(exc, f"apply {catalog}") from None
                resolved = self._resolve(catalog, payload_hash, read[0], deadline)
                if resolved is None:
                    raise CatalogStoreError(
                        f"the Trino catalog store (apply {catalog} for {self.pool_key}): the "
                        "connection was lost and the change is not in the journal; it will be "
                        "retried by the next reconcile"
                    ) from None
                _log.warning(
                    "catalog writer of %s: lost COMMIT for %s resolved by the journal "
                    "(revision %d)",
                    self.pool_key,
                    catalog,
                    resolved,
                )
                return resolved
        return revision

    # -- client surface -----------------------------------------------------------------------

    def revision(self) -> int:
        def body(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(
                "SELECT revision FROM trino_catalog_writer_state WHERE pool_key = %s",
                [self.pool_key],
            ).fetchone()
            return int(row[0]) if row else 0

        return self._read("revision", body)

    def _check_fence(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            "SELECT writer_epoch, writer_identity FROM trino_catalog_writer_state "
            "WHERE pool_key = %s",
            [self.pool_key],
        ).fetchone()
        if row is None or int(row[0]) != self.epoch or str(row[1]) != self.identity:
            raise WriterFenced(
                f"catalog writer of {self.pool_key}: the store is no longer held by this term "
                f"(epoch {self.epoch})"
            )

    def list_catalogs(self) -> dict[str, str]:
        """Catalog name → payload hash; raises ``WriterFenced`` when this term lost the store
        (the reconciler's first call, so a fenced writer is found before any row write)."""

        def body(conn: psycopg.Connection[Any]) -> dict[str, str]:
            self._check_fence(conn)
            rows = conn.execute(
                "SELECT catalog_name, payload_hash FROM trino_catalogs WHERE pool_key = %s "
                "ORDER BY catalog_name",
                [self.pool_key],
            ).fetchall()
            return {str(r[0]): str(r[1]) for r in rows}

        return self._read("list", body)

    def describe(self, name: str) -> CatalogEntry | None:
        def body(conn: psycopg.Connection[Any]) -> CatalogEntry | None:
            row = conn.execute(
                "SELECT payload_hash, revision, version, coalesce(definition->>'connector', '') "
                "FROM trino_catalogs WHERE pool_key = %s AND catalog_name = %s",
                [self.pool_key, name],
            ).fetchone()
            if row is None:
                return None
            return CatalogEntry(name, str(row[0]), int(row[1]), int(row[2]), str(row[3]))

        return self._read("describe", body)

    def connectors(self) -> dict[str, str]:
        """Connector inspection: catalog name → connector of each catalog of the pool."""

        def body(conn: psycopg.Connection[Any]) -> dict[str, str]:
            rows = conn.execute(
                "SELECT catalog_name, coalesce(definition->>'connector', '') FROM trino_catalogs "
                "WHERE pool_key = %s ORDER BY catalog_name",
                [self.pool_key],
            ).fetchall()
            return {str(r[0]): str(r[1]) for r in rows}

        return self._read("connectors", body)

    def owners(self) -> dict[str, str]:
        """Catalog name → the ``org_id`` its definition was rendered for (``''`` if none)."""

        def body(conn: psycopg.Connection[Any]) -> dict[str, str]:
            rows = conn.execute(
                "SELECT catalog_name, coalesce(definition->>'org_id', '') FROM trino_catalogs "
                "WHERE pool_key = %s ORDER BY catalog_name",
                [self.pool_key],
            ).fetchall()
            return {str(r[0]): str(r[1]) for r in rows}

        return self._read("owners", body)

    def nodes(self) -> list[str]:
        raise NodeInventoryUnavailable(
            f"shared Trino pool {self.public_id} has no fixed coordinator: node inventory is "
            "not applicable (readiness is proven per member at admission)"
        )

    def create(self, name: str, definition: Mapping[str, Any], payload_hash: str) -> int:
        return self.apply(name, definition, payload_hash)

    def alter(self, name: str, definition: Mapping[str, Any], payload_hash: str) -> int:
        return self.apply(name, definition, payload_hash)

    def drop(self, name: str) -> int:
        return self.apply(name, None, REMOVED_HASH)


class Unavailable:
    """The catalog client of a process without a live writer for the pool (§4.9)."""

    def __init__(self, cell: str) -> None:
        self.cell = cell

    def _refuse(self) -> NotThisReplica:
        return NotThisReplica(self.cell)

    def list_catalogs(self) -> dict[str, str]:
        raise self._refuse()

    def describe(self, name: str) -> CatalogEntry | None:
        raise self._refuse()

    def owners(self) -> dict[str, str]:
        raise self._refuse()

    def nodes(self) -> list[str]:
        raise self._refuse()

    def connectors(self) -> dict[str, str]:
        raise self._refuse()

    def revision(self) -> int:
        raise self._refuse()

    def create(self, name: str, definition: Mapping[str, Any], payload_hash: str) -> int:
        raise self._refuse()

    def alter(self, name: str, definition: Mapping[str, Any], payload_hash: str) -> int:
        raise self._refuse()

    def drop(self, name: str) -> int:
        raise self._refuse()


# -- the writer registry ----------------------------------------------------------------------

_WRITERS: dict[str, CatalogWriter] = {}
_WRITERS_LOCK = threading.Lock()


def install(pool_id: str, writer: CatalogWriter) -> None:
    """Swap the pool's client to ``writer`` (after ``takeover`` and the watermark checkpoint)."""
    with _WRITERS_LOCK:
        old = _WRITERS.get(pool_id)
        _WRITERS[pool_id] = writer
    if old is not None and old is not writer:
        old.close()


def uninstall(pool_id: str, writer: CatalogWriter | None = None) -> None:
    """Release the pool's writer (only ``writer``, when given: a stale release is a no-op)."""
    with _WRITERS_LOCK:
        current = _WRITERS.get(pool_id)
        if current is None or (writer is not None and current is not writer):
            return
        del _WRITERS[pool_id]
    current.close()


def uninstall_all() -> None:
    with _WRITERS_LOCK:
        writers = list(_WRITERS.values())
        _WRITERS.clear()
    for writer in writers:
        writer.close()


def installed(pool_id: str) -> CatalogWriter | None:
    with _WRITERS_LOCK:
        return _WRITERS.get(pool_id)


def live(pool_id: str) -> tuple[CatalogWriter, Authority] | None:
    """The pool's writer and the authority it belongs to, when both are of the live term."""
    auth = authority.HOLDER.get(pool_id)
    writer = installed(pool_id)
    if auth is None or writer is None:
        return None
    if writer.epoch != auth.epoch or writer.identity != auth.owner:
        return None
    return writer, auth


def client_for(pool_id: str) -> CatalogClient:
    """The fenced writer of the live term, else an ``Unavailable`` client."""
    pair = live(pool_id)
    if pair is None:
        return Unavailable(pool_id.removeprefix("registered:"))
    return pair[0]


# -- the revision watermark -------------------------------------------------------------------


def checkpoint_revision(auth: Authority, revision: int) -> None:
    """Raise ``publication_revision`` to ``revision`` (fenced; lower values are ignored)."""
    with authority.fenced(auth), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_trino_pools SET publication_revision = %s, updated_at = now() "
            "WHERE pool_id = %s AND publication_revision < %s",
            [revision, auth.pool_id, revision],
        )


def publication_revision(pool_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT publication_revision FROM duckgres_trino_pools WHERE pool_id = %s", [pool_id]
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def recover_watermark(auth: Authority, writer: CatalogClient) -> int:
    """Read the store's revision and checkpoint it when the pool row is behind (fails closed)."""
    revision = writer.revision()
    if publication_revision(auth.pool_id) < revision:
        checkpoint_revision(auth, revision)
    return revision


def writer_for(settings: TrinoSettings, auth: Authority) -> CatalogWriter:
    """A writer for ``auth`` from ``DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE`` (never logged)."""
    try:
        dsn = _read_dsn(settings.catalog_dsn_file)
    except Exception as exc:  # noqa: BLE001 - the DSN file's error names its path only
        raise CatalogStoreError(str(exc)) from None
    return CatalogWriter(dsn, settings.catalog_schema, auth.pool_id, auth.epoch, auth.owner)


def claim(auth: Authority, settings: TrinoSettings) -> CatalogWriter:
    """Writer install after acquisition (§4.3): takeover, watermark, then swap the client.

    Any failure closes the writer, clears ``auth`` from the holder and re-raises: the claim
    failed and this process must not publish for the pool in this term.
    """
    writer = writer_for(settings, auth)
    try:
        writer.takeover()
        recover_watermark(auth, writer)
    except BaseException:
        writer.close()
        authority.HOLDER.clear(auth.pool_id, auth)
        uninstall(auth.pool_id)
        raise
    install(auth.pool_id, writer)
    return writer


def release(pool_id: str) -> None:
    """Term start/end or fence refusal: swap back to ``Unavailable`` (§4.3)."""
    uninstall(pool_id)


__all__ = [
    "ADD_OR_REPLACE",
    "REMOVE",
    "CatalogClient",
    "CatalogEntry",
    "CatalogStoreError",
    "CatalogWriter",
    "IntentChanged",
    "NodeInventoryUnavailable",
    "Unavailable",
    "WriterFenced",
    "checkpoint_revision",
    "claim",
    "client_for",
    "install",
    "installed",
    "live",
    "operation_id",
    "publication_revision",
    "recover_watermark",
    "release",
    "uninstall",
    "uninstall_all",
    "writer_for",
]
