"""Read models of the Trino API (spec trino-pools §5)."""

from __future__ import annotations

import pytest

from duckgres_admin.models import TrinoPool, TrinoPoolInstance, WarehouseTrino
from tests.trino.helpers import cell, full_env, registry, write
from trino_pools import selectors
from trino_pools.config import load
from trino_pools.placement import PlacementError


@pytest.fixture
def two_pools(tmp_path):
    cells = write(tmp_path, "sel.json", registry(cell("pool-b"), cell("pool-a")))
    return load(
        full_env(tmp_path, DUCKGRES_TRINO_CELLS_FILE=cells), service_account_token="/nonexistent"
    )


def test_cells_sorted_by_id(two_pools):
    listed = selectors.list_cells(two_pools)["cells"]
    assert [c["id"] for c in listed] == ["pool-a", "pool-b"]
    assert listed[0] == {
        "id": "pool-a",
        "stored_id": "registered:pool-a",
        "client_url": "https://pool-a.trino.example.com",
        "namespace": "trino-pool-a",
        "routing_group": "rg-pool-a",
    }


@pytest.mark.parametrize(
    ("param", "status", "message"),
    [
        (None, 400, "explicit Trino cell selection is required"),
        ("", 400, "explicit Trino cell selection is required"),
        ("pool-z", 404, "unknown Trino cell"),
    ],
)
def test_cell_scoped_reads_require_an_explicit_known_cell(two_pools, param, status, message):
    for read in (selectors.org_rows, selectors.instances):
        with pytest.raises(PlacementError) as info:
            read(two_pools, param)
        assert (info.value.status, info.value.body()) == (status, {"error": message})


@pytest.mark.django_db
def test_org_rows_of_one_pool(two_pools, make_warehouse):
    WarehouseTrino.objects.create(
        warehouse=make_warehouse(org_id="org-b"), trino_cell_id="registered:pool-a", enabled=True
    )
    WarehouseTrino.objects.create(
        warehouse=make_warehouse(org_id="org-a"), trino_cell_id="registered:pool-a"
    )
    WarehouseTrino.objects.create(
        warehouse=make_warehouse(org_id="org-c"), trino_cell_id="registered:pool-b"
    )
    body = selectors.org_rows(two_pools, "pool-a")
    assert body["cell"] == "pool-a"
    assert [o["org_id"] for o in body["orgs"]] == ["org-a", "org-b"]
    assert body["orgs"][1]["enabled"] is True


@pytest.mark.django_db
def test_instances_non_terminal_sorted_and_unknown_pool(two_pools):
    with pytest.raises(PlacementError) as info:
        selectors.instances(two_pools, "pool-a")
    assert (info.value.status, info.value.message) == (404, "unknown shared Trino pool")
    pool = TrinoPool.objects.create(pool_id="registered:pool-a", public_id="pool-a")
    TrinoPoolInstance.objects.create(instance_id="cell-000000bb", pool=pool, phase="SERVING")
    TrinoPoolInstance.objects.create(
        instance_id="cell-000000aa",
        pool=pool,
        phase="SUSPECT",
        node_replacement_evidence={"node": "n1"},
    )
    TrinoPoolInstance.objects.create(instance_id="cell-000000cc", pool=pool, phase="RETIRED")
    body = selectors.instances(two_pools, "pool-a")
    assert [i["instance_id"] for i in body["instances"]] == ["cell-000000aa", "cell-000000bb"]
    assert body["instances"][0]["node_replacement"] == {"node": "n1"}
    assert "node_replacement" not in body["instances"][1]
    TrinoPool.objects.filter(pk="registered:pool-a").update(api_mode="legacy")
    with pytest.raises(PlacementError):
        selectors.instances(two_pools, "pool-a")
