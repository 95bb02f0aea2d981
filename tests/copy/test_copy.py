"""The catalog copy between the two real metadata-store clusters (spec reshard §4.9)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reshard.engines.copy import catalog as catalog_copy
from reshard.engines.copy import introspection, parallel, pump
from reshard.engines.copy.base import PROGRESS_INTERVAL_SECONDS, CopyError
from reshard.engines.copy.catalog import (
    AUTOVACUUM_NOTE,
    TARGET_LOCK_KEY,
    copy_catalog,
    drop_ducklake_tables,
)
from reshard.engines.copy.introspection import read_constraints
from reshard.engines.copy.replay import apply_index
from reshard.engines.copy.shape import Constraint, IndexDef, order_constraints, read_catalog
from tests.fixtures.catalog_pair import CatalogPair, CatalogPairFactory
from tests.fixtures.hooks import RecordingHooks


def _run(pair: CatalogPair, hooks: RecordingHooks, **kwargs: Any) -> catalog_copy.CopyResult:
    return copy_catalog(pair.source_factory(), pair.target_factory(), hooks, **kwargs)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_copy_moves_every_table_with_equal_checksums_indexes_and_constraints(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, parallelism: int
) -> None:
    pair = catalog_pair()
    before = pair.checksums("source")
    result = _run(pair, hooks, parallelism=parallelism)
    try:
        assert pair.checksums("target") == before
        assert pair.checksums("source") == before
        assert pair.schema_objects("target") == pair.schema_objects("source")
        assert "idx_ducklake_column_tbl_snap" in {
            name for name, _, _ in pair.schema_objects("target")["ducklake_column"]
        }
        assert result.tables_copied == len(before)
        assert result.rows_copied == sum(rows for rows, _ in before.values())
        assert result.bytes_copied > 0
        assert {t.name: t.rows for t in result.tables} == {k: v[0] for k, v in before.items()}
        assert result.parallelism == parallelism
        messages = hooks.messages()
        # The pair's source login is the tenant's, which may not lower deadlock_timeout.
        assert messages[:2] == [
            AUTOVACUUM_NOTE,
            f"acquiring the source write fence on {len(before)} tables…",
        ]
        for table in result.tables:
            assert f"copied {table.name}: {table.rows} rows, {table.bytes} bytes" in messages
        announce = messages.index(
            f"applying constraints and indexes on the target ({len(before)} tables)…"
        )
        assert messages.index("constraints and indexes applied on target") > announce
        # One pre-statement heartbeat per DROP TABLE; every hook ran in the calling thread.
        assert hooks.irreversible_calls == len(before)
        assert hooks.threads == {threading.get_ident()}
        first = hooks.progress_calls[0][1]
        assert first == {
            "tables_total": len(before),
            "tables_done": 0,
            "rows_copied": 0,
            "bytes_copied": 0,
        }
        # Only the source connection behind the release handle is still registered and open.
        assert hooks.registered == [result.release.connection]
        assert all(c.closed for c in hooks.ever_registered if c is not result.release.connection)
    finally:
        result.release.release()
    assert hooks.registered == []
    assert result.release.connection.closed
    result.release.release()  # idempotent


def test_command_tag_row_counts_are_cursor_rowcount(catalog_pair: CatalogPairFactory) -> None:
    """Pin psycopg's behaviour the spec relies on: after a COPY block ``cursor.rowcount`` is
    the command tag's row count, on both COPY TO and COPY FROM; the copy reports the same."""
    pair = catalog_pair(tables=3, inlined_every=0)
    src = pair.source_factory()()
    tgt = pair.target_factory()()
    try:
        tgt.execute("CREATE TABLE ducklake_pin (a int, b text)")
        # A real table of public (the copy qualifies every name: a temporary table would not be
        # what public.ducklake_pin2 names).
        src.execute(
            "CREATE TABLE ducklake_pin2 AS SELECT g a, 'x' || g b FROM generate_series(1, 1234) g"
        )
        with src.cursor() as cur:
            with cur.copy("COPY ducklake_pin2 TO STDOUT (FORMAT binary)") as out:
                data = b"".join(bytes(block) for block in out)
            assert cur.rowcount == 1234
        with tgt.cursor() as cur:
            with cur.copy("COPY ducklake_pin FROM STDIN (FORMAT binary)") as inp:
                inp.write(data)
            assert cur.rowcount == 1234
        tgt.execute("CREATE TABLE ducklake_pin2 (a int, b text)")
        done = pump.stream_table(src, tgt, "ducklake_pin2")
        assert (done.rows, done.bytes) == (1234, len(data))
    finally:
        src.close()
        tgt.close()


