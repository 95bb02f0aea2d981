"""Fixtures of the catalog tests: pools with a real catalog store, warehouses, a COMMIT-dropping
TCP proxy in front of PostgreSQL, and read helpers for both databases.

Import explicitly: ``from tests.trino.catalog_doubles import pools  # noqa: F401``.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from duckgres_admin.models import TrinoPool, Warehouse, WarehouseTrino
from tests.fixtures.rows import new_warehouse
from tests.fixtures.trino import CatalogStore
from tests.trino.helpers import cell, full_env, registry, with_pool, write
from trino_pools import authority, catalog_writer, config
from trino_pools.authority import Authority
from trino_pools.catalog_store import BOOTSTRAP_DDL
from trino_pools.catalog_writer import CatalogWriter
from trino_pools.config import TrinoSettings

OWNER = "trino-worker-0.0123456789abcdef"

# The simple-query message psycopg sends for COMMIT: 'Q', int32 length 11, "COMMIT\0".
COMMIT_MESSAGE = b"Q\x00\x00\x00\x0bCOMMIT\x00"
JOURNAL_INSERT = b"INSERT INTO trino_catalog_journal"


def bootstrap(store: CatalogStore) -> None:
    with psycopg.connect(store.dsn, autocommit=True, options="-c search_path=trino_catalogs") as c:
        c.execute(BOOTSTRAP_DDL)


def settings_for(
    tmp: Path, dsn: str, *, admission: bool = False, name: str = "catalog-cells.json"
) -> TrinoSettings:
    cells = [with_pool(cell(c), tenant_admission=admission) for c in ("pool-a", "pool-b")]
    env = full_env(
        tmp,
        DUCKGRES_TRINO_CELLS_FILE=write(tmp, name, registry(*cells)),
        DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=write(tmp, f"{name}.dsn", dsn + "\n"),
        DUCKGRES_TRINO_AWS_REGION="eu-central-1",
        DUCKGRES_TRINO_DEFAULT_CELL="pool-a" if admission else None,
    )
    return config.load(env, service_account_token="/nonexistent")


@dataclass
class Pools:
    """Two configured pools (``pool-a``, ``pool-b``) writing to one real catalog store."""

    tmp: Path
    store: CatalogStore
    settings: TrinoSettings

    def use(self, settings: TrinoSettings) -> None:
        self.settings = settings
        config.install_for_tests(settings)

    def seed(self, public_id: str) -> str:
        pool_id = f"registered:{public_id}"
        TrinoPool.objects.get_or_create(
            pool_id=pool_id,
            defaults={"public_id": public_id, "desired_instances": 3, "min_serving": 2},
        )
        return pool_id

    def lead(
        self, public_id: str = "pool-a", owner: str = OWNER
    ) -> tuple[Authority, CatalogWriter]:
        """Acquire the pool, install the authority and claim the writer (§4.3)."""
        pool_id = self.seed(public_id)
        auth = authority.acquire(pool_id, owner)
        authority.HOLDER.install(auth)
        writer = catalog_writer.claim(auth, self.settings)
        return auth, writer

    def warehouse(
        self,
        database_name: str,
        *,
        pool: str = "pool-a",
        enabled: bool = True,
        org_id: str | None = None,
        state: str = "ready",
        **trino: Any,
    ) -> Warehouse:
        wh = new_warehouse(
            org_id=org_id or f"org-{secrets.token_hex(4)}",
            state=state,
            database_name=database_name,
            metadata_store_kind="external",
            metadata_store_host="meta-1.example.internal",
            metadata_store_port=5432,
            metadata_store_sslmode="require",
            metadata_store_database=database_name,
            metadata_store_user=database_name,
            metadata_store_password_ref="env:TENANT_PASSWORD",
            data_bucket="tenant-data",
            data_region="us-east-1",
        )
        WarehouseTrino.objects.create(
            warehouse=wh, enabled=enabled, trino_cell_id=f"registered:{pool}", **trino
        )
        return wh


@pytest.fixture
def pools(tmp_path: Path, catalog_store: CatalogStore, db: None) -> Iterator[Pools]:
    bootstrap(catalog_store)
    settings = settings_for(tmp_path, catalog_store.dsn)
    config.install_for_tests(settings)
    try:
        yield Pools(tmp_path, catalog_store, settings)
    finally:
        catalog_writer.uninstall_all()
        authority.HOLDER.clear_all()
        config.install_for_tests(None)


# -- reads -------------------------------------------------------------------------------------


def trino_row_json(org_id: str) -> str:
    """The org's whole Trino row, byte for byte."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT row_to_json(t)::text FROM duckgres_managed_warehouse_trino t WHERE org_id = %s",
            [org_id],
        )
        row = cursor.fetchone()
    return str(row[0]) if row else ""


def trino_row(org_id: str) -> WarehouseTrino:
    return WarehouseTrino.objects.get(warehouse__org_id=org_id)


