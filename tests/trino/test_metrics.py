"""``duckgres_trino_pool_configured`` lives for the whole process (spec trino-pools §7,
safeguard 33): it survives an exporter restart and a failed reload; operator-disabled pools
never export it."""

from __future__ import annotations

import secrets
import urllib.request
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.trino.helpers import cell, full_env, registry, write
from trino_pools import config, metrics
from trino_pools.config import load
from trino_pools.metrics import TRINO_REGISTRY, Exporter


def _value(pool: str, namespace: str) -> float | None:
    return TRINO_REGISTRY.get_sample_value(
        "duckgres_trino_pool_configured", {"pool": pool, "workload_namespace": namespace}
    )


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _unique_env(tmp_path: Path, **overrides: str | None) -> tuple[str, dict[str, str]]:
    pool = f"pool-{secrets.token_hex(3)}"
    cells = write(tmp_path, "cells-unique.json", registry(cell(pool)))
    merged: dict[str, str | None] = {
        "DUCKGRES_TRINO_CELLS_FILE": cells,
        "DUCKGRES_TRINO_DEFAULT_CELL": pool,
    }
    merged.update(overrides)
    env = full_env(tmp_path, **merged)
    return pool, env


@pytest.mark.safeguard("trino-33")
def test_configured_survives_exporter_restart_and_failed_reload(tmp_path, trino_settings_reset):
    pool, env = _unique_env(tmp_path)
    settings = load(env, service_account_token="/nonexistent")
    metrics.mark_configured(settings)
    assert _value(pool, f"trino-{pool}") == 1

    exporter = Exporter()
    port = exporter.start(0)
    line = f'duckgres_trino_pool_configured{{pool="{pool}",workload_namespace="trino-{pool}"}} 1.0'
    assert line in _scrape(port)

    # Restart the exporter (an internal server restart): the series is still there.
    exporter.stop()
    port = exporter.start(0)
    assert line in _scrape(port)

    # A failed reload (a retired variable appears): the process keeps its expectation.
    with pytest.raises(ImproperlyConfigured):
        config.validate_process({**env, "DUCKGRES_TRINO_CELL_ID": "x"})
    assert line in _scrape(port)

    # A later, different successful configuration does not erase it either.
    config.validate_process({})
    metrics.mark_configured(config.current())
    assert line in _scrape(port)
    exporter.stop()


@pytest.mark.safeguard("trino-33")
def test_operator_disabled_pools_never_export_configured(tmp_path):
    pool, env = _unique_env(
        tmp_path,
        DUCKGRES_TRINO_DEFAULT_CELL=None,
        DUCKGRES_TRINO_POOL_OPERATOR_ENABLED="false",
        DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED="false",
    )
    settings = load(env, service_account_token="/nonexistent")
    assert settings.wired
    assert not settings.operator_enabled
    metrics.mark_configured(settings)
    assert _value(pool, f"trino-{pool}") is None


def test_the_collector_has_no_removal_path():
    assert not hasattr(metrics.CONFIGURED, "remove")
    assert not hasattr(metrics.CONFIGURED, "clear")
    before = metrics.CONFIGURED.series()
    metrics.CONFIGURED.add([])
    assert metrics.CONFIGURED.series() == before


def test_trino_metrics_are_not_in_the_default_registry(tmp_path):
    from prometheus_client import REGISTRY

    pool, env = _unique_env(tmp_path)
    metrics.mark_configured(load(env, service_account_token="/nonexistent"))
    names = {m.name for m in REGISTRY.collect()}
    assert "duckgres_trino_pool_configured" not in names
    assert "duckgres_trino_unconfigured_owner_warehouses" not in names
    assert _value(pool, f"trino-{pool}") == 1