@pytest.mark.safeguard("reshard-6")
def test_rerun_onto_leftovers_replaces_tables_and_a_stale_differing_index(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair()
    _run(pair, hooks).release.release()
    with pair.su("target") as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(pair.role)))
        conn.execute("INSERT INTO ducklake_metadata (key, value) VALUES ('stale', 'leftover')")
        conn.execute("DROP INDEX idx_ducklake_column_tbl_snap")
        conn.execute("CREATE INDEX idx_ducklake_column_tbl_snap ON ducklake_column (column_name)")
        conn.execute("DELETE FROM ducklake_data_file WHERE data_file_id % 2 = 0")
    second = RecordingHooks()
    _run(pair, second, parallelism=2).release.release()
    assert pair.checksums("target") == pair.checksums("source")
    assert pair.schema_objects("target") == pair.schema_objects("source")
    with pair.su("target") as conn:
        row = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_ducklake_column_tbl_snap'"
        ).fetchone()
    assert row is not None
    assert "(table_id, begin_snapshot)" in str(row[0])


class _CollidingConnection(psycopg.Connection[Any]):
    """Raises 42P07 on the first ``collisions`` creates of one index; counts statements."""

    collisions = 0
    index = "idx_ducklake_column_tbl_snap"
    creates = 0
    drops = 0
    fail_drop = False
    other_error = False

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.as_string(self) if hasattr(query, "as_string") else str(query)
        cls = type(self)
        if text.startswith("DROP INDEX IF EXISTS public.") and cls.index in text:
            cls.drops += 1
            if cls.fail_drop:
                raise psycopg.errors.InsufficientPrivilege("must be owner of index (injected)")
        if text.startswith("CREATE INDEX") and cls.index in text:
            cls.creates += 1
            if cls.other_error:
                raise psycopg.errors.DiskFull("could not extend file (injected)")
            if cls.creates <= cls.collisions:
                raise psycopg.errors.DuplicateTable(f'relation "{cls.index}" already exists')
        return super().execute(query, params, **kwargs)


def _colliding(
    collisions: int = 0, *, fail_drop: bool = False, other: bool = False
) -> type[_CollidingConnection]:
    return type(
        "Colliding",
        (_CollidingConnection,),
        {"collisions": collisions, "creates": 0, "drops": 0, "fail_drop": fail_drop,
         "other_error": other},
    )  # fmt: skip


