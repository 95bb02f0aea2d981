"""The catalog-store writer, the catalog client registry and the revision watermark (spec
trino-pools §4.3, §4.9; safeguards 14, 16, 17, 18) against a real catalog-store database and
the real config store."""

# The fixtures imported from tests.trino.catalog_doubles are parameters of the tests.
# ruff: noqa: F811

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.trino.catalog_doubles import (  # noqa: F401
    OWNER,
    Pools,
    catalogs,
    commit_drop_proxy,
    journal,
    pool_revision,
    pools,
    settings_for,
    whole_store,
    writer_state,
)
from trino_pools import authority, catalog_writer
from trino_pools.authority import Authority, NotThisReplica, PoolConflict
from trino_pools.catalog_writer import (
    CatalogStoreError,
    CatalogWriter,
    IntentChanged,
    NodeInventoryUnavailable,
    Unavailable,
    WriterFenced,
    operation_id,
)
from trino_pools.catalogs import REMOVED_HASH, payload_hash

POOL = "registered:pool-a"
DEF_A = {"catalog": "org_a", "connector": "ducklake", "properties": {"x": "1"}}
DEF_B = {"catalog": "org_a", "connector": "ducklake", "properties": {"x": "2"}}
HASH_A = payload_hash(DEF_A)
HASH_B = payload_hash(DEF_B)


def _writer(pools: Pools, epoch: int, identity: str = OWNER, dsn: str | None = None):
    return CatalogWriter(dsn or pools.store.dsn, "trino_catalogs", POOL, epoch, identity)


class TestFencing:
    def test_takeover_by_a_higher_epoch_fences_the_old_writer(self, pools):
        old = _writer(pools, 1)
        assert old.takeover() == 0
        assert old.apply("org_a", DEF_A, HASH_A) == 1
        new = _writer(pools, 2, "other.0000000000000001")
        assert new.takeover() == 1
        before = whole_store(pools.store)
        with pytest.raises(WriterFenced):
            old.apply("org_a", DEF_B, HASH_B)
        with pytest.raises(WriterFenced):
            old.drop("org_a")
        with pytest.raises(WriterFenced):
            old.takeover()  # a lower epoch never takes the row back
        assert whole_store(pools.store) == before
        assert new.apply("org_a", DEF_B, HASH_B) == 2
        old.close()
        new.close()

    def test_equal_epoch_of_another_identity_is_refused(self, pools):
        first = _writer(pools, 5)
        first.takeover()
        assert first.takeover() == 0  # the same (epoch, identity) is idempotent
        with pytest.raises(WriterFenced):
            _writer(pools, 5, "other.0000000000000001").takeover()
        # apply needs epoch AND identity
        with pytest.raises(WriterFenced):
            _writer(pools, 5, "other.0000000000000001").apply("org_a", DEF_A, HASH_A)
        with pytest.raises(WriterFenced):
            _writer(pools, 4).apply("org_a", DEF_A, HASH_A)
        assert writer_state(pools.store) == (5, OWNER, 0, 0)
        first.close()

    def test_apply_without_a_writer_row_is_refused(self, pools):
        with pytest.raises(WriterFenced):
            _writer(pools, 1).apply("org_a", DEF_A, HASH_A)
        assert whole_store(pools.store) == [[], [], []]

    def test_seeding_counts_existing_rows_and_keeps_the_revision(self, pools):
        with psycopg.connect(pools.store.dsn, options="-c search_path=trino_catalogs") as conn:
            for n, name in enumerate(("org_x", "org_y"), start=1):
                conn.execute(
                    "INSERT INTO trino_catalogs VALUES (%s, %s, '{}'::jsonb, 1, 'h', %s)",
                    [POOL, name, n + 6],
                )
        writer = _writer(pools, 1)
        assert writer.takeover() == 8
        assert writer_state(pools.store) == (1, OWNER, 8, 2)
        assert writer.apply("org_a", DEF_A, HASH_A) == 9
        assert writer_state(pools.store) == (1, OWNER, 9, 3)
        assert writer.drop("org_x") == 10
        assert writer_state(pools.store)[3] == 2
        writer.close()


