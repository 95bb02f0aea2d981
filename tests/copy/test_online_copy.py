"""The online copy engine against a real DuckLake (``reshard/engines/capture.py``,
``reshard/engines/copy/online.py``): DuckDB keeps committing while the pre-copy runs, then
updates, deletes and creates more, a catalog table is dropped; the catch-up brings the target to
the source, every table equal, DuckDB reads the same history there, and removing the capture
leaves the tenant's tables without a trace of it.

(The runner does not use the online mode yet: these tests pin the engine it will be built on.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from reshard.engines import capture
from reshard.engines.copy import online, pump
from reshard.engines.copy.base import CopyError
from reshard.engines.copy.introspection import discover_tables
from reshard.engines.verify import verify_ducklake
from tests.fixtures.ducklake import Writer, attach, extensions, history, tenant_work
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.runner import catalog_checksums
from tests.fixtures.stores import StoreClusters, TenantCatalog, TenantCatalogFactory

__all__ = ["extensions"]  # fixtures used here


class Pair:
    """A tenant's DuckLake on the source cluster, its empty namesake on the target."""

    def __init__(self, clusters: StoreClusters, source: TenantCatalog, data: Path) -> None:
        self.clusters, self.catalog, self.data = clusters, source, data
        self.cluster = clusters.source

    def source(self) -> psycopg.Connection[Any]:
        return self.clusters.source.connect(
            self.catalog.role, self.catalog.password, self.catalog.database
        )

    def target(self) -> psycopg.Connection[Any]:
        return self.clusters.target.connect(
            self.catalog.role, self.catalog.password, self.catalog.database
        )


@pytest.fixture
def pair(
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    extensions: Path,
    tmp_path: Path,
) -> Iterator[Pair]:
    catalog = tenant_catalog(store_clusters.source, with_tables=False)
    tenant_catalog(
        store_clusters.target, name=catalog.role, password=catalog.password, with_tables=False
    )
    p = Pair(store_clusters, catalog, tmp_path / "lake-data")
    with attach(extensions, store_clusters.source, catalog, p.data) as lake:
        tenant_work(lake)
    with p.source() as conn:
        conn.execute("CREATE TABLE public.ducklake_scratchpad (k integer, v text)")
        conn.execute("INSERT INTO public.ducklake_scratchpad VALUES (1, 'kept until dropped')")
        conn.execute("CREATE TABLE public.ducklake_notes (k integer, v text)")
        conn.execute("INSERT INTO public.ducklake_notes VALUES (1, 'one'), (2, 'two'), (2, 'two')")
        conn.execute("CREATE TABLE public.ducklake_bulk (k integer, v text)")
        conn.execute(
            "INSERT INTO public.ducklake_bulk SELECT g, 'row ' || g "
            f"FROM generate_series(1, {online.LOOKUP_MIN_ROWS}) g"
        )
        capture.install(conn, discover_tables(conn))
    yield p
    with p.source() as conn:
        capture.remove(conn)


