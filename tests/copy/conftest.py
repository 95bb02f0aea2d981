"""Fixtures of the catalog copy and verification tests (reshard/copy.py, reshard/verify.py).

Each test gets a tenant (role + database) on BOTH metadata-store clusters (5433 source, 5434
target) through the shared ``tenant_catalog`` fixture; the source database is filled with a
small DuckLake-shaped demo catalog owned by the tenant. Connections used by the copy are
opened like the runner opens them: the ``provisioner`` login, ``sslmode=require``, explicit
port, an ``application_name`` unique to the test, then ``SET ROLE`` the tenant.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reshard.demo_catalog import build_demo_catalog
from tests.fixtures.stores import StoreCluster, StoreClusters, TenantCatalogFactory


class RecordingHooks:
    """A ``CopyHooks`` that records everything; ``stop`` and ``irreversible`` are test levers."""

    def __init__(self) -> None:
        self.logs: list[tuple[str, str]] = []
        self.progress_calls: list[tuple[float, dict[str, int]]] = []
        self.irreversible_calls = 0
        self.registered: list[psycopg.Connection[Any]] = []
        self.ever_registered: list[psycopg.Connection[Any]] = []
        self.stop = threading.Event()
        self.on_irreversible: Callable[[int], None] | None = None
        # Threads that called log/progress/before_irreversible/stopped (must be one).
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def log(self, level: str, message: str) -> None:
        self.threads.add(threading.get_ident())
        self.logs.append((level, message))

    def progress(self, values: Mapping[str, int]) -> None:
        self.threads.add(threading.get_ident())
        self.progress_calls.append((time.monotonic(), dict(values)))

    def before_irreversible(self) -> None:
        self.threads.add(threading.get_ident())
        self.irreversible_calls += 1
        if self.on_irreversible is not None:
            self.on_irreversible(self.irreversible_calls)

    def register_connection(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            self.registered.append(conn)
            self.ever_registered.append(conn)

    def unregister_connection(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            self.registered = [c for c in self.registered if c is not conn]

    def stopped(self) -> bool:
        self.threads.add(threading.get_ident())
        return self.stop.is_set()

    def cancel_all(self) -> None:
        """What fencing does (runner context ``interrupt_all``)."""
        with self._lock:
            conns = list(self.registered)
        for conn in conns:
            try:
                conn.cancel_safe(timeout=5)
            except Exception:
                continue

    def messages(self) -> list[str]:
        return [m for _, m in self.logs]


@dataclass
class CatalogPair:
    """A tenant's source catalog and its (empty) target database."""

    clusters: StoreClusters
    role: str
    database: str
    app: str
    source_tables: tuple[str, ...] = field(default_factory=tuple)

    def factory(
        self, cluster: StoreCluster, cls: type[psycopg.Connection[Any]] = psycopg.Connection
    ) -> Callable[[], psycopg.Connection[Any]]:
        def connect() -> psycopg.Connection[Any]:
            conn = cls.connect(
                host=cluster.host,
                port=cluster.port,
                dbname=self.database,
                user=cluster.provisioner_user,
                password=cluster.provisioner_password,
                sslmode=cluster.sslmode,
                sslrootcert=cluster.sslrootcert,  # the test CA with verify-full
                connect_timeout=10,
                application_name=self.app,
                autocommit=True,
            )
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role)))
            return conn

        return connect

    def source_factory(
        self, cls: type[psycopg.Connection[Any]] = psycopg.Connection
    ) -> Callable[[], psycopg.Connection[Any]]:
        return self.factory(self.clusters.source, cls)

    def target_factory(
        self, cls: type[psycopg.Connection[Any]] = psycopg.Connection
    ) -> Callable[[], psycopg.Connection[Any]]:
        return self.factory(self.clusters.target, cls)

    def su(self, side: str) -> psycopg.Connection[tuple[object, ...]]:
        cluster = self.clusters.source if side == "source" else self.clusters.target
        return cluster.superuser_conn(self.database)

    def checksums(self, side: str) -> dict[str, tuple[int, str]]:
        """(row count, md5 of the sorted row texts) of every ``ducklake_*`` table."""
        with self.su(side) as conn:
            names = [
                str(r[0])
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename LIKE 'ducklake\\_%' ORDER BY 1"
                )
            ]
            out: dict[str, tuple[int, str]] = {}
            for name in names:
                row = conn.execute(
                    sql.SQL(
                        "SELECT count(*), md5(coalesce(string_agg(x::text, E'\\n' "
                        "ORDER BY x::text), '')) FROM public.{} x"
                    ).format(sql.Identifier(name))
                ).fetchone()
                assert row is not None
                out[name] = (int(str(row[0])), str(row[1]))
        return out

    def schema_objects(self, side: str) -> dict[str, list[tuple[str, str, str]]]:
        """Constraints (name, type, definition) and indexes (name, definition) per table."""
        with self.su(side) as conn:
            cons = conn.execute(
                "SELECT c.relname::text, con.conname::text, con.contype::text, "
                "pg_get_constraintdef(con.oid) FROM pg_constraint con "
                "JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'public' ORDER BY 1, 2"
            ).fetchall()
            idx = conn.execute(
                "SELECT tablename::text, indexname::text, 'i', indexdef FROM pg_indexes "
                "WHERE schemaname = 'public' ORDER BY 1, 2"
            ).fetchall()
        out: dict[str, list[tuple[str, str, str]]] = {}
        for rel, name, kind, definition in list(cons) + list(idx):
            out.setdefault(str(rel), []).append((str(name), str(kind), str(definition)))
        return out

    def activity(self) -> list[tuple[str, str, str]]:
        """(server, state, query) of this test's sessions still known to either server."""
        rows: list[tuple[str, str, str]] = []
        for side, cluster in (("source", self.clusters.source), ("target", self.clusters.target)):
            with cluster.superuser_conn() as conn:
                for state, query in conn.execute(
                    "SELECT coalesce(state, ''), query FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (self.app,),
                ):
                    rows.append((side, str(state), str(query)))
        return rows


CatalogPairFactory = Callable[..., CatalogPair]


@pytest.fixture
def catalog_pair(
    store_clusters: StoreClusters, tenant_catalog: TenantCatalogFactory
) -> CatalogPairFactory:
    """Factory: ``catalog_pair(tables=12, inlined_every=3, files=4, columns=4)``."""

    def make(
        tables: int = 12, inlined_every: int = 3, files: int = 4, columns: int = 4
    ) -> CatalogPair:
        source = tenant_catalog(store_clusters.source, with_tables=False)
        tenant_catalog(
            store_clusters.target, name=source.role, password=source.password, with_tables=False
        )
        with store_clusters.source.superuser_conn(source.database) as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(source.role)))
            build_demo_catalog(
                conn,
                tables=tables,
                inlined_every=inlined_every,
                files_per_table=files,
                columns_per_table=columns,
                inlined_rows=12,
            )
        pair = CatalogPair(
            store_clusters, source.role, source.database, f"copytest-{secrets.token_hex(4)}"
        )
        pair.source_tables = tuple(pair.checksums("source"))
        return pair

    return make


@pytest.fixture
def hooks() -> RecordingHooks:
    return RecordingHooks()
