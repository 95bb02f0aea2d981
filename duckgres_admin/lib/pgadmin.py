"""The one seam for connections to metadata stores (PostgreSQL servers holding catalogs).

Rules (spec reshard §4.9, §4.11): the password reaches psycopg only as the separate
``password=`` keyword, never inside a DSN or conninfo string; sslmode and port are always
explicit; ``connect_timeout`` is always set; ``application_name`` names the operation.
Auth failures are classified so waits can report a stranded password with its remedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

AUTH_SQLSTATES = frozenset({"28P01", "28000"})
AUTH_TEXTS = ("sasl authentication failed", "password authentication failed")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    sslmode: str

    def redacted(self, database: str, user: str) -> str:
        """The only form in which an endpoint is logged (§2.7)."""
        return f"{self.host}:{self.port}/{database} (user {user}, sslmode {self.sslmode})"


def connect(
    endpoint: Endpoint,
    *,
    dbname: str,
    user: str,
    password: str | None,
    application_name: str = "duckgres-admin",
    connect_timeout: int = 10,
    autocommit: bool = True,
) -> psycopg.Connection[tuple[object, ...]]:
    """Open a connection; the password travels only as its own keyword argument."""
    return psycopg.connect(
        host=endpoint.host,
        port=endpoint.port,
        dbname=dbname,
        user=user,
        password=password or None,
        sslmode=endpoint.sslmode,
        connect_timeout=connect_timeout,
        application_name=application_name,
        autocommit=autocommit,
    )


def probe(
    endpoint: Endpoint,
    *,
    dbname: str,
    user: str,
    password: str | None,
    application_name: str = "duckgres-admin",
    connect_timeout: int = 8,
) -> None:
    """Connect and ``SELECT 1``; raises the psycopg error on failure."""
    with connect(
        endpoint,
        dbname=dbname,
        user=user,
        password=password,
        application_name=application_name,
        connect_timeout=connect_timeout,
    ) as conn:
        conn.execute("SELECT 1")


def is_auth_failure(exc: BaseException) -> bool:
    """SQLSTATE 28P01/28000, or the message of a connection-time SASL/password failure."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in AUTH_SQLSTATES:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in AUTH_TEXTS)