def _slowed(real: Callable[..., Any]) -> Callable[..., Any]:
    def stream(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # a pre-copy long enough for the tenant to commit during it
        return real(*args, **kwargs)

    return stream


def test_the_catch_up_brings_the_target_to_a_source_written_during_the_pre_copy(
    pair: Pair, extensions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = RecordingHooks()
    monkeypatch.setattr(pump, "stream_table", _slowed(pump.stream_table))
    with Writer(extensions, pair) as writer:
        time.sleep(0.3)
        started = time.monotonic()
        pre = online.precopy_catalog(pair.source, pair.target, hooks)
        ended = time.monotonic()
        time.sleep(0.3)
    assert not writer.errors, writer.errors
    during = [t for t in writer.commits if started <= t <= ended]
    assert len(during) >= 5, "the tenant committed while the pre-copy ran"
    assert "ducklake_scratchpad" in pre.names
    assert _lookup_indexes(pair) == [], "built by the rounds, for the tables they must match"

    with attach(extensions, pair.clusters.source, pair.catalog, pair.data) as lake:
        lake.sql("UPDATE lake.events SET amount = -1 WHERE id <= 20")
        lake.sql("DELETE FROM lake.events WHERE id BETWEEN 30 AND 40")
        lake.sql("CREATE TABLE lake.late (x INTEGER)")  # a new catalog table for its inlined rows
        lake.sql("INSERT INTO lake.late VALUES (1), (2), (3)")
    with pair.source() as conn:
        conn.execute("DROP TABLE public.ducklake_scratchpad")
        conn.execute("DELETE FROM public.ducklake_notes WHERE k = 1")
        conn.execute("UPDATE public.ducklake_bulk SET v = 'changed' WHERE k = 7")  # by its index
        # one of two equal rows: the target deletes one of its two, either
        conn.execute(
            "DELETE FROM public.ducklake_notes WHERE ctid = "
            "(SELECT min(ctid) FROM public.ducklake_notes WHERE k = 2)"
        )

    done = online.catch_up(pair.source, pair.target, hooks, pre)
    try:
        assert _lookup_indexes(pair) == [], (
            "the flipped-to catalog is the source's, index for index"
        )
        assert done.dropped == ("ducklake_scratchpad",)
        assert done.created, "the inlined-data table DuckDB created since was copied whole"
        assert done.applied.inserted >= len(writer.commits)
        assert done.applied.updated > 0
        assert done.applied.deleted == 2
        with pair.target() as tgt:
            verify_ducklake(done.release.connection, tgt)
    finally:
        done.release.release()
    source, target = pair.clusters.source, pair.clusters.target
    database = pair.catalog.database
    assert catalog_checksums(target, database) == catalog_checksums(source, database)

    with attach(extensions, source, pair.catalog, pair.data) as lake:
        before = history(lake, 1)
    with attach(extensions, target, pair.catalog, pair.data) as lake:
        assert history(lake, 1) == before
        lake.sql("INSERT INTO lake.late VALUES (4)")
        assert lake.rows("late") == [(1,), (2,), (3,), (4,)]


def test_lookup_indexes_go_only_on_large_tables_with_updates_or_deletes(pair: Pair) -> None:
    """A round indexes the tables whose rows the apply must find (an update or a delete) when
    they are large enough for a scan to cost more than the index; an insert-only table, however
    large, and a small one get none (dropping each index costs the window). The catch-up drops
    them all."""
    hooks = RecordingHooks()
    with pair.source() as conn:
        conn.execute("CREATE TABLE public.ducklake_appended (k integer)")
        conn.execute(
            "INSERT INTO public.ducklake_appended SELECT g "
            f"FROM generate_series(1, {online.LOOKUP_MIN_ROWS}) g"
        )
        capture.add_triggers(conn, ["ducklake_appended"])
    pre = online.precopy_catalog(pair.source, pair.target, hooks)
    assert _lookup_indexes(pair) == []
    with pair.source() as conn:
        conn.execute("UPDATE public.ducklake_bulk SET v = 'changed' WHERE k = 7")
        conn.execute("DELETE FROM public.ducklake_notes WHERE k = 1")
        conn.execute("INSERT INTO public.ducklake_appended VALUES (-1)")
    pre = online.advance(pair.source, pair.target, hooks, pre)
    assert pre.last_round == 3
    assert _lookup_indexes(pair) == ["ducklake_bulk"]
    done = online.catch_up(pair.source, pair.target, hooks, pre)
    try:
        assert _lookup_indexes(pair) == []
    finally:
        done.release.release()
    source, target = pair.clusters.source, pair.clusters.target
    database = pair.catalog.database
    assert catalog_checksums(target, database) == catalog_checksums(source, database)


def test_removing_the_capture_leaves_the_tenants_tables_as_they_were(pair: Pair) -> None:
    with pair.source() as conn:
        assert capture.installed(conn)
        assert capture.installed_tables(conn) == discover_tables(conn)
        assert capture.remove(conn) is True
        assert capture.remove(conn) is False  # idempotent: every terminal path may call it
        triggers = conn.execute(
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE NOT t.tgisinternal"
        ).fetchone()
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone()
    assert triggers == (0,)
    assert functions == (0,)


def test_a_leftover_capture_is_never_reused(pair: Pair) -> None:
    with pair.source() as conn, pytest.raises(capture.CaptureError, match="exists already"):
        capture.install(conn, discover_tables(conn))


def test_a_change_the_target_cannot_match_fails_the_catch_up(pair: Pair) -> None:
    """A target that lost a row the source later deletes has diverged: the catch-up fails and
    commits nothing."""
    hooks = RecordingHooks()
    pre = online.precopy_catalog(pair.source, pair.target, hooks)
    with pair.target() as tgt:
        tgt.execute("DELETE FROM public.ducklake_scratchpad")
    with pair.source() as conn:
        conn.execute("DELETE FROM public.ducklake_scratchpad")
        conn.execute("INSERT INTO public.ducklake_scratchpad VALUES (2, 'added')")
    with pytest.raises(CopyError, match="diverged"):
        online.catch_up(pair.source, pair.target, hooks, pre)
    with pair.target() as tgt:
        assert tgt.execute("SELECT count(*) FROM public.ducklake_scratchpad").fetchone() == (0,)


def _refused_after_the_pre_copy(pair: Pair, statements: list[str], match: str) -> None:
    """Pre-copy, run ``statements`` on the source as the tenant, and the catch-up refuses."""
    hooks = RecordingHooks()
    pre = online.precopy_catalog(pair.source, pair.target, hooks)
    with pair.source() as conn:
        for statement in statements:
            conn.execute(statement)
    with pytest.raises(CopyError, match=match):
        online.catch_up(pair.source, pair.target, hooks, pre)


@pytest.mark.parametrize(
    "ddl",
    [
        "ADD COLUMN extra integer",
        "ALTER COLUMN v SET DEFAULT 'x'",
        "ALTER COLUMN k TYPE bigint",
        "ALTER COLUMN k SET NOT NULL",
        "RENAME COLUMN v TO w",
    ],
)
def test_a_table_whose_columns_changed_since_the_pre_copy_is_refused(pair: Pair, ddl: str) -> None:
    """Any change to a kept table's columns (each is compared as a digest of its rows)."""
    _refused_after_the_pre_copy(
        pair,
        [f"ALTER TABLE public.ducklake_scratchpad {ddl}"],
        "columns of ducklake_scratchpad changed since",
    )


def test_a_table_dropped_and_created_again_since_the_pre_copy_is_refused(pair: Pair) -> None:
    """Same name, same columns, but a new table without the capture's trigger: its writes since
    were never recorded, so the catch-up refuses it rather than miss them."""
    _refused_after_the_pre_copy(
        pair,
        [
            "DROP TABLE public.ducklake_notes",
            "CREATE TABLE public.ducklake_notes (k integer, v text)",
            "INSERT INTO public.ducklake_notes VALUES (9, 'never captured')",
        ],
        r"columns of ducklake_notes changed since.*created again",
    )


def test_rounds_before_the_block_leave_the_fenced_catch_up_only_the_last_changes(
    pair: Pair, extensions: Path
) -> None:
    """``advance`` applies what the tenant committed since the last marker while it writes on;
    the fenced catch-up then applies only what came after the last round, and the target still
    ends equal to the source."""
    hooks = RecordingHooks()
    with Writer(extensions, pair) as writer:
        pre = online.precopy_catalog(pair.source, pair.target, hooks)
        time.sleep(0.6)
        first = online.advance(pair.source, pair.target, hooks, pre)
        time.sleep(0.6)
        second = online.advance(pair.source, pair.target, hooks, first)
    assert not writer.errors, writer.errors
    assert first.last_round > 0
    assert second.last_round > 0
    assert second.marker != first.marker != pre.marker
    done = online.catch_up(pair.source, pair.target, hooks, second)
    done.release.release()
    assert done.applied.total < first.last_round + second.last_round
    database = pair.catalog.database
    source, target = pair.clusters.source, pair.clusters.target
    assert catalog_checksums(target, database) == catalog_checksums(source, database)


@pytest.mark.parametrize(
    "tamper",
    [
        # a view in its place: reading it would run whatever the view calls, in our session
        "ALTER TABLE duckgres_capture.changes RENAME TO changes_real; "
        "CREATE VIEW duckgres_capture.changes AS SELECT * FROM duckgres_capture.changes_real",
        # a column of another type (its cast or output function could be the tenant's)
        "ALTER TABLE duckgres_capture.changes ALTER COLUMN tbl TYPE varchar",
    ],
)
def test_a_change_table_the_tenant_altered_is_never_read(pair: Pair, tamper: str) -> None:
    _refused_after_the_pre_copy(pair, tamper.split("; "), "no longer the table the capture created")


@pytest.mark.safeguard("reshard-145")
def test_the_capture_never_waits_holding_a_lock_a_tenant_commit_needs(pair: Pair) -> None:
    """A tenant's transaction holds the last table (uncommitted write): the install puts the
    triggers on every other table, waits a bounded time for the busy one and gives up
    (``Busy``) holding nothing, so the tenant's commit, touching a table the install did
    before, goes through; once the tenant is done the install resumes and completes."""
    with pair.source() as conn:
        capture.remove(conn)
        tables = discover_tables(conn)
    first, last = tables[0], tables[-1]
    with pair.source() as tenant, pair.source() as installer:
        tenant.autocommit = False
        tenant.execute(
            f"UPDATE public.{last} SET {_first_column(tenant, last)} = "
            f"{_first_column(tenant, last)} WHERE false"
        )
        tenant.execute(f"LOCK TABLE public.{last} IN ROW EXCLUSIVE MODE")
        capture.create_schema(installer)
        started = time.monotonic()
        with pytest.raises(capture.Busy):
            capture.add_triggers(installer, tables)
        waited = time.monotonic() - started
        assert waited < 5 * capture.TABLE_LOCK_WAIT_MS / 1000 + 2, waited
        assert capture.installed_tables(installer) == tables[:-1], "resumable: the rest is done"
        tenant.execute(f"LOCK TABLE public.{first} IN ROW EXCLUSIVE MODE NOWAIT")
        tenant.commit()
        capture.add_triggers(installer, tables)
        assert capture.installed_tables(installer) == tables


@pytest.mark.safeguard("reshard-145")
def test_the_install_gets_through_tenant_commits_that_always_overlap(pair: Pair) -> None:
    """Two tenant sessions write the same table in turn, each transaction holding it 600 ms and
    starting before the other ends, so the table is never free (a very large catalog's DuckDB
    commits). A fixed 200 ms wait never gets through; the doubling wait queues the install
    behind the current holders long enough, and every tenant transaction still commits."""
    with pair.source() as conn:
        capture.remove(conn)
        tables = discover_tables(conn)
    last = tables[-1]
    stop = threading.Event()
    errors: list[BaseException] = []
    commits = [0, 0]

    def tenant(number: int) -> None:
        time.sleep(0.3 * number)
        try:
            with pair.source() as session:
                session.autocommit = False
                while not stop.is_set():
                    session.execute(f"LOCK TABLE public.{last} IN ROW EXCLUSIVE MODE")
                    time.sleep(0.6)
                    session.commit()
                    commits[number] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=tenant, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        with pair.source() as installer:
            capture.create_schema(installer)
            busy = 0
            while True:
                try:
                    capture.add_triggers(installer, tables, capture.lock_wait_ms(busy + 1))
                    break
                except capture.Busy:
                    busy += 1
                    assert busy < 8, "the install never got through"
            assert busy >= 1, "the table was free: the tenant sessions did not hold it"
            assert capture.installed_tables(installer) == tables
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors, errors
    assert min(commits) >= 1


@pytest.mark.safeguard("reshard-145")
def test_the_removal_goes_table_by_table_around_a_tenants_open_transaction(pair: Pair) -> None:
    """A tenant's open read holds the last table: the removal cannot take every table at
    once, so it drops the triggers of the others one table at a time, gives up on the busy
    one holding nothing (the tenant's write to the first table goes through), and finishes,
    schema and all, once the tenant is done."""
    with pair.source() as tenant, pair.source() as remover:
        tables = capture.installed_tables(remover)
        first, last = tables[0], tables[-1]
        tenant.autocommit = False
        tenant.execute(f"SELECT count(*) FROM public.{last}")
        with pytest.raises(capture.Busy):
            capture.remove(remover)
        assert capture.installed_tables(remover) == [last]
        assert capture.installed(remover), "the schema goes last"
        tenant.execute(f"LOCK TABLE public.{first} IN ROW EXCLUSIVE MODE NOWAIT")
        tenant.commit()
        assert capture.remove(remover) is True
        assert not capture.installed(remover)
        assert capture.installed_tables(remover) == []


def _first_column(conn: psycopg.Connection[Any], table: str) -> str:
    row = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum = 1",
        (f"public.{table}",),
    ).fetchone()
    assert row is not None
    return str(row[0])


def _lookup_indexes(pair: Pair) -> list[str]:
    """The tables the catch-up's lookup indexes are on."""
    with pair.target() as conn:
        rows = conn.execute(
            "SELECT i.indrelid::regclass::text FROM pg_index i JOIN pg_class c "
            "ON c.oid = i.indexrelid WHERE c.relname LIKE 'duckgres\\_catchup\\_%'"
        ).fetchall()
    return [str(r[0]) for r in rows]
