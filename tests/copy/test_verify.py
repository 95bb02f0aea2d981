"""DuckLake-aware verification after a real copy (spec reshard §4.4 J; safeguard 54)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from reshard.engines.copy.catalog import copy_catalog
from reshard.engines.verify import DuckLakeState, VerifyError, compare, read_state, verify_ducklake
from tests.fixtures.catalog_pair import CatalogPair, CatalogPairFactory
from tests.fixtures.hooks import RecordingHooks


def _copy_then_verify(
    pair: CatalogPair,
    tamper: Callable[[psycopg.Connection[Any]], object] | None = None,
    parallelism: int = 1,
) -> str:
    """Copy, optionally change the target as its tenant, verify with the source read inside
    the still-open snapshot (the release handle's connection)."""
    result = copy_catalog(
        pair.source_factory(), pair.target_factory(), RecordingHooks(), parallelism=parallelism
    )
    try:
        if tamper is not None:
            with pair.su("target") as conn:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(pair.role)))
                tamper(conn)
        target = pair.target_factory()()
        try:
            return verify_ducklake(result.release.connection, target).message
        finally:
            target.close()
    finally:
        result.release.release()


@pytest.mark.safeguard("reshard-54")
@pytest.mark.parametrize("parallelism", [1, 2])
def test_an_untouched_copy_passes_and_names_the_snapshot(
    catalog_pair: CatalogPairFactory, parallelism: int
) -> None:
    pair = catalog_pair(tables=6, inlined_every=3, files=3)
    message = _copy_then_verify(pair, parallelism=parallelism)
    # 6 tables → snapshots 0..12; 3 files each; 6 distinct metadata keys.
    assert message == "DuckLake verification passed: snapshot 12, 18 data files, 6 metadata keys"


@pytest.mark.safeguard("reshard-54")
def test_a_deleted_data_file_fails_naming_data_files(catalog_pair: CatalogPairFactory) -> None:
    pair = catalog_pair(tables=6, inlined_every=0, files=3)
    with pytest.raises(VerifyError) as info:
        _copy_then_verify(
            pair, lambda c: c.execute("DELETE FROM ducklake_data_file WHERE data_file_id = 7")
        )
    assert info.value.check == "data_files"
    text = str(info.value)
    assert text.startswith("DuckLake verification failed: data_files: source 18 files (md5 ")
    assert ", target 17 files (md5 " in text


@pytest.mark.safeguard("reshard-54")
def test_an_altered_metadata_value_fails_naming_the_key(catalog_pair: CatalogPairFactory) -> None:
    pair = catalog_pair(tables=3, inlined_every=0)
    with pytest.raises(VerifyError) as info:
        _copy_then_verify(
            pair,
            lambda c: c.execute("UPDATE ducklake_metadata SET value = '0.2' WHERE key = 'version'"),
        )
    assert info.value.check == "metadata"
    assert str(info.value) == (
        "DuckLake verification failed: metadata: source {version='0.3'}, "
        "target {version='0.2'} (differing keys: version)"
    )


@pytest.mark.safeguard("reshard-54")
def test_a_newer_snapshot_on_the_target_fails_naming_snapshot_id(
    catalog_pair: CatalogPairFactory,
) -> None:
    pair = catalog_pair(tables=3, inlined_every=0)
    with pytest.raises(VerifyError) as info:
        _copy_then_verify(
            pair,
            lambda c: c.execute("INSERT INTO ducklake_snapshot VALUES (99, now(), 3, 10, 10)"),
        )
    assert info.value.check == "snapshot_id"
    assert str(info.value) == "DuckLake verification failed: snapshot_id: source 6, target 99"


@pytest.mark.safeguard("reshard-54")
def test_a_missing_table_fails_and_keeps_the_source_snapshot_usable(
    catalog_pair: CatalogPairFactory,
) -> None:
    pair = catalog_pair(tables=3, inlined_every=0)
    result = copy_catalog(pair.source_factory(), pair.target_factory(), RecordingHooks())
    try:
        with pair.su("target") as conn:
            conn.execute("DROP TABLE ducklake_metadata")
        target = pair.target_factory()()
        try:
            with pytest.raises(VerifyError) as info:
                verify_ducklake(result.release.connection, target)
            # The source transaction did not abort: the fence is still held and readable.
            state = read_state(result.release.connection)
        finally:
            target.close()
    finally:
        result.release.release()
    assert str(info.value) == (
        "DuckLake verification failed: metadata: source 6 keys, "
        "target table ducklake_metadata missing"
    )
    assert state.snapshot_id == 6


def test_compare_unit_orders_checks_and_tolerates_empty_catalogs() -> None:
    empty = DuckLakeState(None, 0, "d41d8cd98f00b204e9800998ecf8427e", frozenset())
    assert compare(empty, empty).message == (
        "DuckLake verification passed: snapshot none, 0 data files, 0 metadata keys"
    )
    source = DuckLakeState(5, 2, "a", frozenset({("k", "1"), ("j", "2")}))
    both_wrong = DuckLakeState(4, 1, "b", frozenset({("k", "1")}))
    with pytest.raises(VerifyError) as info:
        compare(source, both_wrong)
    assert info.value.check == "snapshot_id"
    extra_key = DuckLakeState(5, 2, "a", frozenset({("k", "1"), ("j", "2"), ("x", "3")}))
    with pytest.raises(VerifyError, match=r"\(differing keys: x\)$"):
        compare(source, extra_key)
