"""Org reconcile and failure recording (spec trino-pools §4.10, §4.9; safeguards 14, 15, 17,
18, 40, 42 (reconcile part), 43, 46) on the real config store and a real catalog-store database."""

# The fixtures imported from tests.trino.catalog_doubles are parameters of the tests.
# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection

from duckgres_admin.models import TrinoPoolPublication, Warehouse, WarehouseTrino
from tests.trino.catalog_doubles import (  # noqa: F401
    Pools,
    catalogs,
    commit_drop_proxy,
    dark_after_write_proxy,
    journal,
    pool_revision,
    pools,
    settings_for,
    trino_row,
    trino_row_json,
    whole_store,
)
from trino_pools import authority, catalog_writer, placement
from trino_pools.authority import Authority
from trino_pools.catalogs import catalog_name, payload_hash
from trino_pools.reconcile import (
    READY_RETRYING,
    REVOKED,
    UNREADABLE,
    WAITING_PUBLISH,
    reconcile_org,
    reconcile_orgs,
    remove_orphans,
)

POOL_A = "registered:pool-a"
POOL_B = "registered:pool-b"


def _store_sql(pools: Pools, sql: str) -> None:
    with psycopg.connect(
        pools.store.dsn, autocommit=True, options="-c search_path=trino_catalogs"
    ) as c:
        c.execute(sql)


# A catalog-store trigger that fails the statement: with a plain error, or by outliving the
# writer's statement_timeout (a real deadline: PostgreSQL cancels the statement).
REFUSE_WITH = {
    "error": "RAISE EXCEPTION 'catalog store refuses writes';",
    "timeout": "PERFORM pg_sleep(30);",
}
REFUSAL_TEXT = {
    "error": "catalog store refuses writes",
    "timeout": "canceling statement due to statement timeout",
}


def _refuse(pools: Pools, how: str, event: str) -> None:
    """Make ``event`` (``INSERT`` or ``UPDATE``) on ``trino_catalogs`` fail as ``how`` says."""
    _store_sql(
        pools,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"{REFUSE_WITH[how]} RETURN NEW; END $$; "
        f"CREATE TRIGGER refuse BEFORE {event} ON trino_catalogs "
        "FOR EACH ROW EXECUTE FUNCTION refuse()",
    )


