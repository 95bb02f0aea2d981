"""Fixtures of the catalog copy and verification tests (reshard/engines/copy/,
reshard/engines/verify.py).

Each test gets a tenant (role + database) on BOTH metadata-store clusters (5433 source, 5434
target) through the shared ``tenant_catalog`` fixture; the source database is filled with a
small DuckLake-shaped demo catalog owned by the tenant. Connections used by the copy are
opened like the runner opens them: the ``provisioner`` login, ``sslmode=require``, explicit
port, an ``application_name`` unique to the test, then ``SET ROLE`` the tenant.
"""

from __future__ import annotations

import secrets

import pytest
from psycopg import sql

from reshard.engines.demo_catalog import build_demo_catalog
from tests.fixtures.catalog_pair import CatalogPair, CatalogPairFactory
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.stores import StoreClusters, TenantCatalogFactory


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
