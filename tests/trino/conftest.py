"""Fixtures of the Trino suite: a real catalog-store database and a counting dead endpoint."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from tests.fixtures.trino import ADMIN_DSN, CatalogStore
from trino_pools import config


@pytest.fixture
def catalog_store() -> Iterator[CatalogStore]:
    """A fresh database on the 5432 cluster with the writer's schema ``trino_catalogs``."""
    name = f"trino_catalog_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    store = CatalogStore(database=name, schema="trino_catalogs")
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA trino_catalogs")
    try:
        yield store
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class DeadEndpoint:
    """A TCP listener that accepts and immediately closes: "unreachable", but counted."""

    port: int
    accepted: list[int] = field(default_factory=list)


@pytest.fixture
def dead_endpoint() -> Iterator[DeadEndpoint]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    endpoint = DeadEndpoint(port=listener.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            endpoint.accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()


@pytest.fixture
def trino_lease_row(transactional_db: None) -> None:
    """The seeded ``trino`` lease row (transactional tests truncate it between tests)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO duckgres_leases (name, holder, epoch, expires_at) "
            "VALUES ('trino', '', 0, '-infinity') ON CONFLICT (name) DO NOTHING"
        )


@pytest.fixture
def trino_settings_reset() -> Iterator[None]:
    """Restore the process's Trino settings after a test installs its own."""
    yield
    config.install_for_tests(None)
