"""The catalog writer's connection at trino worker start and in ``trino_check`` (spec
trino-pools §2.7, §4.1 step 7, safeguard 8), against a real PostgreSQL database."""

from __future__ import annotations

import psycopg
import pytest

from tests.trino.helpers import full_env, write
from trino_pools.catalog_store import CatalogStoreError, check_writer
from trino_pools.config import load


def _settings(tmp_path, dsn: str, **overrides):
    env = full_env(
        tmp_path, DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=write(tmp_path, "dsn-x", dsn), **overrides
    )
    return load(env, service_account_token="/nonexistent")


@pytest.mark.safeguard("trino-8")
def test_a_valid_dsn_connects_with_the_schema_pinned(tmp_path, catalog_store):
    settings = _settings(tmp_path, catalog_store.dsn)
    assert check_writer(settings) == "trino_catalogs"
    assert catalog_store.tables() == []  # no bootstrap requested: nothing created


@pytest.mark.safeguard("trino-8")
def test_a_missing_schema_is_fatal(tmp_path, catalog_store):
    settings = _settings(tmp_path, catalog_store.dsn, DUCKGRES_TRINO_POOL_CATALOG_SCHEMA="absent")
    with pytest.raises(CatalogStoreError) as info:
        check_writer(settings)
    assert "schema 'absent' (DUCKGRES_TRINO_POOL_CATALOG_SCHEMA) does not exist" in str(info.value)


def test_bootstrap_creates_the_three_tables_idempotently(tmp_path, catalog_store):
    settings = _settings(tmp_path, catalog_store.dsn)
    check_writer(settings, bootstrap=True)
    check_writer(settings, bootstrap=True)
    assert catalog_store.tables() == [
        "trino_catalog_journal",
        "trino_catalog_writer_state",
        "trino_catalogs",
    ]
    with psycopg.connect(catalog_store.dsn, options="-c search_path=trino_catalogs") as conn:
        conn.execute(
            "INSERT INTO trino_catalog_journal (pool_key, revision, operation_id, operation, "
            "catalog_name, version, payload_hash, writer_epoch) "
            "VALUES ('registered:pool-a', 1, 'op-1', 'ADD_OR_REPLACE', 'org_a', 1, 'h', 1)"
        )
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "INSERT INTO trino_catalog_journal (pool_key, revision, operation_id, operation, "
                "catalog_name, version, payload_hash, writer_epoch) "
                "VALUES ('registered:pool-a', 2, 'op-1', 'REMOVE', 'org_a', 1, 'h', 1)"
            )


def test_the_documented_ddl_is_the_bootstrap_ddl():
    from pathlib import Path

    from trino_pools.catalog_store import BOOTSTRAP_DDL

    doc = (Path(__file__).resolve().parents[2] / "docs" / "trino-catalog-store.sql").read_text()
    assert BOOTSTRAP_DDL.strip() in doc


def test_an_unreachable_store_fails_naming_it_without_the_password(tmp_path, dead_endpoint):
    dsn = f"postgresql://publisher:pw-5t4r3e2w@127.0.0.1:{dead_endpoint.port}/catalogs"
    with pytest.raises(CatalogStoreError) as info:
        check_writer(_settings(tmp_path, dsn))
    text = str(info.value)
    assert text.startswith("the Trino catalog store (DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE ")
    assert "pw-5t4r3e2w" not in text
    assert dead_endpoint.accepted