@pytest.mark.safeguard("reshard-6")
def test_one_injected_collision_is_retried_once(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair(tables=4)
    cls = _colliding(1)
    _run_with = copy_catalog(pair.source_factory(), pair.target_factory(cls), hooks)
    _run_with.release.release()
    assert (cls.creates, cls.drops) == (2, 2)
    warns = [m for lvl, m in hooks.logs if lvl == "warn"]
    assert warns == [
        "index idx_ducklake_column_tbl_snap on ducklake_column collided (42P07); dropping and "
        "retrying (attempt 2 of 3)"
    ]
    assert pair.schema_objects("target") == pair.schema_objects("source")


@pytest.mark.safeguard("reshard-6")
def test_three_collisions_fail_and_other_errors_are_not_retried(
    catalog_pair: CatalogPairFactory,
) -> None:
    pair = catalog_pair(tables=4)
    cls = _colliding(3)
    hooks = RecordingHooks()
    with pytest.raises(CopyError, match="still colliding after 3 drop\\+create attempts"):
        copy_catalog(pair.source_factory(), pair.target_factory(cls), hooks)
    assert cls.creates == 3
    assert "constraints and indexes applied on target" not in hooks.messages()
    assert hooks.registered == []

    other = _colliding(other=True)
    with pytest.raises(CopyError, match="could not extend file") as info:
        copy_catalog(pair.source_factory(), pair.target_factory(other), RecordingHooks())
    assert other.creates == 1
    assert info.value.sqlstate == "53100"


@pytest.mark.safeguard("reshard-6")
def test_a_failing_drop_index_surfaces(catalog_pair: CatalogPairFactory) -> None:
    pair = catalog_pair(tables=4)
    cls = _colliding(fail_drop=True)
    with pytest.raises(CopyError, match="DROP INDEX idx_ducklake_column_tbl_snap on "
                       "ducklake_column: must be owner of index"):  # fmt: skip
        copy_catalog(pair.source_factory(), pair.target_factory(cls), RecordingHooks())
    assert cls.creates == 0


@pytest.mark.safeguard("reshard-6")
def test_apply_index_never_uses_if_not_exists(catalog_pair: CatalogPairFactory) -> None:
    """A stale differing index of the same name is dropped and rebuilt from the source's
    definition (``IF NOT EXISTS`` would have kept it)."""
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("target") as conn:
        conn.execute("CREATE TABLE ducklake_x (a int, b int)")
        conn.execute("CREATE INDEX idx_x ON ducklake_x (b)")
        logs: list[tuple[str, str]] = []
        create = sql.SQL("CREATE INDEX idx_x ON public.ducklake_x USING btree (a)")
        used = apply_index(
            conn,
            "ducklake_x",
            IndexDef("idx_x", sql.Composed([create])),
            lambda level, msg: logs.append((level, msg)),
        )
        row = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_x'").fetchone()
    assert used == 1
    assert row is not None
    assert str(row[0]).endswith("(a)")
    assert logs == []


@pytest.mark.safeguard("reshard-5")
def test_not_null_constraints_are_never_replayed() -> None:
    """*unit*: PostgreSQL 18 catalogues NOT NULL as contype 'n'; older targets reject its
    syntax and CREATE TABLE already carries NOT NULL, so the list excludes it. FKs go last."""
    fk = Constraint("b_fk", "f", sql.SQL("FOREIGN KEY (x) REFERENCES public.other (id)"))
    nn = Constraint("a_nn", "n", sql.SQL("NOT NULL id"))
    pk = Constraint("c_pkey", "p", sql.SQL("PRIMARY KEY (id)"))
    a_uniq = Constraint("a_uniq", "u", sql.SQL("UNIQUE (a)"))
    d_uniq = Constraint("d_uniq", "u", sql.SQL("UNIQUE (k)"))
    assert order_constraints([fk, nn, pk, a_uniq, d_uniq]) == [a_uniq, pk, d_uniq, fk]


@pytest.mark.safeguard("reshard-32")
def test_contype_is_read_as_text(catalog_pair: CatalogPairFactory) -> None:
    """The constraint query returns ``contype`` as ``text`` (type oid 25), never the internal
    ``"char"`` (oid 18) that drivers decode inconsistently."""
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("source") as conn:
        conn.execute(
            "CREATE TABLE ducklake_fk_child (id bigint PRIMARY KEY, "
            "snap bigint REFERENCES ducklake_snapshot (snapshot_id), UNIQUE (snap))"
        )
        cur = conn.execute(introspection._CONSTRAINTS, (["ducklake_fk_child"],))
        assert cur.description is not None
        assert cur.description[2].type_code == 25
        rows = read_constraints(conn, ["ducklake_fk_child"])
        tables = ["ducklake_fk_child", "ducklake_snapshot"]
        found = read_catalog(conn, tables).constraints
    assert all(isinstance(r.contype, str) for r in rows)
    assert sorted(r.contype for r in rows) == ["f", "p", "u"]
    kinds = [c.contype for c in found["ducklake_fk_child"]]
    assert kinds[-1] == "f"
    assert sorted(kinds) == ["f", "p", "u"]
    assert [(c.name, c.contype) for c in found["ducklake_snapshot"]] == [
        ("ducklake_snapshot_pkey", "p")
    ]


def test_foreign_keys_replay_after_every_table_exists(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("source") as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(pair.role)))
        # "ducklake_aaa" sorts before its referenced table: the FK must wait for it.
        conn.execute(
            "CREATE TABLE ducklake_aaa (id bigint PRIMARY KEY, "
            "snap bigint NOT NULL DEFAULT 0 REFERENCES ducklake_snapshot (snapshot_id))"
        )
        conn.execute("INSERT INTO ducklake_aaa VALUES (1, 1), (2, 2)")
    _run(pair, hooks).release.release()
    assert pair.schema_objects("target") == pair.schema_objects("source")
    assert pair.checksums("target") == pair.checksums("source")


