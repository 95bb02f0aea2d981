"""Ownership audit (spec trino-pools §4.14, safeguard 38): count, sample of at most 20 sorted
by org id, gauge, and never a changed row."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from duckgres_admin.models import WarehouseTrino
from tests.trino.helpers import full_env
from trino_pools import audit
from trino_pools.config import load
from trino_pools.metrics import TRINO_REGISTRY

pytestmark = pytest.mark.django_db


def _table() -> list[tuple[object, ...]]:
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM duckgres_managed_warehouse_trino ORDER BY org_id")
        return list(cur.fetchall())


def _gauge() -> float | None:
    return TRINO_REGISTRY.get_sample_value("duckgres_trino_unconfigured_owner_warehouses")


@pytest.fixture
def settings_one_pool(tmp_path):
    return load(full_env(tmp_path), service_account_token="/nonexistent")


def _row(make_warehouse, org: str, owner: str, *, enabled: bool = True) -> None:
    WarehouseTrino.objects.create(
        warehouse=make_warehouse(org_id=org), enabled=enabled, trino_cell_id=owner
    )


@pytest.mark.safeguard("trino-38")
def test_reports_count_bounded_sorted_sample_and_gauge_without_changing_a_row(
    make_warehouse, settings_one_pool, caplog
):
    # 25 unconfigured owners: empty, a removed pool, legacy and bare ids.
    owners = ["", "registered:removed", "legacy", "cell-001", "registered:unknown"]
    for i in range(25):
        _row(make_warehouse, f"org-{i:03d}", owners[i % len(owners)])
    _row(make_warehouse, "org-ok", "registered:pool-a")
    _row(make_warehouse, "org-disabled", "", enabled=False)
    before = _table()

    with caplog.at_level(logging.WARNING, logger="duckgres.trino.audit"):
        result = audit.run_audit(settings_one_pool)

    assert result is not None
    assert result.count == 25
    assert len(result.sample) == 20
    assert [org for org, _ in result.sample] == [f"org-{i:03d}" for i in range(20)]
    assert result.sample[0] == ("org-000", "")
    assert result.sample[1] == ("org-001", "registered:removed")
    assert _gauge() == 25
    (record,) = [r for r in caplog.records if r.name == "duckgres.trino.audit"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "25 Trino-enabled warehouse(s)" in message
    assert "org_id=org-000 owner='' org_id=org-001 owner=registered:removed" in message
    assert "org-019" in message
    assert "org-020" not in message
    assert "org-ok" not in message
    assert "org-disabled" not in message
    assert _table() == before


def test_clean_fleet_sets_zero_and_does_not_warn(make_warehouse, settings_one_pool, caplog):
    _row(make_warehouse, "org-a", "registered:pool-a")
    before = _table()
    with caplog.at_level(logging.WARNING, logger="duckgres.trino.audit"):
        result = audit.run_audit(settings_one_pool)
    assert result is not None
    assert result.count == 0
    assert _gauge() == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert _table() == before


def test_unwired_process_does_not_audit(make_warehouse):
    _row(make_warehouse, "org-a", "")
    assert audit.run_audit(load({})) is None


def test_outside_a_transaction_it_reads_in_a_read_only_transaction(
    transactional_db, make_warehouse, settings_one_pool
):
    _row(make_warehouse, "org-a", "registered:gone")
    before = _table()
    result = audit.run_audit(settings_one_pool)
    assert result is not None
    assert result.count == 1
    assert _table() == before