class TestApply:
    def test_write_replace_remove_journal(self, pools):
        writer = _writer(pools, 3)
        writer.takeover()
        assert writer.create("org_a", DEF_A, HASH_A) == 1
        assert writer.alter("org_a", DEF_B, HASH_B) == 2
        assert writer.list_catalogs() == {"org_a": HASH_B}
        assert writer.connectors() == {"org_a": "ducklake"}
        entry = writer.describe("org_a")
        assert entry is not None
        assert (entry.revision, entry.version) == (2, 2)
        assert writer.drop("org_a") == 3
        assert writer.drop("org_a") == 3  # nothing to remove: no new revision
        assert writer.describe("org_a") is None
        assert [(r[0], r[1], r[2], r[4], r[6]) for r in journal(pools.store)] == [
            (1, operation_id("org_a", 0, HASH_A), "ADD_OR_REPLACE", 1, 3),
            (2, operation_id("org_a", 1, HASH_B), "ADD_OR_REPLACE", 2, 3),
            (3, operation_id("org_a", 2, REMOVED_HASH), "REMOVE", 3, 3),
        ]
        assert writer_state(pools.store) == (3, OWNER, 3, 0)
        assert writer.revision() == 3
        with pytest.raises(NodeInventoryUnavailable):
            writer.nodes()
        writer.close()

    @pytest.mark.safeguard("trino-16")
    def test_create_drop_create_of_an_identical_catalog_publishes_three_times(self, pools):
        writer = _writer(pools, 1)
        writer.takeover()
        assert writer.apply("org_a", DEF_A, HASH_A) == 1
        assert writer.drop("org_a") == 2
        assert writer.apply("org_a", DEF_A, HASH_A) == 3  # not a replay of the first
        assert catalogs(pools.store)["org_a"][:3] == (HASH_A, 3, 3)
        ops = [r[1] for r in journal(pools.store)]
        assert len(ops) == len(set(ops)) == 3
        writer.close()

    def test_journal_hit_is_a_replay_or_intent_changed(self, pools):
        writer = _writer(pools, 1)
        writer.takeover()
        with psycopg.connect(pools.store.dsn, options="-c search_path=trino_catalogs") as conn:
            conn.execute(
                "INSERT INTO trino_catalog_journal (pool_key, revision, operation_id, operation, "
                "catalog_name, version, payload_hash, writer_epoch) "
                "VALUES (%s, 40, %s, 'ADD_OR_REPLACE', 'org_a', 1, %s, 1), "
                "(%s, 41, %s, 'ADD_OR_REPLACE', 'org_b', 1, 'another-hash', 1)",
                [
                    POOL,
                    operation_id("org_a", 0, HASH_A),
                    HASH_A,
                    POOL,
                    operation_id("org_b", 0, HASH_A),
                ],
            )
        assert writer.apply("org_a", DEF_A, HASH_A) == 40  # replay: its revision, no write
        with pytest.raises(IntentChanged):
            writer.apply("org_b", DEF_A, HASH_A)
        assert catalogs(pools.store) == {}
        assert writer_state(pools.store)[2] == 0
        writer.close()

    @pytest.mark.safeguard("trino-17")
    def test_a_lost_commit_is_resolved_by_intent(self, pools, commit_drop_proxy):
        writer = _writer(pools, 1, dsn=commit_drop_proxy.dsn(pools.store.database))
        writer.takeover()
        assert writer.apply("org_b", DEF_B, HASH_B) == 1
        commit_drop_proxy.armed = True
        assert writer.apply("org_a", DEF_A, HASH_A) == 2  # success reported
        assert commit_drop_proxy.dropped == 1  # the COMMIT's answer really was lost
        entries = [r for r in journal(pools.store) if r[3] == "org_a"]
        assert len(entries) == 1  # no duplicate journal entry
        assert writer_state(pools.store)[2] == 2
        assert writer.apply("org_a", DEF_B, HASH_B) == 3  # the writer reconnected
        writer.close()

    def test_a_lost_commit_that_did_not_apply_is_an_error(self, pools, commit_drop_proxy):
        writer = _writer(pools, 1, dsn=commit_drop_proxy.dsn(pools.store.database))
        writer.takeover()
        with psycopg.connect(pools.store.dsn, options="-c search_path=trino_catalogs") as conn:
            conn.execute(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'deferred refusal'; END $$"
            )
            conn.execute(
                "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON trino_catalog_journal "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
        commit_drop_proxy.armed = True
        with pytest.raises(CatalogStoreError) as info:
            writer.apply("org_a", DEF_A, HASH_A)
        assert "not in the journal" in str(info.value)
        assert journal(pools.store) == []
        writer.close()

    def test_a_held_writer_row_times_out_within_the_budget(self, pools):
        writer = _writer(pools, 1)
        writer.takeover()
        with psycopg.connect(pools.store.dsn, options="-c search_path=trino_catalogs") as conn:
            conn.execute("SELECT 1 FROM trino_catalog_writer_state FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(CatalogStoreError) as info:
                writer.apply("org_a", DEF_A, HASH_A)
            assert time.monotonic() - started < 5
        assert "lock timeout" in str(info.value)
        assert writer.apply("org_a", DEF_A, HASH_A) == 1
        writer.close()

    def test_errors_never_carry_the_dsn(self, pools, dead_endpoint):
        dsn = f"postgresql://publisher:pw-9z8y7x6w@127.0.0.1:{dead_endpoint.port}/catalogs"
        writer = _writer(pools, 1, dsn=dsn)
        with pytest.raises(CatalogStoreError) as info:
            writer.takeover()
        assert "pw-9z8y7x6w" not in str(info.value)
        assert "pw-9z8y7x6w" not in repr(writer)


class TestClients:
    @pytest.mark.safeguard("trino-14")
    @pytest.mark.parametrize(
        ("method", "args"),
        [
            ("list_catalogs", ()),
            ("describe", ("org_a",)),
            ("owners", ()),
            ("nodes", ()),
            ("connectors", ()),
            ("revision", ()),
            ("create", ("org_a", DEF_A, HASH_A)),
            ("alter", ("org_a", DEF_A, HASH_A)),
            ("drop", ("org_a",)),
        ],
    )
    def test_every_method_of_the_unavailable_client_raises_not_this_replica(
        self, pools, method, args
    ):
        client = catalog_writer.client_for(POOL)
        assert isinstance(client, Unavailable)
        with pytest.raises(NotThisReplica) as info:
            getattr(client, method)(*args)
        assert str(info.value) == (
            "shared Trino pool pool-a has no catalog writer on this control plane"
        )

    def test_client_for_follows_the_live_authority(self, pools):
        auth, writer = pools.lead("pool-a")
        assert catalog_writer.client_for(POOL) is writer
        # A newer term's authority in the holder (leader before its claim): unavailable.
        authority.HOLDER.install(Authority(POOL, auth.owner, auth.epoch + 1))
        assert isinstance(catalog_writer.client_for(POOL), Unavailable)
        authority.HOLDER.install(auth)
        assert catalog_writer.client_for(POOL) is writer
        authority.HOLDER.clear(POOL)
        assert isinstance(catalog_writer.client_for(POOL), Unavailable)
        authority.HOLDER.install(auth)
        catalog_writer.uninstall(POOL)
        assert isinstance(catalog_writer.client_for(POOL), Unavailable)
        assert isinstance(catalog_writer.client_for("registered:pool-b"), Unavailable)

    def test_the_registry_is_thread_safe(self, pools):
        _auth, writer = pools.lead("pool-a")
        seen: list[object] = []

        def read() -> None:
            for _ in range(200):
                seen.append(catalog_writer.client_for(POOL))

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(c is writer for c in seen)


class TestWatermark:
    def test_checkpoint_is_fenced_and_monotone(self, pools):
        auth, _ = pools.lead("pool-a")
        catalog_writer.checkpoint_revision(auth, 5)
        catalog_writer.checkpoint_revision(auth, 3)
        assert pool_revision() == 5
        stale = Authority(POOL, auth.owner, auth.epoch - 1)
        with pytest.raises(PoolConflict):
            catalog_writer.checkpoint_revision(stale, 9)
        assert pool_revision() == 5

    @pytest.mark.safeguard("trino-18")
    def test_claim_recovers_the_watermark_and_a_failed_recovery_fails_the_claim(self, pools):
        auth, writer = pools.lead("pool-a")
        writer.apply("org_a", DEF_A, HASH_A)
        writer.apply("org_b", DEF_B, HASH_B)
        assert pool_revision() == 0  # published without a checkpoint (a crash in between)
        assert catalog_writer.recover_watermark(auth, writer) == 2
        assert pool_revision() == 2
        writer.apply("org_c", DEF_A, HASH_A)
        # Next term: the claim recovers the watermark before swapping the client.
        writer2 = pools.lead("pool-a")[1]
        assert pool_revision() == 3
        assert id(catalog_writer.installed(POOL)) == id(writer2)
        # A claim whose watermark checkpoint fails is no claim at all.
        writer2.apply("org_d", DEF_A, HASH_A)  # store revision 4, watermark still 3
        auth3 = authority.acquire(POOL, OWNER)
        authority.HOLDER.install(auth3)
        authority.acquire(POOL, "intruder.0000000000000002")  # fences auth3 in the config store
        with pytest.raises(PoolConflict):
            catalog_writer.claim(auth3, pools.settings)
        assert authority.HOLDER.get(POOL) is None
        assert isinstance(catalog_writer.client_for(POOL), Unavailable)
        assert pool_revision() == 3
