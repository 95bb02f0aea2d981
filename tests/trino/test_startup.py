"""Whole processes: start-up refusal, ``manage.py trino_check`` and ``migrate`` with Trino wired
(spec trino-pools §4.1, safeguards 4 and 41)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from duckgres_admin.models import WarehouseTrino
from tests.fixtures.trino import ADMIN_DSN
from tests.testenv import TEST_ENV
from tests.trino.helpers import full_env, write

ROOT = Path(__file__).resolve().parents[2]


def run(env_overrides: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DUCKGRES_", "DJANGO_", "TRINO_", "KUBERNETES_"))
    }
    env.update(TEST_ENV)
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _config_store_for_this_test_db() -> str:
    name = connection.settings_dict["NAME"]
    return f"postgresql://postgres@127.0.0.1:5432/{name}?sslmode=prefer"


@pytest.mark.safeguard("trino-4")
def test_a_retired_variable_stops_any_process_naming_it_not_its_value(tmp_path):
    value = "https://old-coordinator.internal:8443"
    result = run({"DUCKGRES_TRINO_COORDINATOR_URL": value}, "check")
    assert result.returncode != 0
    assert (
        "DUCKGRES_TRINO_COORDINATOR_URL is retired and must not be set: declare the cell in "
        "DUCKGRES_TRINO_CELLS_FILE as a shared-pool cell with its client_url, then remove the "
        "variable"
    ) in result.stderr
    assert value not in result.stderr + result.stdout


def test_trino_check_unwired(tmp_path):
    result = run({}, "trino_check")
    assert result.returncode == 0, result.stderr
    assert "Trino is not wired" in result.stdout


@pytest.mark.safeguard("trino-38")
def test_trino_check_full_run_reports_pools_store_and_audit(
    tmp_path, transactional_db, make_warehouse, catalog_store
):
    WarehouseTrino.objects.create(
        warehouse=make_warehouse(org_id="org-stray"), enabled=True, trino_cell_id="legacy"
    )
    env = full_env(
        tmp_path,
        DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=write(tmp_path, "dsn-ok", catalog_store.dsn),
        DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP="true",
        DUCKGRES_CONFIG_STORE=_config_store_for_this_test_db(),
    )
    result = run(env, "trino_check")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "1 pool(s), operator enabled" in out
    assert "pool pool-a (default cell): stored id registered:pool-a" in out
    assert "catalog store: connected, search_path pinned to trino_catalogs; bootstrap DDL" in out
    assert "warning: trino ownership audit: 1 Trino-enabled warehouse(s)" in out
    assert "org_id=org-stray owner=legacy" in out
    assert out.rstrip().endswith("trino_check: OK")
    assert catalog_store.tables() == [
        "trino_catalog_journal",
        "trino_catalog_writer_state",
        "trino_catalogs",
    ]
    assert "never-logged" not in out + result.stderr


@pytest.mark.safeguard("trino-41")
def test_trino_check_fails_naming_an_unreachable_store(tmp_path, dead_endpoint):
    dsn = f"postgresql://publisher:pw-1q2w3e4r@127.0.0.1:{dead_endpoint.port}/catalogs"
    env = full_env(tmp_path, DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=write(tmp_path, "d", dsn))
    result = run(env, "trino_check")
    assert result.returncode == 1
    assert "the Trino catalog store (DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE" in result.stderr
    assert "pw-1q2w3e4r" not in result.stderr + result.stdout


@pytest.mark.safeguard("trino-41")
def test_migrate_on_an_empty_database_never_touches_the_catalog_store(tmp_path, dead_endpoint):
    dsn = f"postgresql://publisher:pw-0o9i8u7y@127.0.0.1:{dead_endpoint.port}/catalogs"
    name = f"duckgres_trino_migrate_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = full_env(
            tmp_path,
            DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE=write(tmp_path, "d", dsn),
            DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP="true",
            DUCKGRES_TRINO_POOL_GATEWAY_URL="https://127.0.0.1:1",
            DUCKGRES_CONFIG_STORE=f"postgresql://postgres@127.0.0.1:5432/{name}?sslmode=prefer",
        )
        migrated = run(env, "migrate", "--no-input")
        assert migrated.returncode == 0, migrated.stderr
        check = run(env, "makemigrations", "--check", "--dry-run")
        assert check.returncode == 0, check.stderr + check.stdout
        assert dead_endpoint.accepted == []  # not one connection to the catalog store
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:5432/{name}", autocommit=True
        ) as conn:
            row = conn.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_name LIKE 'trino_catalog%%'"
            ).fetchone()
            assert row == (0,)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