@pytest.fixture
def short_statements(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's statement_timeout lowered from 3 s to 400 ms (a test of 30 s sleeps
    would otherwise wait 3 s per statement; the mechanism is the same)."""
    monkeypatch.setattr(catalog_writer, "STATEMENT_TIMEOUT_MS", 400)


def _ready_with_a_changed_binding(
    pools: Pools,
) -> tuple[Warehouse, WarehouseTrino, tuple[Any, ...]]:
    """A published, ready org whose warehouse then moved to another shard: the next reconcile
    must alter its catalog. Returns the warehouse, its ready row and its published catalog."""
    pools.lead("pool-a")
    wh = pools.warehouse("acme")
    assert reconcile_org(wh.org_id) == "ready"
    ready = trino_row(wh.org_id)
    published = catalogs(pools.store)["org_acme"]
    Warehouse.objects.filter(pk=wh.pk).update(metadata_store_host="meta-2.example.internal")
    return wh, ready, published


def _assert_still_ready(org_id: str, ready: WarehouseTrino, error: str) -> None:
    row = trino_row(org_id)
    assert row.state == "ready"
    assert row.ready_at == ready.ready_at  # the ready stamp of the publication still serving
    assert row.failed_at is not None
    assert error in row.status_message
    assert row.catalog_name == "org_acme"


def _assert_retried_by_the_sweep(pools: Pools, org_id: str) -> None:
    assert reconcile_orgs() == 1
    row = trino_row(org_id)
    assert (row.state, row.status_message, row.failed_at) == ("ready", "", None)
    stored = catalogs(pools.store)["org_acme"]
    assert stored[3]["properties"]["metadata.host"] == "meta-2.example.internal"
    assert pool_revision() == stored[1]


class TestHappyPath:
    def test_pending_org_is_published_checkpointed_and_ready(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("Acme-WH")
        assert reconcile_org(wh.org_id) == "ready"
        row = trino_row(wh.org_id)
        assert (row.state, row.status_message, row.catalog_name) == ("ready", "", "org_acme_wh")
        assert row.ready_at is not None
        assert row.failed_at is None
        stored = catalogs(pools.store)["org_acme_wh"]
        assert stored[3]["properties"]["metadata.host"] == "meta-1.example.internal"
        assert pool_revision() == stored[1] == 1
        # An unchanged org publishes nothing and does not rewrite its row.
        before = trino_row_json(wh.org_id)
        assert reconcile_org(wh.org_id) == "ready"
        assert trino_row_json(wh.org_id) == before
        assert len(journal(pools.store)) == 1

    def test_sweep_covers_enabled_orgs_of_pools_with_a_writer(self, pools):
        pools.lead("pool-a")
        a = pools.warehouse("wh_one")
        b = pools.warehouse("wh_two", pool="pool-b")  # no writer for pool-b here
        assert reconcile_orgs() == 1
        assert trino_row(a.org_id).state == "ready"
        assert trino_row(b.org_id).state == "pending"

    def test_disable_removes_the_catalog_then_clears_the_name(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        reconcile_org(wh.org_id)
        WarehouseTrino.objects.filter(pk=wh.org_id).update(enabled=False, state="pending")
        assert reconcile_org(wh.org_id) == "removed"
        assert catalogs(pools.store) == {}
        assert trino_row(wh.org_id).catalog_name == ""
        assert pool_revision() == 2
        assert [r[2] for r in journal(pools.store)] == ["ADD_OR_REPLACE", "REMOVE"]
        assert reconcile_org(wh.org_id) == "disabled"

    def test_tenant_admission_gate(self, pools, tmp_path):
        pools.use(settings_for(tmp_path, pools.store.dsn, admission=True, name="adm.json"))
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        assert reconcile_org(wh.org_id) == "provisioning"
        row = trino_row(wh.org_id)
        assert (row.state, row.status_message) == ("provisioning", WAITING_PUBLISH)
        pub = TrinoPoolPublication.objects.create(
            pool_id=POOL_A, org_id=wh.org_id, state="admitting"
        )
        reconcile_org(wh.org_id)
        assert trino_row(wh.org_id).status_message == (
            "waiting for the pool to admit this warehouse: admitting"
        )
        TrinoPoolPublication.objects.filter(pool_id=POOL_A, org_id=wh.org_id).update(
            admitted_target_revision=1, state="admitted"
        )
        assert reconcile_org(wh.org_id) == "ready"
        # A newer attempt while admitted once: stays ready.
        TrinoPoolPublication.objects.filter(pool_id=POOL_A, org_id=wh.org_id).update(
            state="admitting"
        )
        assert reconcile_org(wh.org_id) == "ready"
        TrinoPoolPublication.objects.filter(pool_id=POOL_A, org_id=wh.org_id).update(
            state="revoked"
        )
        assert reconcile_org(wh.org_id) == "provisioning"
        assert trino_row(wh.org_id).status_message == REVOKED
        del pub

    def test_unreadable_publication_state(self, pools, tmp_path):
        pools.use(settings_for(tmp_path, pools.store.dsn, admission=True, name="adm2.json"))
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE duckgres_trino_pool_publications RENAME TO catalogs_test_moved"
            )
        try:
            assert reconcile_org(wh.org_id) == "provisioning"
        finally:
            with connection.cursor() as cursor:
                cursor.execute(
                    "ALTER TABLE catalogs_test_moved RENAME TO duckgres_trino_pool_publications"
                )
        assert trino_row(wh.org_id).status_message == UNREADABLE


class TestFailures:
    @pytest.mark.safeguard("trino-14")
    def test_a_non_leader_leaves_every_row_byte_identical(self, pools):
        # Rows of every kind a reconcile handles: pending, failed, ready, disabled with a catalog.
        pending = pools.warehouse("wh_pending")
        failed = pools.warehouse("wh_failed")
        WarehouseTrino.objects.filter(pk=failed.org_id).update(
            state="failed", status_message="earlier", failed_at="2026-01-01T00:00:00Z"
        )
        ready = pools.warehouse("wh_ready")
        WarehouseTrino.objects.filter(pk=ready.org_id).update(
            state="ready", ready_at="2026-01-01T00:00:00Z", catalog_name="org_wh_ready"
        )
        disabled = pools.warehouse("wh_disabled", enabled=False)
        WarehouseTrino.objects.filter(pk=disabled.org_id).update(catalog_name="org_wh_disabled")
        orgs = [pending.org_id, failed.org_id, ready.org_id, disabled.org_id]
        # Non-leader; leader before its claim (authority but no writer); stale writer.
        pools.seed("pool-a")
        auth = authority.acquire(POOL_A, "elsewhere.0000000000000009")
        stale = catalog_writer.CatalogWriter(
            pools.store.dsn, "trino_catalogs", POOL_A, auth.epoch - 1, auth.owner
        )
        for setup in ("none", "authority only", "stale writer"):
            if setup == "authority only":
                authority.HOLDER.install(auth)
            if setup == "stale writer":
                catalog_writer.install(POOL_A, stale)
            before = [trino_row_json(org) for org in orgs]
            store_before = whole_store(pools.store)
            for org in orgs:
                assert reconcile_org(org) == "not_this_replica", (setup, org)
            assert reconcile_orgs() == 0
            assert [trino_row_json(org) for org in orgs] == before, setup
            assert whole_store(pools.store) == store_before

    @pytest.mark.safeguard("trino-15")
    @pytest.mark.parametrize("how", ["error", "timeout"])
    def test_a_publication_failure_is_recorded_and_a_later_success_clears_it(
        self, pools, short_statements, how
    ):
        """A plain error and a deadline (the server cancels the write at statement_timeout)
        take the same recovery path."""
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        _refuse(pools, how, "INSERT")
        assert reconcile_org(wh.org_id) == "failed"
        row = trino_row(wh.org_id)
        assert row.state == "failed"
        assert row.failed_at is not None
        assert REFUSAL_TEXT[how] in row.status_message
        assert pools.store.database not in row.status_message
        assert catalogs(pools.store) == {}
        assert journal(pools.store) == []
        _store_sql(pools, "DROP TRIGGER refuse ON trino_catalogs")
        assert reconcile_org(wh.org_id) == "ready"
        row = trino_row(wh.org_id)
        assert (row.state, row.status_message, row.failed_at) == ("ready", "", None)
        assert row.ready_at is not None

    @pytest.mark.safeguard("trino-46")
    @pytest.mark.parametrize("how", ["error", "timeout"])
    def test_a_failed_alter_keeps_a_ready_org_ready_and_the_sweep_retries(
        self, pools, short_statements, how
    ):
        wh, ready, published = _ready_with_a_changed_binding(pools)
        _refuse(pools, how, "UPDATE")
        assert reconcile_org(wh.org_id) == READY_RETRYING
        _assert_still_ready(wh.org_id, ready, REFUSAL_TEXT[how])
        assert pools.store.database not in trino_row(wh.org_id).status_message
        assert catalogs(pools.store)["org_acme"] == published  # the old catalog still serves
        assert pool_revision() == published[1]
        # Still failing: the sweep retries and the org stays ready.
        assert reconcile_orgs() == 1
        _assert_still_ready(wh.org_id, ready, REFUSAL_TEXT[how])
        _store_sql(pools, "DROP TRIGGER refuse ON trino_catalogs")
        _assert_retried_by_the_sweep(pools, wh.org_id)

    @pytest.mark.safeguard("trino-46")
    def test_a_read_back_that_differs_keeps_a_ready_org_ready(self, pools):
        wh, ready, _published = _ready_with_a_changed_binding(pools)
        # The write commits, but the store keeps another payload than the one rendered.
        _store_sql(
            pools,
            "CREATE FUNCTION tamper() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "NEW.payload_hash := 'tampered'; RETURN NEW; END $$; "
            "CREATE TRIGGER tamper BEFORE UPDATE ON trino_catalogs "
            "FOR EACH ROW EXECUTE FUNCTION tamper()",
        )
        assert reconcile_org(wh.org_id) == READY_RETRYING
        _assert_still_ready(
            wh.org_id,
            ready,
            "catalog org_acme on Trino pool pool-a does not hold the rendered definition",
        )
        assert catalogs(pools.store)["org_acme"][0] == "tampered"
        _store_sql(pools, "DROP TRIGGER tamper ON trino_catalogs")
        _assert_retried_by_the_sweep(pools, wh.org_id)

    @pytest.mark.safeguard("trino-46")
    def test_a_read_back_lost_after_the_write_keeps_a_ready_org_ready(
        self, pools, dark_after_write_proxy, tmp_path
    ):
        proxy = dark_after_write_proxy
        pools.use(settings_for(tmp_path, proxy.dsn(pools.store.database), name="dark.json"))
        wh, ready, published = _ready_with_a_changed_binding(pools)
        proxy.armed = True
        assert reconcile_org(wh.org_id) == READY_RETRYING
        assert proxy.cut == 1
        _assert_still_ready(wh.org_id, ready, "the Trino catalog store (describe for")
        # The alter itself committed; its revision was never checkpointed.
        stored = catalogs(pools.store)["org_acme"]
        assert stored[3]["properties"]["metadata.host"] == "meta-2.example.internal"
        assert pool_revision() == published[1] < stored[1]
        proxy.dark = False
        _assert_retried_by_the_sweep(pools, wh.org_id)
        assert len(journal(pools.store)) == 2  # the retry republished nothing

    @pytest.mark.safeguard("trino-46")
    def test_a_failed_checkpoint_keeps_a_ready_org_ready(self, pools):
        wh, ready, published = _ready_with_a_changed_binding(pools)
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE FUNCTION catalogs_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'checkpoint refused'; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER catalogs_test_refuse BEFORE UPDATE OF publication_revision ON "
                "duckgres_trino_pools FOR EACH ROW EXECUTE FUNCTION catalogs_test_refuse()"
            )
        assert reconcile_org(wh.org_id) == READY_RETRYING
        _assert_still_ready(wh.org_id, ready, "checkpoint refused")
        assert pool_revision() == published[1]
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER catalogs_test_refuse ON duckgres_trino_pools")
        _assert_retried_by_the_sweep(pools, wh.org_id)
        assert len(journal(pools.store)) == 2  # repaired without republishing

    @pytest.mark.safeguard("trino-46")
    def test_a_ready_org_that_cannot_be_rendered_is_failed_not_retrying(self, pools):
        """The boundary of the rule: a problem of the org itself is no publisher blip."""
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        assert reconcile_org(wh.org_id) == "ready"
        Warehouse.objects.filter(pk=wh.pk).update(data_bucket="")
        assert reconcile_org(wh.org_id) == "failed"
        row = trino_row(wh.org_id)
        assert (row.state, row.status_message) == (
            "failed",
            f"warehouse {wh.org_id} has no data bucket",
        )

    def test_a_long_error_is_clipped(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        _store_sql(
            pools,
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION '%', repeat('x', 3000); END $$; "
            "CREATE TRIGGER refuse BEFORE INSERT ON trino_catalogs "
            "FOR EACH ROW EXECUTE FUNCTION refuse()",
        )
        assert reconcile_org(wh.org_id) == "failed"
        message = trino_row(wh.org_id).status_message
        assert len(message) == 1024
        assert message.endswith("...")

    @pytest.mark.safeguard("trino-18")
    def test_a_failed_checkpoint_keeps_the_org_not_ready_until_the_next_pass(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE FUNCTION catalogs_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'checkpoint refused'; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER catalogs_test_refuse BEFORE UPDATE OF publication_revision ON "
                "duckgres_trino_pools FOR EACH ROW EXECUTE FUNCTION catalogs_test_refuse()"
            )
        assert reconcile_org(wh.org_id) == "failed"
        row = trino_row(wh.org_id)
        assert row.state == "failed"
        assert row.ready_at is None
        assert "checkpoint refused" in row.status_message
        assert "org_acme" in catalogs(pools.store)  # published, but not evidenced
        assert pool_revision() == 0
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER catalogs_test_refuse ON duckgres_trino_pools")
        assert reconcile_org(wh.org_id) == "ready"
        assert pool_revision() == 1
        assert len(journal(pools.store)) == 1  # repaired without republishing

    @pytest.mark.safeguard("trino-17")
    def test_a_lost_commit_during_publication_still_reaches_ready(
        self, pools, commit_drop_proxy, tmp_path
    ):
        pools.use(
            settings_for(tmp_path, commit_drop_proxy.dsn(pools.store.database), name="p.json")
        )
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        commit_drop_proxy.armed = True
        assert reconcile_org(wh.org_id) == "ready"
        assert commit_drop_proxy.dropped == 1
        assert len(journal(pools.store)) == 1
        assert pool_revision() == 1

    def test_a_fenced_writer_leaves_the_row_and_releases_the_pool(self, pools):
        auth, _writer = pools.lead("pool-a")
        wh = pools.warehouse("acme")
        catalog_writer.CatalogWriter(
            pools.store.dsn, "trino_catalogs", POOL_A, auth.epoch + 1, "other.0000000000000001"
        ).takeover()
        before = trino_row_json(wh.org_id)
        assert reconcile_org(wh.org_id) == "fenced"
        assert trino_row_json(wh.org_id) == before
        assert authority.HOLDER.get(POOL_A) is None
        assert catalog_writer.installed(POOL_A) is None

    def test_an_unrenderable_warehouse_fails_with_the_reason(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        Warehouse.objects.filter(pk=wh.pk).update(data_bucket="")
        assert reconcile_org(wh.org_id) == "failed"
        assert trino_row(wh.org_id).status_message == f"warehouse {wh.org_id} has no data bucket"


class TestBindings:
    @pytest.mark.safeguard("trino-40")
    def test_a_binding_change_is_republished_on_the_next_reconcile(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        assert reconcile_org(wh.org_id) == "ready"
        first = catalogs(pools.store)["org_acme"]
        # A finished reshard: the binding points at the new shard.
        Warehouse.objects.filter(pk=wh.pk).update(
            metadata_store_host="meta-2.example.internal", metadata_store_port=6432
        )
        assert reconcile_org(wh.org_id) == "ready"
        second = catalogs(pools.store)["org_acme"]
        assert second[0] != first[0]
        assert second[1] == first[1] + 1
        assert second[3]["properties"]["metadata.host"] == "meta-2.example.internal"
        assert pool_revision() == second[1]

    @pytest.mark.safeguard("trino-42")
    def test_a_resharding_warehouse_is_neither_published_nor_written(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme", state="resharding")
        ready = pools.warehouse("acme_ready")
        reconcile_org(ready.org_id)
        Warehouse.objects.filter(pk=ready.pk).update(
            state="resharding", metadata_store_host="meta-9.example.internal"
        )
        rows = [trino_row_json(wh.org_id), trino_row_json(ready.org_id)]
        store = whole_store(pools.store)
        revision = pool_revision()
        assert reconcile_org(wh.org_id) == "resharding"
        assert reconcile_org(ready.org_id) == "resharding"
        reconcile_orgs()
        assert [trino_row_json(wh.org_id), trino_row_json(ready.org_id)] == rows
        assert whole_store(pools.store) == store
        assert pool_revision() == revision

    def test_a_renamed_database_moves_the_catalog(self, pools):
        pools.lead("pool-a")
        wh = pools.warehouse("acme")
        reconcile_org(wh.org_id)
        Warehouse.objects.filter(pk=wh.pk).update(database_name="acme2")
        assert reconcile_org(wh.org_id) == "ready"
        assert set(catalogs(pools.store)) == {"org_acme2"}
        assert trino_row(wh.org_id).catalog_name == "org_acme2"

    def test_unconfigured_and_unassigned_owners_are_skipped(self, pools):
        pools.lead("pool-a")
        gone = pools.warehouse("acme", pool="pool-z")
        unassigned = pools.warehouse("acme2")
        WarehouseTrino.objects.filter(pk=unassigned.org_id).update(trino_cell_id="")
        before = [trino_row_json(gone.org_id), trino_row_json(unassigned.org_id)]
        assert reconcile_org(gone.org_id) == "unconfigured"
        assert reconcile_org(unassigned.org_id) == "unconfigured"
        assert [trino_row_json(gone.org_id), trino_row_json(unassigned.org_id)] == before
        assert whole_store(pools.store)[1:] == [[], []]


class TestOrphans:
    def test_a_moved_or_deleted_org_loses_its_catalog_in_the_old_pool(self, pools):
        pools.lead("pool-a")
        pools.lead("pool-b")
        moved = pools.warehouse("moved")
        deleted = pools.warehouse("deleted")
        stays = pools.warehouse("stays")
        disabled = pools.warehouse("disabled")
        for wh in (moved, deleted, stays, disabled):
            assert reconcile_org(wh.org_id) == "ready"
        with psycopg.connect(pools.store.dsn, options="-c search_path=trino_catalogs") as conn:
            conn.execute(
                "INSERT INTO trino_catalogs VALUES (%s, 'foreign', '{}'::jsonb, 1, 'h', 1)",
                [POOL_A],
            )
        placement.move_cell(moved.org_id, "pool-a", "pool-b", pools.settings)
        Warehouse.objects.filter(pk=deleted.pk).delete()
        WarehouseTrino.objects.filter(pk=disabled.org_id).update(enabled=False)
        assert remove_orphans(POOL_A) == ["org_deleted", "org_moved"]
        assert set(catalogs(pools.store, POOL_A)) == {"foreign", "org_disabled", "org_stays"}
        assert pool_revision() == journal(pools.store)[-1][0]
        reconcile_orgs()
        assert set(catalogs(pools.store, POOL_A)) == {"foreign", "org_stays"}
        assert set(catalogs(pools.store, POOL_B)) == {"org_moved"}
        assert trino_row(moved.org_id).state == "ready"
        assert remove_orphans(POOL_A) == []

    def test_a_non_leader_removes_nothing(self, pools):
        wh = pools.warehouse("acme", pool="pool-b")
        assert remove_orphans(POOL_A) == []
        assert trino_row(wh.org_id).state == "pending"


class TestNames:
    @pytest.mark.safeguard("trino-43")
    def test_two_orgs_with_one_catalog_name_in_one_pool(self, pools):
        pools.lead("pool-a")
        first = pools.warehouse("acme-wh")
        assert reconcile_org(first.org_id) == "ready"
        held = catalogs(pools.store)["org_acme_wh"]
        second = pools.warehouse("acme_wh")
        assert reconcile_org(second.org_id) == "failed"
        row = trino_row(second.org_id)
        assert row.state == "failed"
        assert row.catalog_name == ""
        assert row.status_message == (
            "catalog name org_acme_wh on Trino pool pool-a is already used by warehouse "
            f"{first.org_id}; rename one database_name or move one warehouse"
        )
        assert catalogs(pools.store)["org_acme_wh"] == held  # the first org's catalog untouched
        assert held[3]["org_id"] == first.org_id
        assert trino_row(first.org_id).state == "ready"
        assert len(journal(pools.store)) == 1

    @pytest.mark.safeguard("trino-43")
    def test_the_same_name_in_two_pools_publishes_in_both(self, pools):
        pools.lead("pool-a")
        pools.lead("pool-b")
        a = pools.warehouse("acme-wh", pool="pool-a")
        b = pools.warehouse("acme_wh", pool="pool-b")
        assert reconcile_org(a.org_id) == "ready"
        assert reconcile_org(b.org_id) == "ready"
        assert set(catalogs(pools.store, POOL_A)) == {"org_acme_wh"}
        assert set(catalogs(pools.store, POOL_B)) == {"org_acme_wh"}
        assert catalogs(pools.store, POOL_B)["org_acme_wh"][3]["org_id"] == b.org_id

    def test_the_claimed_name_follows_the_rule(self, pools):
        pools.lead("pool-a")
        long_name = "Tenant-" + "x" * 93
        wh = pools.warehouse(long_name)
        assert reconcile_org(wh.org_id) == "ready"
        name = trino_row(wh.org_id).catalog_name
        assert name == catalog_name(long_name)
        assert len(name.encode()) == 63
        assert catalogs(pools.store)[name][0] == payload_hash(catalogs(pools.store)[name][3])


def test_authority_type_is_the_shared_one():
    assert Authority("registered:pool-a", "o", 1).public_id == "pool-a"
