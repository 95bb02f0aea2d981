"""A reshard adopts an existing target database only when it holds nothing (safeguard
reshard-108, docs/restore.md "What a rollback drops"), for both target kinds, against the real
store clusters: the dry run reports the check with what the database holds, the start answers
400 ``target_database_not_empty`` naming it, and nothing is created or changed — the planted
``ducklake_*`` table and the stranger's table are intact.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import sql

from tests.fixtures.api import error
from tests.fixtures.start import Setup, assert_nothing_created, external_target_body
from tests.fixtures.strangers import plant_tables, strangers_intact

pytestmark = [pytest.mark.safeguard("reshard-108")]


def _refused(clients: Any, setup: Setup, body: dict[str, Any], database: str) -> None:
    dry = clients.internal.post(setup.path, {**body, "dry_run": True}, format="json")
    assert dry.status_code == 200, dry.content
    checks = {e["check"]: e for e in dry.json()["preflight"]}
    empty = checks["target_database_empty"]
    assert empty["ok"] is False, checks
    assert f"target database {database} on " in empty["detail"], empty["detail"]
    assert (
        "holds 2 tables (public.ducklake_inlined_data_999_999, public.operator_notes)"
        in empty["detail"]
    ), empty["detail"]
    assert "(start would answer 400 target_database_not_empty)" in empty["detail"]
    start = clients.internal.post(setup.path, body, format="json")
    assert start.status_code == 400, start.content
    assert start.json()["code"] == "target_database_not_empty", start.content
    assert "public.operator_notes" in error(start)
    assert empty["detail"].startswith(error(start))


def test_a_reshard_onto_a_cnpg_store_refuses_a_target_database_that_holds_tables(
    clients: Any, published: Any, cnpg_source: Setup
) -> None:
    cluster, catalog = cnpg_source.clusters.target, cnpg_source.catalog
    with cluster.superuser_conn() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(catalog.role)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(catalog.database), sql.Identifier(catalog.role)
            )
        )
    plant_tables(cluster, catalog.database, catalog.role)
    body = {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}}
    _refused(clients, cnpg_source, body, catalog.database)
    assert_nothing_created(published)
    strangers_intact(cluster, catalog.database)


def test_a_reshard_onto_an_external_target_refuses_a_database_that_holds_tables(
    clients: Any, published: Any, cnpg_source: Setup, tenant_catalog: Any
) -> None:
    ext = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    plant_tables(ext.cluster, ext.database, ext.role)
    _refused(clients, cnpg_source, external_target_body(ext), ext.database)
    assert_nothing_created(published)
    strangers_intact(ext.cluster, ext.database)