class _FailingConstraintConnection(psycopg.Connection[Any]):
    seen_logs: list[str] | None = None
    hooks: RecordingHooks | None = None
    first_apply_log_len: int | None = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.as_string(self) if hasattr(query, "as_string") else str(query)
        cls = type(self)
        if (text.startswith("ALTER TABLE") or text.startswith("CREATE INDEX")) and (
            cls.first_apply_log_len is None and cls.hooks is not None
        ):
            cls.first_apply_log_len = len(cls.hooks.logs)
        if text.startswith("ALTER TABLE") and "ducklake_snapshot_pkey" in text:
            raise psycopg.errors.InsufficientPrivilege("permission denied (injected)")
        return super().execute(query, params, **kwargs)


@pytest.mark.safeguard("reshard-28")
def test_announce_precedes_first_apply_and_completion_is_absent_on_failure(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair(tables=4)
    cls: type[_FailingConstraintConnection] = type(
        "Failing", (_FailingConstraintConnection,), {"hooks": hooks, "first_apply_log_len": None}
    )
    with pytest.raises(CopyError, match="constraint ducklake_snapshot_pkey on ducklake_snapshot"):
        copy_catalog(pair.source_factory(), pair.target_factory(cls), hooks)
    messages = hooks.messages()
    announce = f"applying constraints and indexes on the target ({len(pair.source_tables)} tables)…"
    assert cls.first_apply_log_len is not None
    assert announce in messages[: cls.first_apply_log_len]
    assert "constraints and indexes applied on target" not in messages
    assert hooks.registered == []
    assert all(c.closed for c in hooks.ever_registered)


def test_share_locks_block_source_writes_until_release(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    """The write fence outlives the copy: a writer on the source waits until release()."""
    pair = catalog_pair(tables=3, inlined_every=0)
    result = _run(pair, hooks, parallelism=2)
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with pair.su("source") as conn:
                conn.execute("INSERT INTO ducklake_metadata (key, value) VALUES ('late', 'w')")
            done.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 10
        waiting = False
        while time.monotonic() < deadline and not waiting:
            with pair.clusters.source.superuser_conn() as conn:
                waiting = bool(
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE 'INSERT INTO ducklake_metadata%%' AND datname = %s",
                        (pair.database,),
                    ).fetchone()[0]  # type: ignore[index]
                )
            time.sleep(0.1)
        assert waiting, "the INSERT never waited on the SHARE lock"
        time.sleep(0.5)
        assert not done.is_set()
    finally:
        result.release.release()
    thread.join(10)
    assert done.is_set(), errors
    assert (
        pair.checksums("target")["ducklake_metadata"]
        != pair.checksums("source")["ducklake_metadata"]
    )


def test_target_advisory_lock_refuses_to_interleave(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("target") as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (TARGET_LOCK_KEY,))
        with pytest.raises(
            CopyError,
            match=r"^target catalog is locked by another copier — refusing to interleave$",
        ):
            _run(pair, hooks)
    assert hooks.registered == []
    assert all(c.closed for c in hooks.ever_registered)
    assert hooks.irreversible_calls == 0
    with pair.su("target") as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ducklake\\_%'"
        ).fetchone()
    assert left is not None
    assert left[0] == 0


def test_empty_source_is_refused(
    store_clusters: Any, tenant_catalog: Any, hooks: RecordingHooks
) -> None:
    src = tenant_catalog(store_clusters.source, with_tables=False)
    tenant_catalog(store_clusters.target, name=src.role, password=src.password, with_tables=False)
    pair = CatalogPair(store_clusters, src.role, src.database, "copytest-empty")
    with pytest.raises(
        CopyError, match=r"^source has no ducklake_% tables — refusing to copy an empty catalog$"
    ):
        _run(pair, hooks)
    assert hooks.registered == []


