-- Trino catalog store: bootstrap DDL (spec trino-pools §2.7).
--
-- The catalog store is a separate PostgreSQL database with its own credential; Duckgres Admin
-- (the fenced catalog writer of the trino worker) is its only writer, and the Trino
-- coordinators read it as managed readers (/v1/catalog/sync).
--
-- Run by the trino worker at start and by `manage.py trino_check` when
-- DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP=true, with search_path pinned to
-- DUCKGRES_TRINO_POOL_CATALOG_SCHEMA (30 s statement timeout; failure is fatal). It is additive
-- and idempotent (CREATE TABLE IF NOT EXISTS). It is never run by `migrate`.
--
-- Before the first start, as a database owner:
--   CREATE SCHEMA trino_catalogs;
--   GRANT USAGE, CREATE ON SCHEMA trino_catalogs TO <publisher login>;
-- The publisher login has no rights on `public`.
--
-- This file is the same text as trino_pools.catalog_store.BOOTSTRAP_DDL (a test compares them).
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
