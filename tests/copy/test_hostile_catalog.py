"""Hostile source catalogs (safeguard reshard-60): nothing the source answers is executed as SQL
on the target, the target's catalog work runs logged in as the tenant, and a tenant's planted
row-security policy never runs in the copy's or the verification's sessions.

(a) Hostile rows are fed at the introspection seam (``reshard.engines.copy.introspection.read_*``:
what a hostile source server would answer to the catalog queries) into the real copy from 5433 to
5434: the copy fails naming the object before its first target statement, and the ``CREATE ROLE``
the rows carry never runs anywhere. (b) A real source whose tenant planted a ``FORCE ROW LEVEL
SECURITY`` policy calling a ``SECURITY INVOKER`` function that runs ``RESET ROLE`` and
``CREATE ROLE``: the function never runs (its non-transactional sequence stays unused), the
role never exists.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reshard.engines.copy import introspection, pump
from reshard.engines.copy.base import CopyError
from reshard.engines.copy.catalog import copy_catalog
from reshard.engines.copy.introspection import ColumnRow, ConstraintRow, IndexRow, TableRow
from reshard.engines.verify import VerifyError, verify_ducklake
from tests.fixtures.catalog_pair import CatalogPair, CatalogPairFactory
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.hostile import evil_calls, plant_policy, role_exists
from tests.fixtures.stores import StoreClusters

pytestmark = pytest.mark.safeguard("reshard-60")


def _target_tables(pair: CatalogPair) -> list[str]:
    with pair.su("target") as conn:
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]


def _injection(role: str) -> str:
    """What a hostile source pastes into a catalog answer."""
    return f"int4); RESET ROLE; CREATE ROLE {role} LOGIN SUPERUSER; CREATE TABLE ducklake_z (y int"


def _hostile_type(role: str) -> Callable[[list[ColumnRow]], list[ColumnRow]]:
    def change(rows: list[ColumnRow]) -> list[ColumnRow]:
        first = next(i for i, r in enumerate(rows) if r.table == "ducklake_metadata")
        rows[first] = dataclasses.replace(rows[first], type_name=_injection(role))
        return rows

    return change


def _hostile_type_schema(role: str) -> Callable[[list[ColumnRow]], list[ColumnRow]]:
    def change(rows: list[ColumnRow]) -> list[ColumnRow]:
        first = next(i for i, r in enumerate(rows) if r.table == "ducklake_metadata")
        rows[first] = dataclasses.replace(rows[first], type_schema=f"public; CREATE ROLE {role}")
        return rows

    return change


def _hostile_default(role: str) -> Callable[[list[ColumnRow]], list[ColumnRow]]:
    """A node tree that looks like a constant, with a deparsed text that is not one."""
    node = (
        "{CONST :consttype 20 :consttypmod -1 :constcollid 0 :constlen 8 :constbyval true "
        ":constisnull false :location 7 :constvalue 8 [ 0 0 0 0 0 0 0 0 ]}"
    )

    def change(rows: list[ColumnRow]) -> list[ColumnRow]:
        first = next(i for i, r in enumerate(rows) if r.table == "ducklake_snapshot")
        rows[first] = dataclasses.replace(
            rows[first], default_node=node, default_text=f"0; RESET ROLE; CREATE ROLE {role}"
        )
        return rows

    return change


def _function_default(role: str) -> Callable[[list[ColumnRow]], list[ColumnRow]]:
    """A real-looking default that calls a function (``nextval``, ``now()``, a tenant's)."""

    def change(rows: list[ColumnRow]) -> list[ColumnRow]:
        first = next(i for i, r in enumerate(rows) if r.table == "ducklake_snapshot")
        rows[first] = dataclasses.replace(
            rows[first],
            default_node="{FUNCEXPR :funcid 1299 :funcresulttype 1184 :funcretset false "
            ":funcvariadic false :funcformat 0 :funccollid 0 :inputcollid 0 :args <> "
            ":location 230}",
            default_text=f"public.evil_{role}()",
        )
        return rows

    return change


def _check_constraint(role: str) -> Callable[[list[ConstraintRow]], list[ConstraintRow]]:
    def change(rows: list[ConstraintRow]) -> list[ConstraintRow]:
        return [*rows, ConstraintRow(
            "ducklake_snapshot", f"c; CREATE ROLE {role}", "c", (1,), None, None, (), " ", " ",
            " ", False, True, False, None,
        )]  # fmt: skip

    return change


def _foreign_key_outside(role: str) -> Callable[[list[ConstraintRow]], list[ConstraintRow]]:
    def change(rows: list[ConstraintRow]) -> list[ConstraintRow]:
        return [*rows, ConstraintRow(
            "ducklake_snapshot", "fk_out", "f", (1,), "pg_catalog", "pg_authid", (1,), "a", "a",
            "s", False, True, False, None,
        )]  # fmt: skip

    return change


def _expression_index(role: str) -> Callable[[list[IndexRow]], list[IndexRow]]:
    def change(rows: list[IndexRow]) -> list[IndexRow]:
        return [*rows, IndexRow("ducklake_snapshot", f"ix; CREATE ROLE {role}", False, "btree",
                                (0,), (0,), False)]  # fmt: skip

    return change


def _hash_index(role: str) -> Callable[[list[IndexRow]], list[IndexRow]]:
    def change(rows: list[IndexRow]) -> list[IndexRow]:
        return [*rows, IndexRow("ducklake_snapshot", "ix_hash", False, "hash", (1,), (0,), True)]

    return change


def _view(role: str) -> Callable[[list[TableRow]], list[TableRow]]:
    def change(rows: list[TableRow]) -> list[TableRow]:
        return [dataclasses.replace(r, relkind="p") if r.name == "ducklake_table" else r
                for r in rows]  # fmt: skip

    return change


def _foreign_table(role: str) -> Callable[[list[str]], list[str]]:
    """The discovery answer names a table outside the catalog (the copy would drop it)."""

    def change(rows: list[str]) -> list[str]:
        return [*rows, f"pg_authid; CREATE ROLE {role}"]

    return change


CASES: list[tuple[str, str, Callable[[str], Callable[[list[Any]], list[Any]]], str]] = [
    ("type", "read_columns", _hostile_type, "column 'key' of 'ducklake_metadata'"),
    ("type-schema", "read_columns", _hostile_type_schema, "column 'key' of 'ducklake_metadata'"),
    ("default-text", "read_columns", _hostile_default,
     "the default of column 'snapshot_id' of 'ducklake_snapshot'"),
    ("default-function", "read_columns", _function_default,
     "the default of column 'snapshot_id' of 'ducklake_snapshot'"),
    ("check", "read_constraints", _check_constraint, "constraint 'c; CREATE ROLE"),
    ("fk-outside", "read_constraints", _foreign_key_outside,
     "constraint 'fk_out' on 'ducklake_snapshot'"),
    ("expression-index", "read_indexes", _expression_index, "index 'ix; CREATE ROLE"),
    ("hash-index", "read_indexes", _hash_index, "index 'ix_hash' on 'ducklake_snapshot'"),
    ("partitioned", "read_tables", _view, "table 'ducklake_table'"),
    ("foreign-table", "discover_tables", _foreign_table, "table 'pg_authid; CREATE ROLE"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "seam", "make", "names"), CASES, ids=[c[0] for c in CASES])
def test_hostile_catalog_rows_fail_the_copy_before_any_target_statement(
    catalog_pair: CatalogPairFactory,
    hooks: RecordingHooks,
    monkeypatch: pytest.MonkeyPatch,
    store_clusters: StoreClusters,
    case: str,
    seam: str,
    make: Callable[[str], Callable[[list[Any]], list[Any]]],
    names: str,
) -> None:
    pair = catalog_pair(tables=3, inlined_every=0)
    backdoor = f"backdoor_{secrets.token_hex(4)}"
    real = getattr(introspection, seam)
    change = make(backdoor)
    if seam == "discover_tables":
        monkeypatch.setattr(introspection, seam, lambda conn: change(list(real(conn))))
    else:
        monkeypatch.setattr(
            introspection, seam, lambda conn, tables: change(list(real(conn, tables)))
        )
    with pytest.raises(CopyError) as info:
        copy_catalog(pair.source_factory(), pair.target_factory(), hooks, parallelism=2)
    text = str(info.value)
    assert text.startswith("refusing to copy: "), text
    assert names in text
    assert "nothing was written to the target" in text
    # Nothing ran on the target: no DROP was sent (no pre-statement heartbeat), no table, no role.
    assert hooks.irreversible_calls == 0
    assert _target_tables(pair) == []
    for cluster in store_clusters:
        assert not role_exists(cluster, backdoor)
    assert hooks.registered == []
    assert pair.activity() == []


def test_hostile_names_are_only_ever_identifiers(
    catalog_pair: CatalogPairFactory,
    hooks: RecordingHooks,
    monkeypatch: pytest.MonkeyPatch,
    store_clusters: StoreClusters,
) -> None:
    """A name is data: an index named like an injection is created under that very name."""
    pair = catalog_pair(tables=2, inlined_every=0)
    backdoor = f"backdoor_{secrets.token_hex(4)}"
    name = f'x" ON public.ducklake_snapshot (snapshot_id); CREATE ROLE {backdoor}; --'
    real = introspection.read_indexes

    def hostile(conn: Any, tables: Any) -> list[IndexRow]:
        return [*real(conn, tables),
                IndexRow("ducklake_snapshot", name, False, "btree", (1,), (0,), True)]  # fmt: skip

    monkeypatch.setattr(introspection, "read_indexes", hostile)
    copy_catalog(pair.source_factory(), pair.target_factory(), hooks).release.release()
    with pair.su("target") as conn:
        row = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name[:63],)
        ).fetchone()
    assert row is not None
    for cluster in store_clusters:
        assert not role_exists(cluster, backdoor)