def store_rows(
    store: CatalogStore, sql: str, params: list[Any] | None = None
) -> list[tuple[Any, ...]]:
    with psycopg.connect(store.dsn, options="-c search_path=trino_catalogs") as conn:
        return list(conn.execute(sql, params or []).fetchall())


def journal(store: CatalogStore, pool_key: str = "registered:pool-a") -> list[tuple[Any, ...]]:
    return store_rows(
        store,
        "SELECT revision, operation_id, operation, catalog_name, version, payload_hash, "
        "writer_epoch FROM trino_catalog_journal WHERE pool_key = %s ORDER BY revision",
        [pool_key],
    )


def catalogs(
    store: CatalogStore, pool_key: str = "registered:pool-a"
) -> dict[str, tuple[Any, ...]]:
    rows = store_rows(
        store,
        "SELECT catalog_name, payload_hash, revision, version, definition FROM trino_catalogs "
        "WHERE pool_key = %s ORDER BY catalog_name",
        [pool_key],
    )
    return {str(r[0]): tuple(r[1:]) for r in rows}


def writer_state(store: CatalogStore, pool_key: str = "registered:pool-a") -> Any:
    rows = store_rows(
        store,
        "SELECT writer_epoch, writer_identity, revision, catalog_count "
        "FROM trino_catalog_writer_state WHERE pool_key = %s",
        [pool_key],
    )
    return tuple(rows[0]) if rows else None


def whole_store(store: CatalogStore) -> list[Any]:
    """Every row of the three tables (for "nothing was written" checks)."""
    return [
        store_rows(store, f"SELECT row_to_json(t)::text FROM {table} t ORDER BY 1")
        for table in ("trino_catalog_writer_state", "trino_catalogs", "trino_catalog_journal")
    ]


def pool_revision(pool_id: str = "registered:pool-a") -> int:
    return int(TrinoPool.objects.get(pool_id=pool_id).publication_revision)


# -- a proxy that loses the response to a COMMIT -------------------------------------------------


@dataclass
class CommitDropProxy:
    """TCP proxy to 127.0.0.1:5432. When armed, the next COMMIT of a transaction that wrote a
    journal entry reaches the server, its answer is swallowed and the client's connection is
    cut: a lost COMMIT, exactly as on a network failure (the server committed, the client never
    heard)."""

    port: int = 0
    armed: bool = False
    dropped: int = 0
    _listener: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode=disable"

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            upstream = socket.create_connection(("127.0.0.1", 5432))
            swallow = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, swallow), daemon=True).start()
            threading.Thread(
                target=self._down, args=(upstream, client, swallow), daemon=True
            ).start()

    def _up(self, client: socket.socket, upstream: socket.socket, swallow: threading.Event) -> None:
        primed = False
        try:
            while data := client.recv(65536):
                primed = primed or (self.armed and JOURNAL_INSERT in data)
                cut = self.armed and primed and COMMIT_MESSAGE in data
                if cut:
                    self.armed = False
                    swallow.set()
                upstream.sendall(data)
                if cut:
                    time.sleep(0.3)  # let the server commit
                    self.dropped += 1
                    for sock in (client, upstream):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                        sock.close()
                    return
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()

    def _down(
        self, upstream: socket.socket, client: socket.socket, swallow: threading.Event
    ) -> None:
        try:
            while data := upstream.recv(65536):
                if swallow.is_set():
                    continue
                client.sendall(data)
        except OSError:
            pass


@pytest.fixture
def commit_drop_proxy() -> Iterator[CommitDropProxy]:
    proxy = CommitDropProxy()
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


# -- a proxy behind which the store goes dark right after a write ------------------------------


@dataclass
class DarkAfterWriteProxy:
    """TCP proxy to 127.0.0.1:5432. When armed, the next transaction that writes a journal
    entry commits normally and its answer reaches the client; then the store "goes dark": the
    client's next request on that connection cuts it, and every new connection is closed at
    once, until ``dark`` is set back to False. The write is done, its read-back cannot be: the
    publisher blip of a network partition right after a COMMIT."""

    port: int = 0
    armed: bool = False
    dark: bool = False
    cut: int = 0
    _listener: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode=disable"

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            if self.dark:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", 5432))
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        primed = committed = False
        try:
            while data := client.recv(65536):
                if self.dark or committed:
                    self.armed, self.dark = False, True
                    self.cut += 1
                    return  # the finally closes both ends: the request never arrives
                primed = primed or (self.armed and JOURNAL_INSERT in data)
                committed = self.armed and primed and COMMIT_MESSAGE in data
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    @staticmethod
    def _down(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(65536):
                client.sendall(data)
        except OSError:
            pass


@pytest.fixture
def dark_after_write_proxy() -> Iterator[DarkAfterWriteProxy]:
    proxy = DarkAfterWriteProxy()
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
