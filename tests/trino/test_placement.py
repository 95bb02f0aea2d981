"""Placement and enablement services (spec trino-pools §4.2, safeguards 7 and 42) on real
PostgreSQL, including the races."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from duckgres_admin.models import Warehouse, WarehouseTrino
from tests.trino.helpers import cell, full_env, registry, write
from trino_pools import placement
from trino_pools.config import load
from trino_pools.placement import PlacementError


@pytest.fixture
def two_pools(tmp_path):
    cells = write(tmp_path, "two.json", registry(cell("pool-a"), cell("pool-b")))
    return load(
        full_env(tmp_path, DUCKGRES_TRINO_CELLS_FILE=cells), service_account_token="/nonexistent"
    )


@pytest.fixture
def no_default(tmp_path):
    cells = write(tmp_path, "two-nd.json", registry(cell("pool-a"), cell("pool-b")))
    return load(
        full_env(tmp_path, DUCKGRES_TRINO_CELLS_FILE=cells, DUCKGRES_TRINO_DEFAULT_CELL=None),
        service_account_token="/nonexistent",
    )


def _maybe_row(org: str) -> WarehouseTrino | None:
    return WarehouseTrino.objects.filter(warehouse__org_id=org).first()


def _row(org: str) -> WarehouseTrino:
    row = _maybe_row(org)
    assert row is not None
    return row


def _enable(org: str, settings, tier: str = "") -> placement.TrinoPlacement:
    with transaction.atomic():
        return placement.enable_trino(org, settings, tier=tier)


def _refusal(fn, *args, **kwargs) -> PlacementError:
    with pytest.raises(PlacementError) as info:
        fn(*args, **kwargs)
    return info.value


def test_the_lock_key_is_the_reshard_key():
    from duckgres_admin.platform.orglock import org_lock_key

    for org in ("org-a", "acme", "Ünïcode-org", "x" * 200, ""):
        assert placement.org_lock_key(org) == org_lock_key(org)


@pytest.mark.django_db
class TestSelection:
    def test_select_then_idempotent_repeat(self, make_warehouse, two_pools):
        wh = make_warehouse()
        result = placement.select_cell(wh.org_id, "pool-b", two_pools)
        assert result.owner == "registered:pool-b"
        assert not result.enabled
        assert result.state == "pending"
        assert placement.select_cell(wh.org_id, "pool-b", two_pools).owner == "registered:pool-b"

    def test_refusals(self, make_warehouse, two_pools):
        wh = make_warehouse()
        assert _refusal(placement.select_cell, "missing-org", "pool-a", two_pools).body() == {
            "error": "managed warehouse not found"
        }
        for bad in ("", "pool-z", "registered:pool-a"):
            err = _refusal(placement.select_cell, wh.org_id, bad, two_pools)
            assert (err.status, err.body()) == (
                400,
                {"error": "a configured Trino cell is required"},
            )
        placement.select_cell(wh.org_id, "pool-a", two_pools)
        err = _refusal(placement.select_cell, wh.org_id, "pool-b", two_pools)
        assert err.status == 409
        assert err.body() == {
            "error": "trino cell selection is only available before initial enablement; "
            "existing assignments cannot change"
        }

    @pytest.mark.parametrize(
        "fields",
        [
            {"enabled": True},
            {"state": "provisioning"},
            {"state": "failed"},
        ],
    )
    def test_closed_once_enabled_or_past_pending(self, make_warehouse, two_pools, fields):
        wh = make_warehouse()
        WarehouseTrino.objects.create(warehouse=wh, **fields)
        err = _refusal(placement.select_cell, wh.org_id, "pool-a", two_pools)
        assert err.status == 409
        assert _row(wh.org_id).trino_cell_id == ""

    def test_closed_when_stamped(self, make_warehouse, two_pools):
        wh = make_warehouse()
        WarehouseTrino.objects.create(warehouse=wh)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE duckgres_managed_warehouse_trino SET ready_at = now() WHERE org_id = %s",
                [wh.org_id],
            )
        assert _refusal(placement.select_cell, wh.org_id, "pool-a", two_pools).status == 409


@pytest.mark.django_db
class TestEnablement:
    @pytest.mark.safeguard("trino-7")
    def test_default_placement_is_written_with_the_enable(self, make_warehouse, two_pools):
        wh = make_warehouse()
        result = _enable(wh.org_id, two_pools, tier="growth")
        assert (result.enabled, result.owner, result.tier) == (True, "registered:pool-a", "growth")
        row = _row(wh.org_id)
        assert row.backend_selected is True
        assert row.state == "pending"

    def test_an_existing_owner_is_never_overwritten(self, make_warehouse, two_pools):
        wh = make_warehouse()
        placement.select_cell(wh.org_id, "pool-b", two_pools)
        assert _enable(wh.org_id, two_pools).owner == "registered:pool-b"

    def test_reenabling_a_ready_row_keeps_state_and_stamps(self, make_warehouse, two_pools):
        wh = make_warehouse()
        _enable(wh.org_id, two_pools)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE duckgres_managed_warehouse_trino SET state = 'ready', ready_at = now(), "
                "status_message = 'ok', backend_selected = false WHERE org_id = %s",
                [wh.org_id],
            )
        ready_at = _row(wh.org_id).ready_at
        result = _enable(wh.org_id, two_pools, tier="scale")
        row = _row(wh.org_id)
        assert (result.state, row.ready_at, row.status_message) == ("ready", ready_at, "ok")
        assert row.tier == "scale"
        assert row.backend_selected is True

    @pytest.mark.safeguard("trino-7")
    def test_changing_the_default_moves_nobody(self, make_warehouse, two_pools, tmp_path):
        wh = make_warehouse()
        _enable(wh.org_id, two_pools)
        cells = write(tmp_path, "two-b.json", registry(cell("pool-a"), cell("pool-b")))
        default_b = load(
            full_env(
                tmp_path, DUCKGRES_TRINO_CELLS_FILE=cells, DUCKGRES_TRINO_DEFAULT_CELL="pool-b"
            ),
            service_account_token="/nonexistent",
        )
        assert _enable(wh.org_id, default_b).owner == "registered:pool-a"

    def test_no_owner_and_no_default(self, make_warehouse, no_default):
        wh = make_warehouse()
        err = _refusal(_enable, wh.org_id, no_default)
        assert (err.status, err.body()) == (
            409,
            {"error": "select an initial Trino cell before enabling Trino"},
        )
        assert _maybe_row(wh.org_id) is None
        placement.select_cell(wh.org_id, "pool-a", no_default)
        assert _enable(wh.org_id, no_default).owner == "registered:pool-a"

    @pytest.mark.parametrize(
        "owner", ["legacy", "cell-001", "registered:unknown", "registered:removed-pool"]
    )
    def test_an_unconfigured_owner_fails_closed(self, make_warehouse, two_pools, owner):
        wh = make_warehouse()
        WarehouseTrino.objects.create(warehouse=wh, trino_cell_id=owner)
        err = _refusal(_enable, wh.org_id, two_pools)
        assert (err.status, err.body()) == (
            409,
            {"error": "the assigned Trino cell is not configured"},
        )
        row = _row(wh.org_id)
        assert (row.enabled, row.trino_cell_id) == (False, owner)
        err = _refusal(placement.describe, wh.org_id, two_pools)
        assert err.body() == {
            "error": "the assigned Trino cell is not configured",
            "assigned": True,
        }

    @pytest.mark.safeguard("trino-42")
    @pytest.mark.parametrize("state", ["pending", "resharding", "provisioning", "failed"])
    def test_only_a_ready_warehouse_can_be_enabled(self, make_warehouse, two_pools, state):
        wh = make_warehouse(state=state)
        placement.select_cell(wh.org_id, "pool-a", two_pools)
        before = list(WarehouseTrino.objects.filter(warehouse__org_id=wh.org_id).values())
        err = _refusal(_enable, wh.org_id, two_pools)
        assert (err.status, err.body()) == (
            409,
            {
                "code": "warehouse_not_ready",
                "error": f"Trino can only be enabled on a ready warehouse (currently {state})",
            },
        )
        assert list(WarehouseTrino.objects.filter(warehouse__org_id=wh.org_id).values()) == before

    def test_missing_warehouse_and_bad_tier(self, two_pools, make_warehouse):
        assert _refusal(_enable, "no-such-org", two_pools).status == 404
        wh = make_warehouse()
        err = _refusal(_enable, wh.org_id, two_pools, tier="platinum")
        assert err.status == 400

    @pytest.mark.safeguard("trino-7")
    def test_a_failed_outer_transaction_leaves_no_row_and_no_owner(self, make_warehouse, two_pools):
        wh = make_warehouse()
        seen = []

        def provisioning_request() -> None:
            with transaction.atomic():
                placement.enable_trino(wh.org_id, two_pools)
                seen.append(_row(wh.org_id).trino_cell_id)
                raise RuntimeError("the provisioning request fails later")

        with pytest.raises(RuntimeError, match="fails later"):
            provisioning_request()
        assert seen == ["registered:pool-a"]
        assert _maybe_row(wh.org_id) is None

    def test_a_refusal_inside_the_callers_transaction_undoes_only_itself(
        self, make_warehouse, no_default
    ):
        wh = make_warehouse()
        with transaction.atomic():
            Warehouse.objects.filter(pk=wh.pk).update(database_name="kept")
            with pytest.raises(PlacementError):
                placement.enable_trino(wh.org_id, no_default)
        assert Warehouse.objects.get(pk=wh.pk).database_name == "kept"


@pytest.mark.django_db
class TestDisableMoveDescribe:
    def test_disable_keeps_the_owner_and_resets_state(self, make_warehouse, two_pools):
        wh = make_warehouse()
        _enable(wh.org_id, two_pools)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE duckgres_managed_warehouse_trino SET state = 'failed', failed_at = now(), "
                "status_message = 'boom' WHERE org_id = %s",
                [wh.org_id],
            )
        result = placement.disable_trino(wh.org_id)
        assert result is not None
        row = _row(wh.org_id)
        assert (row.enabled, row.state, row.status_message, row.failed_at) == (
            False,
            "pending",
            "",
            None,
        )
        assert row.trino_cell_id == "registered:pool-a"
        assert placement.disable_trino("no-such-org") is None

    def test_move_by_compare_and_swap(self, make_warehouse, two_pools):
        wh = make_warehouse()
        _enable(wh.org_id, two_pools)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE duckgres_managed_warehouse_trino SET state = 'ready', ready_at = now(), "
                "catalog_name = 'org_x', backend = 'hoglake', status_message = 'ok' "
                "WHERE org_id = %s",
                [wh.org_id],
            )
        moved = placement.move_cell(wh.org_id, "pool-a", "pool-b", two_pools)
        assert moved.owner == "registered:pool-b"
        row = _row(wh.org_id)
        assert (row.state, row.ready_at, row.failed_at, row.catalog_name, row.status_message) == (
            "pending",
            None,
            None,
            "",
            "",
        )
        assert (row.backend, row.enabled) == ("hoglake", True)
        # Repeating a completed move is a no-op.
        assert placement.move_cell(wh.org_id, "pool-a", "pool-b", two_pools).owner == (
            "registered:pool-b"
        )
        assert _refusal(placement.move_cell, wh.org_id, "pool-b", "pool-z", two_pools).status == 400

    def test_move_refuses_a_row_not_on_from(self, make_warehouse, two_pools):
        wh = make_warehouse()
        WarehouseTrino.objects.create(warehouse=wh, trino_cell_id="registered:gone")
        err = _refusal(placement.move_cell, wh.org_id, "pool-a", "pool-b", two_pools)
        assert (err.status, err.message) == (409, "the warehouse's Trino cell is not pool-a")
        assert _row(wh.org_id).trino_cell_id == "registered:gone"
        other = make_warehouse()
        err = _refusal(placement.move_cell, other.org_id, "pool-a", "pool-b", two_pools)
        assert err.status == 409
        assert _refusal(
            placement.move_cell, "no-such-org", "pool-a", "pool-b", two_pools
        ).status == (404)

    def test_describe_follows_the_persisted_owner(self, make_warehouse, two_pools):
        wh = make_warehouse()
        assert placement.describe(wh.org_id, two_pools) == {
            "cell": {},
            "enabled": False,
            "assigned": False,
            "available": False,
        }
        placement.select_cell(wh.org_id, "pool-b", two_pools)
        body = placement.describe(wh.org_id, two_pools)
        assert body["cell"]["id"] == "pool-b"
        assert body["assigned"] is True


def test_enable_must_run_inside_the_callers_transaction(
    transactional_db, make_warehouse, two_pools
):
    wh = make_warehouse()
    with pytest.raises(RuntimeError):
        placement.enable_trino(wh.org_id, two_pools)
    assert _maybe_row(wh.org_id) is None


def _race(workers: list[Callable[[], object]]) -> list[object]:
    barrier = threading.Barrier(len(workers))
    outcomes: list[object] = [None] * len(workers)

    def run(i: int, fn: Callable[[], object]) -> None:
        try:
            barrier.wait()
            outcomes[i] = fn()
        except PlacementError as exc:
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


@pytest.mark.safeguard("trino-7")
def test_twenty_concurrent_selections_and_default_enables_leave_one_preserved_owner(
    transactional_db, make_warehouse, two_pools
):
    for _round in range(3):
        wh = make_warehouse()
        org = wh.org_id
        workers: list[Callable[[], object]] = []
        for i in range(20):
            if i % 2:
                workers.append(functools.partial(placement.select_cell, org, "pool-b", two_pools))
            else:
                workers.append(functools.partial(_enable, org, two_pools))
        outcomes = _race(workers)
        owner = _row(org).trino_cell_id
        assert owner in ("registered:pool-a", "registered:pool-b")
        for outcome in outcomes:
            if isinstance(outcome, PlacementError):
                assert outcome.status == 409
                assert outcome.message == placement.SELECTION_CLOSED
            else:
                assert isinstance(outcome, placement.TrinoPlacement)
                assert outcome.owner == owner
        # Preserved afterwards: no path can claim the owned row.
        other = "pool-b" if owner == "registered:pool-a" else "pool-a"
        assert _refusal(placement.select_cell, org, other, two_pools).status == 409
        _enable(org, two_pools)
        assert _row(org).trino_cell_id == owner


def _reshard_block(org: str) -> str:
    """The reshard block transaction (reshard spec §4.4 A), with the reshard domain's own lock
    and Trino re-check: lock, re-check Trino, CAS ready → resharding."""
    from duckgres_admin.platform.orglock import lock_org
    from reshard.runner.steps.blocking import _trino_enabled

    with transaction.atomic():
        lock_org(org)
        if _trino_enabled(org):
            return "refused: Trino was enabled for this warehouse"
        moved = Warehouse.objects.filter(org_id=org, state="ready").update(state="resharding")
        return "blocked" if moved == 1 else "refused: warehouse is not ready"


@pytest.mark.safeguard("trino-42")
def test_enable_racing_a_reshard_block_exactly_one_wins(
    transactional_db, make_warehouse, two_pools
):
    winners = {"trino": 0, "reshard": 0}
    for _round in range(10):
        org = make_warehouse(state="ready").org_id
        placement.select_cell(org, "pool-a", two_pools)
        enabled_result, block_result = _race(
            [functools.partial(_enable, org, two_pools), functools.partial(_reshard_block, org)]
        )
        state = Warehouse.objects.get(org_id=org).state
        enabled = _row(org).enabled
        if isinstance(enabled_result, placement.TrinoPlacement):
            assert block_result == "refused: Trino was enabled for this warehouse"
            assert (state, enabled) == ("ready", True)
            winners["trino"] += 1
        else:
            assert isinstance(enabled_result, PlacementError)
            assert enabled_result.code == "warehouse_not_ready"
            assert block_result == "blocked"
            assert (state, enabled) == ("resharding", False)
            winners["reshard"] += 1
    assert sum(winners.values()) == 10
