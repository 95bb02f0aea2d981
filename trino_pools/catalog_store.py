"""The catalog store's writer connection check and bootstrap DDL (spec trino-pools §2.7, §4.1
step 7, safeguard 8).

The catalog store is a separate PostgreSQL database with its own credential (the publisher
login from ``DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE``); coordinators read their catalogs from it.
Its tables are created by ``BOOTSTRAP_DDL`` (additive, idempotent) when
``DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP`` is true -- at trino worker start and in
``manage.py trino_check`` only, never in ``AppConfig.ready()`` or ``migrate``. The same DDL is
written out in ``docs/trino-catalog-store.sql``.

The connection pins ``search_path`` to ``DUCKGRES_TRINO_POOL_CATALOG_SCHEMA`` (the publisher
has no rights on ``public``). Error messages never carry the DSN or its password.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.base.scrub import Scrubber
from trino_pools.config import TrinoSettings

CONNECT_TIMEOUT_SECONDS = 10
BOOTSTRAP_TIMEOUT = "30s"

BOOTSTRAP_DDL = """
CREATE TABLE IF NOT EXISTS trino_catalog_writer_state (
    pool_key        text        PRIMARY KEY,
    writer_epoch    bigint      NOT NULL DEFAULT 0 CHECK (writer_epoch >= 0),
    writer_identity text        NOT NULL DEFAULT '',
    revision        bigint      NOT NULL DEFAULT 0 CHECK (revision >= 0),
    catalog_count   integer     NOT NULL DEFAULT 0 CHECK (catalog_count >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS trino_catalogs (
    pool_key     text   NOT NULL,
    catalog_name text   NOT NULL,
    definition   jsonb  NOT NULL,
    version      bigint NOT NULL CHECK (version >= 1),
    payload_hash text   NOT NULL,
    revision     bigint NOT NULL CHECK (revision >= 1),
    PRIMARY KEY (pool_key, catalog_name)
);
CREATE TABLE IF NOT EXISTS trino_catalog_journal (
    pool_key     text        NOT NULL,
    revision     bigint      NOT NULL CHECK (revision >= 1),
    operation_id text        NOT NULL,
    operation    text        NOT NULL CHECK (operation IN ('ADD_OR_REPLACE', 'REMOVE')),
    catalog_name text        NOT NULL,
    version      bigint      NOT NULL,
    payload_hash text        NOT NULL,
    writer_epoch bigint      NOT NULL CHECK (writer_epoch >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool_key, revision),
    UNIQUE (pool_key, operation_id)
);
"""


class CatalogStoreError(RuntimeError):
    """The catalog store cannot be used or failed (message scrubbed of the DSN).

    The one class for both uses: ``check_writer`` (fatal at trino worker start and in
    ``manage.py trino_check``) and the fenced writer's calls (``catalog_writer`` re-exports it).
    """


def _read_dsn(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise CatalogStoreError(
            f"DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE: cannot read {path!r} ({exc.strerror})"
        ) from None


def _scrub(text: str, dsn: str) -> str:
    scrubber = Scrubber(dsn, min_length=1)
    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:  # noqa: BLE001 - validated at start; scrub the whole DSN regardless
        password = None
    if password:
        scrubber.add(str(password))
    return scrubber.scrub(text)


def check_writer(settings: TrinoSettings, *, bootstrap: bool = False) -> str:
    """Open the writer connection with the schema pinned; optionally run the bootstrap DDL.

    Returns the schema the session resolved (``current_schema()``). Raises
    ``CatalogStoreError`` naming the store (never the DSN) on any failure.
    """
    where = (
        "the Trino catalog store "
        f"(DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE {settings.catalog_dsn_file!r})"
    )
    dsn = _read_dsn(settings.catalog_dsn_file)
    schema = settings.catalog_schema
    try:
        with psycopg.connect(
            dsn,
            options=f"-c search_path={schema}",
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            application_name="duckgres-admin-trino-writer",
            autocommit=True,
        ) as conn:
            search_path = conn.execute("SHOW search_path").fetchone()
            current = conn.execute("SELECT current_schema()").fetchone()
            if search_path is None or search_path[0] != schema:
                raise CatalogStoreError(
                    f"{where}: search_path is {search_path[0] if search_path else None!r}, "
                    f"not the pinned schema {schema!r}"
                )
            if current is None or current[0] != schema:
                raise CatalogStoreError(
                    f"{where}: schema {schema!r} (DUCKGRES_TRINO_POOL_CATALOG_SCHEMA) does not "
                    "exist or is not usable by the publisher login; create it and grant the "
                    "publisher USAGE and CREATE on it"
                )
            if bootstrap:
                with conn.transaction():
                    conn.execute(f"SET LOCAL statement_timeout = '{BOOTSTRAP_TIMEOUT}'")
                    conn.execute(BOOTSTRAP_DDL)
            return str(current[0])
    except CatalogStoreError:
        raise
    except psycopg.Error as exc:
        raise CatalogStoreError(f"{where}: {_scrub(str(exc).strip(), dsn)}") from None