def test_the_target_ddl_is_composed_from_checked_values(catalog_pair: CatalogPairFactory) -> None:
    """Types with modifiers, arrays, defaults, keys and index options round-trip exactly."""
    pair = catalog_pair(tables=2, inlined_every=0)
    with pair.su("source") as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(pair.role)))
        conn.execute(
            "CREATE TABLE ducklake_shapes (id bigint PRIMARY KEY DEFAULT 0, n numeric(12, 3), "
            "v varchar(40) NOT NULL, w varchar DEFAULT 'it''s', c bpchar(3), t timestamptz(3), "
            "flag boolean DEFAULT true, tags text[], neg integer DEFAULT -7, u uuid UNIQUE, "
            "j jsonb, snap bigint REFERENCES ducklake_snapshot (snapshot_id) ON DELETE CASCADE)"
        )
        conn.execute("CREATE UNIQUE INDEX ducklake_shapes_nv ON ducklake_shapes (n DESC, v)")
        conn.execute("CREATE INDEX ducklake_shapes_t ON ducklake_shapes (t NULLS FIRST)")
        conn.execute(
            "INSERT INTO ducklake_shapes (id, n, v, c, t, tags, u, snap) VALUES "
            "(1, 1.5, 'vé', 'ab', now(), ARRAY['a', NULL], gen_random_uuid(), 1)"
        )
    copy_catalog(pair.source_factory(), pair.target_factory(), RecordingHooks()).release.release()

    def shape(side: str) -> list[tuple[Any, ...]]:
        with pair.su(side) as conn:
            return conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
                "pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a LEFT JOIN pg_attrdef d "
                "ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                "WHERE a.attrelid = 'public.ducklake_shapes'::regclass AND a.attnum > 0 "
                "ORDER BY a.attnum"
            ).fetchall()

    assert shape("target") == shape("source")
    assert pair.schema_objects("target") == pair.schema_objects("source")
    assert pair.checksums("target") == pair.checksums("source")