def test_table_set_change_during_the_fence_is_refused(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = catalog_pair(tables=2, inlined_every=0)
    real = introspection.discover_tables
    calls: list[int] = []

    def discover(conn: Any) -> list[str]:
        calls.append(1)
        found = real(conn)
        return found if len(calls) == 1 else found[1:]

    monkeypatch.setattr(introspection, "discover_tables", discover)
    with pytest.raises(
        CopyError, match="source catalog table set changed while acquiring the write fence"
    ):
        _run(pair, hooks)
    assert hooks.irreversible_calls == 0


def test_row_count_mismatch_is_detected(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    """An event trigger on the target attaches, to the freshly created ducklake_metadata, a
    row trigger that silently skips one row: COPY FROM's command tag then reports one less.
    (The trigger names its function schema-qualified: the copy's sessions search no schema.)"""
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("target") as conn:
        conn.execute(
            """CREATE FUNCTION skip_version() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN IF NEW.key = 'version' THEN RETURN NULL; END IF; RETURN NEW; END $$"""
        )
        conn.execute(
            """CREATE FUNCTION attach_skip() RETURNS event_trigger LANGUAGE plpgsql AS $$
               DECLARE r record;
               BEGIN
                 FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
                   IF r.command_tag = 'CREATE TABLE'
                      AND r.object_identity = 'public.ducklake_metadata' THEN
                     EXECUTE 'CREATE TRIGGER skip BEFORE INSERT ON public.ducklake_metadata '
                             'FOR EACH ROW EXECUTE FUNCTION public.skip_version()';
                   END IF;
                 END LOOP;
               END $$"""
        )
        conn.execute(
            "CREATE EVENT TRIGGER attach_skip ON ddl_command_end WHEN TAG IN ('CREATE TABLE') "
            "EXECUTE FUNCTION attach_skip()"
        )
    with pytest.raises(CopyError) as info:
        _run(pair, hooks)
    rows = pair.checksums("source")["ducklake_metadata"][0]
    assert str(info.value) == (
        f"COPY row count mismatch on ducklake_metadata: source COPY TO reported {rows} rows, "
        f"target COPY FROM reported {rows - 1}"
    )
    assert hooks.registered == []


@pytest.mark.safeguard("reshard-17")
@pytest.mark.parametrize("parallelism", [1, 2])
def test_fencing_cancels_a_copy_blocked_on_a_lock(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, parallelism: int
) -> None:
    """A writer holding ACCESS EXCLUSIVE keeps the copy's LOCK waiting; cancelling the
    registered connections (what fencing does) aborts it with 57014 and leaves no query."""
    pair = catalog_pair(tables=3, inlined_every=0)
    blocker = pair.su("source")
    blocker.execute("BEGIN")
    blocker.execute("LOCK TABLE ducklake_snapshot IN ACCESS EXCLUSIVE MODE")
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            _run(pair, hooks, parallelism=parallelism).release.release()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if any(
                side == "source" and state == "active" and query.startswith("LOCK TABLE")
                for side, state, query in pair.activity()
            ):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the copy never waited on the lock: {pair.activity()}")
        hooks.cancel_all()
        thread.join(15)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert not thread.is_alive()
    assert len(outcome) == 1
    error = outcome[0]
    assert isinstance(error, CopyError)
    assert error.sqlstate == "57014"
    assert "canceling statement due to user request" in str(error)
    deadline = time.monotonic() + 5
    while pair.activity() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pair.activity() == []
    assert hooks.irreversible_calls == 0


@pytest.mark.parametrize("parallelism", [1, 2])
def test_stop_interrupts_the_copy_and_closes_everything(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, parallelism: int
) -> None:
    pair = catalog_pair(tables=6)
    hooks.on_irreversible = lambda n: hooks.stop.set() if n == 2 else None
    with pytest.raises(CopyError, match="copy interrupted: the runner is stopping"):
        _run(pair, hooks, parallelism=parallelism)
    assert hooks.registered == []
    assert all(c.closed for c in hooks.ever_registered)
    assert pair.activity() == []


class Fenced(Exception):
    pass


def test_a_raising_pre_statement_heartbeat_sends_no_drop(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    """before_irreversible() raising (fenced, store error) keeps the DROP TABLE from being
    sent; its exception propagates unchanged so the runner can tell fencing apart."""
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("target") as conn:
        conn.execute("CREATE TABLE ducklake_metadata (leftover int)")

    def fence(n: int) -> None:
        raise Fenced("operation fenced")

    hooks.on_irreversible = fence
    with pytest.raises(Fenced):
        _run(pair, hooks)
    with pair.su("target") as conn:
        cols = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'ducklake_metadata'::regclass "
            "AND attnum > 0"
        ).fetchall()
    assert [c[0] for c in cols] == ["leftover"]
    assert hooks.registered == []


def test_a_helper_error_fails_the_parallel_copy(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair(tables=8)
    with pair.su("target") as conn:
        conn.execute(
            """CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'helper target exploded'; END $$"""
        )
        conn.execute(
            """CREATE FUNCTION attach_boom() RETURNS event_trigger LANGUAGE plpgsql AS $$
               DECLARE r record;
               BEGIN
                 FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
                   IF r.object_identity = 'public.ducklake_table' THEN
                     EXECUTE 'CREATE TRIGGER boom BEFORE INSERT ON public.ducklake_table '
                             'FOR EACH ROW EXECUTE FUNCTION public.boom()';
                   END IF;
                 END LOOP;
               END $$"""
        )
        conn.execute(
            "CREATE EVENT TRIGGER attach_boom ON ddl_command_end WHEN TAG IN ('CREATE TABLE') "
            "EXECUTE FUNCTION attach_boom()"
        )
    with pytest.raises(CopyError, match="copying ducklake_table: helper target exploded"):
        _run(pair, hooks, parallelism=3)
    assert hooks.registered == []
    assert all(c.closed for c in hooks.ever_registered)
    assert len(hooks.ever_registered) == 2 + 2 * 3
    assert pair.activity() == []
    assert "constraints and indexes applied on target" not in hooks.messages()


@pytest.mark.safeguard("reshard-55")
def test_progress_is_rate_limited_and_monotonic(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert PROGRESS_INTERVAL_SECONDS == 2.0
    pair = catalog_pair(tables=30, inlined_every=2)
    slow = pump.stream_table

    def throttled(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.03)
        return slow(*args, **kwargs)

    monkeypatch.setattr(pump, "stream_table", throttled)
    result = _run(pair, hooks, progress_interval=0.2)
    result.release.release()
    calls = hooks.progress_calls
    assert len(calls) >= 3
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(calls)]
    assert min(gaps) >= 0.2
    done = [v["tables_done"] for _, v in calls]
    assert done == sorted(done)
    assert done[-1] > done[0]
    assert all(v["tables_total"] == result.tables_copied for _, v in calls)
    assert max(v["bytes_copied"] for _, v in calls) <= result.bytes_copied


def test_drop_ducklake_tables_for_rollback(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks
) -> None:
    pair = catalog_pair(tables=3)
    _run(pair, hooks).release.release()
    with pair.su("target") as conn:
        conn.execute("CREATE TABLE not_ducklake (a int)")
    rollback_hooks = RecordingHooks()
    conn = pair.target_factory()()
    try:
        dropped = drop_ducklake_tables(conn, rollback_hooks)
    finally:
        conn.close()
    assert dropped == sorted(pair.source_tables)
    assert rollback_hooks.irreversible_calls == len(dropped)
    assert rollback_hooks.messages() == [f"dropped {t} on the target" for t in dropped]
    assert pair.checksums("target") == {}
    with pair.su("target") as su:
        assert su.execute("SELECT to_regclass('public.not_ducklake') IS NOT NULL").fetchone() == (
            True,
        )


def test_parallel_copy_equals_sequential(catalog_pair: CatalogPairFactory) -> None:
    pair = catalog_pair(tables=20, inlined_every=2)
    _run(pair, RecordingHooks(), parallelism=1).release.release()
    sequential = (pair.checksums("target"), pair.schema_objects("target"))
    _run(pair, RecordingHooks(), parallelism=4).release.release()
    assert (pair.checksums("target"), pair.schema_objects("target")) == sequential
    assert sequential[0] == pair.checksums("source")


def test_parallel_copy_splits_large_tables_into_page_ranges(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables above 2 x CHUNK_BYTES are streamed by several helpers as TID ranges; the rows
    arrive exactly once and the table is logged once with its total."""
    pair = catalog_pair(tables=40, inlined_every=0, files=8, columns=6)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 8 * 8192)
    src = pair.source_factory()()
    try:
        plan = parallel.plan_chunks(src, list(pair.source_tables), 8 * 8192)
    finally:
        src.close()
    stats = plan["ducklake_file_column_stats"]
    assert len(stats) > 3
    assert stats[0].pages is not None
    assert stats[0].pages[0] == 0
    assert stats[-1].pages is not None
    assert stats[-1].pages[1] is None
    assert plan["ducklake_metadata"] == [parallel.Chunk("ducklake_metadata", None)]
    result = _run(pair, hooks, parallelism=3)
    result.release.release()
    assert pair.checksums("target") == pair.checksums("source")
    rows = pair.checksums("source")["ducklake_file_column_stats"][0]
    lines = [m for m in hooks.messages() if m.startswith("copied ducklake_file_column_stats:")]
    assert len(lines) == 1
    assert lines[0].startswith(f"copied ducklake_file_column_stats: {rows} rows, ")
    assert hooks.progress_calls[-1][1]["tables_done"] <= len(pair.source_tables)