# --- (b) a planted row-security policy -----------------------------------------------------------


def test_a_planted_row_security_policy_never_runs_in_the_copy(
    catalog_pair: CatalogPairFactory, hooks: RecordingHooks, store_clusters: StoreClusters
) -> None:
    pair = catalog_pair(tables=2, inlined_every=0)
    backdoor = f"backdoor_{secrets.token_hex(4)}"
    plant_policy(store_clusters.source, pair.database, pair.role, backdoor)
    # The runner's cnpg source session: the provisioner with SET ROLE tenant (the factory).
    with pytest.raises(CopyError) as info:
        copy_catalog(pair.source_factory(), pair.target_factory(), hooks)
    assert "row-level security" in str(info.value)
    assert "ducklake_metadata" in str(info.value)
    assert evil_calls(store_clusters.source, pair.database) == (False, False)
    for cluster in store_clusters:
        assert not role_exists(cluster, backdoor)
    assert hooks.registered == []


def test_a_planted_row_security_policy_never_runs_in_the_verification(
    catalog_pair: CatalogPairFactory, store_clusters: StoreClusters
) -> None:
    """Verification pins its own sessions: here the source session comes straight from the
    factory (provisioner + SET ROLE, nothing pinned), inside a REPEATABLE READ snapshot like
    the release handle's."""
    pair = catalog_pair(tables=2, inlined_every=0)
    backdoor = f"backdoor_{secrets.token_hex(4)}"
    plant_policy(store_clusters.source, pair.database, pair.role, backdoor)
    source = pair.source_factory()()
    target = pair.target_factory()()
    try:
        source.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(VerifyError) as info:
            verify_ducklake(source, target)
        assert info.value.check == "read"
        assert "row-level security" in str(info.value)
    finally:
        for conn in (source, target):
            conn.close()
    assert evil_calls(store_clusters.source, pair.database) == (False, False)
    for cluster in store_clusters:
        assert not role_exists(cluster, backdoor)


def test_copy_sessions_pin_search_path_and_row_security(catalog_pair: CatalogPairFactory) -> None:
    pair = catalog_pair(tables=2, inlined_every=0)
    seen: list[tuple[str, str]] = []
    real = pump.stream_table

    def spy(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], *a: Any, **k: Any) -> Any:
        for conn in (src, tgt):
            row = conn.execute(
                "SELECT current_setting('search_path'), current_setting('row_security')"
            ).fetchone()
            assert row is not None
            seen.append((str(row[0]), str(row[1])))
        return real(src, tgt, *a, **k)

    import unittest.mock

    with unittest.mock.patch.object(pump, "stream_table", spy):
        copy_catalog(
            pair.source_factory(), pair.target_factory(), RecordingHooks()
        ).release.release()
    assert seen
    assert set(seen) == {("", "off")}
