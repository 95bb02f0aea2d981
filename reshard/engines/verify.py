"""DuckLake-aware verification of a copied catalog (spec reshard §4.4 J; safeguard 54).

Row counts can match while the DuckLake state differs, so after the copy the runner compares,
on both sides:

1. ``snapshot_id``: ``max(snapshot_id)`` of ``ducklake_snapshot``;
2. ``data_files``: the count and an md5 of the ordered ``data_file_id`` list of
   ``ducklake_data_file``;
3. ``metadata``: the set of ``(key, value)`` pairs of ``ducklake_metadata``.

The source is read inside the copy's still-open ``REPEATABLE READ`` snapshot (the release
handle's connection, write fence held), so it sees exactly what was copied. A missing table is
detected with ``to_regclass`` before any read, so the source transaction never aborts (it still
holds the fence). Reads only: neither side is changed. The two sides are read at the same time,
one thread per connection (two servers: the window pays the slower side, not the sum).

Both sessions are pinned before the first read (``lib.pgadmin.pin_session``: ``search_path``
empty, ``row_security`` off; safeguard reshard-60): every name read is schema-qualified, so a
tenant's objects cannot shadow a built-in, and a row-security policy a tenant planted on a
``ducklake_*`` table fails the read (check ``read``) instead of running its code in a session
that may be the provisioner's behind ``SET ROLE``.

:func:`verify_ducklake` returns the passing :class:`Verification` (its ``message`` is the line
to log) or raises :class:`VerifyError` with "DuckLake verification failed: <check>: source
<value>, target <value>".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from duckgres_admin.lib.pgadmin import pin_session

Connection = psycopg.Connection[Any]
T = TypeVar("T")

_TABLES = ("ducklake_snapshot", "ducklake_data_file", "ducklake_metadata")


class VerifyError(Exception):
    """Verification failed; ``check`` is ``snapshot_id``, ``data_files`` or ``metadata``."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check


@dataclass(frozen=True)
class DuckLakeState:
    """What one side holds; ``missing`` lists absent tables (their values are then empty)."""

    snapshot_id: int | None
    data_files: int
    data_files_md5: str
    metadata: frozenset[tuple[str, str]]
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verification:
    snapshot_id: int | None
    data_files: int
    metadata_keys: int
    data_files_md5: str = ""
    metadata_md5: str = ""

    def fingerprint(self) -> dict[str, Any]:
        """What was verified, as stored on the operation (``catalog_fingerprint``): the restore
        test compares a restored backup against it (:func:`matches_fingerprint`)."""
        return {
            "snapshot_id": self.snapshot_id,
            "data_files": self.data_files,
            "data_files_md5": self.data_files_md5,
            "metadata_keys": self.metadata_keys,
            "metadata_md5": self.metadata_md5,
        }

    @property
    def message(self) -> str:
        return f"DuckLake verification passed: {self._figures()}"

    def restore_line(self, whose: str) -> str:
        """The line of a restore that matched ``whose`` fingerprint."""
        return f"DuckLake verification of the restore matches the {whose}: {self._figures()}"

    def _figures(self) -> str:
        return (
            f"snapshot {_fmt_snapshot(self.snapshot_id)}, {self.data_files} data files, "
            f"{self.metadata_keys} metadata keys"
        )


def read_state(conn: Connection) -> DuckLakeState:
    """Read the three checks' values on one side (``public`` schema, read-only statements, the
    session pinned first)."""
    pin_session(conn)
    present = conn.execute(
        "SELECT t, pg_catalog.to_regclass('public.' || pg_catalog.quote_ident(t)) IS NOT NULL "
        "FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS t",
        (list(_TABLES),),
    ).fetchall()
    missing = tuple(str(name) for name, ok in present if not ok)
    snapshot_id: int | None = None
    files, files_md5 = 0, ""
    metadata: frozenset[tuple[str, str]] = frozenset()
    if "ducklake_snapshot" not in missing:
        row = conn.execute("SELECT max(snapshot_id) FROM public.ducklake_snapshot").fetchone()
        snapshot_id = None if row is None or row[0] is None else int(row[0])
    if "ducklake_data_file" not in missing:
        row = conn.execute(
            "SELECT count(*), md5(coalesce(string_agg(data_file_id::text, ',' "
            "ORDER BY data_file_id), '')) FROM public.ducklake_data_file"
        ).fetchone()
        assert row is not None
        files, files_md5 = int(row[0]), str(row[1])
    if "ducklake_metadata" not in missing:
        metadata = frozenset(
            (str(k), str(v))
            for k, v in conn.execute("SELECT key, value FROM public.ducklake_metadata")
        )
    return DuckLakeState(snapshot_id, files, files_md5, metadata, missing)


def compare(source: DuckLakeState, target: DuckLakeState) -> Verification:
    """Raise :class:`VerifyError` on the first differing check (in the spec's order)."""
    for table, check in zip(_TABLES, ("snapshot_id", "data_files", "metadata"), strict=True):
        if table in source.missing or table in target.missing:
            raise VerifyError(
                check,
                f"DuckLake verification failed: {check}: source {_side(source, table, check)}, "
                f"target {_side(target, table, check)}",
            )
    if source.snapshot_id != target.snapshot_id:
        raise VerifyError(
            "snapshot_id",
            "DuckLake verification failed: snapshot_id: "
            f"source {_fmt_snapshot(source.snapshot_id)}, "
            f"target {_fmt_snapshot(target.snapshot_id)}",
        )
    if (source.data_files, source.data_files_md5) != (target.data_files, target.data_files_md5):
        raise VerifyError(
            "data_files",
            "DuckLake verification failed: data_files: "
            f"source {_fmt_files(source)}, target {_fmt_files(target)}",
        )
    if source.metadata != target.metadata:
        differing = sorted({k for k, _ in source.metadata ^ target.metadata})
        raise VerifyError(
            "metadata",
            "DuckLake verification failed: metadata: "
            f"source {_fmt_pairs(source.metadata, differing)}, "
            f"target {_fmt_pairs(target.metadata, differing)} "
            f"(differing keys: {', '.join(differing)})",
        )
    return summary(source)


def summary(state: DuckLakeState) -> Verification:
    """One side's state as the record a verification keeps (its fingerprint)."""
    return Verification(
        state.snapshot_id,
        state.data_files,
        len({key for key, _ in state.metadata}),
        state.data_files_md5,
        metadata_md5(state.metadata),
    )


def metadata_md5(pairs: frozenset[tuple[str, str]]) -> str:
    """An order-free digest of the ``ducklake_metadata`` pairs."""
    digest = hashlib.md5(usedforsecurity=False)
    for key, value in sorted(pairs):
        digest.update(f"{len(key)}:{key}{len(value)}:{value}".encode())
    return digest.hexdigest()


def matches_fingerprint(state: DuckLakeState, fingerprint: Mapping[str, Any]) -> Verification:
    """Compare a restored catalog with the fingerprint its operation recorded; raise
    :class:`VerifyError` ("... source <recorded>, target <restored>") on the first difference."""
    for table, check in zip(_TABLES, ("snapshot_id", "data_files", "metadata"), strict=True):
        if table in state.missing:
            raise VerifyError(
                check,
                f"DuckLake verification failed: {check}: recorded {_recorded(fingerprint, check)}, "
                f"restored table {table} missing",
            )
    restored = Verification(
        state.snapshot_id,
        state.data_files,
        len({key for key, _ in state.metadata}),
        state.data_files_md5,
        metadata_md5(state.metadata),
    )
    if fingerprint.get("snapshot_id") != restored.snapshot_id:
        raise VerifyError(
            "snapshot_id",
            "DuckLake verification failed: snapshot_id: recorded "
            f"{_recorded(fingerprint, 'snapshot_id')}, restored {_fmt_snapshot(state.snapshot_id)}",
        )
    if (fingerprint.get("data_files"), fingerprint.get("data_files_md5")) != (
        restored.data_files,
        restored.data_files_md5,
    ):
        raise VerifyError(
            "data_files",
            "DuckLake verification failed: data_files: recorded "
            f"{_recorded(fingerprint, 'data_files')}, restored {_fmt_files(state)}",
        )
    if fingerprint.get("metadata_md5") != restored.metadata_md5:
        raise VerifyError(
            "metadata",
            "DuckLake verification failed: metadata: recorded "
            f"{_recorded(fingerprint, 'metadata')}, restored {restored.metadata_keys} keys "
            f"(md5 {restored.metadata_md5})",
        )
    return restored


def check_restore(state: DuckLakeState, fingerprint: Any) -> Verification | None:
    """A restored catalog against the fingerprint its backup's operation recorded; None when
    that operation recorded none and the weaker check passed (the three DuckLake tables are
    present). Raises :class:`VerifyError` otherwise."""
    if isinstance(fingerprint, Mapping):
        return matches_fingerprint(state, fingerprint)
    if state.missing:
        raise VerifyError("tables", f"the restored catalog lacks {', '.join(state.missing)}")
    return None


def _recorded(fingerprint: Mapping[str, Any], check: str) -> str:
    if check == "snapshot_id":
        value = fingerprint.get("snapshot_id")
        return "none" if value is None else str(value)
    if check == "data_files":
        return f"{fingerprint.get('data_files')} files (md5 {fingerprint.get('data_files_md5')})"
    return f"{fingerprint.get('metadata_keys')} keys (md5 {fingerprint.get('metadata_md5')})"


def _on_both(
    read: Callable[[Connection], T], source: Connection, target: Connection
) -> tuple[Future[T], Future[T]]:
    """``read`` on both sides at the same time (two servers: the window pays the slower side,
    not the sum); each connection is used by one thread only, and both reads have ended when
    this returns. The futures hold each side's result or error."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
        return pool.submit(read, source), pool.submit(read, target)


def verify_ducklake(source_conn: Connection, target_conn: Connection) -> Verification:
    """Read both sides and compare; ``source_conn`` should be ``ReleaseHandle.connection``."""
    left, right = _on_both(read_state, source_conn, target_conn)
    try:
        source = left.result()
    except psycopg.Error as exc:
        raise VerifyError(
            "read", f"DuckLake verification could not read the source: {exc}"
        ) from exc
    try:
        target = right.result()
    except psycopg.Error as exc:
        raise VerifyError(
            "read", f"DuckLake verification could not read the target: {exc}"
        ) from exc
    return compare(source, target)


def _fmt_snapshot(value: int | None) -> str:
    return "none" if value is None else str(value)


def _fmt_files(state: DuckLakeState) -> str:
    return f"{state.data_files} files (md5 {state.data_files_md5})"


def _fmt_pairs(pairs: Iterable[tuple[str, str]], keys: list[str]) -> str:
    wanted = set(keys)
    shown = sorted((k, v) for k, v in pairs if k in wanted)
    return "{" + ", ".join(f"{k}={v!r}" for k, v in shown) + "}"


def _side(state: DuckLakeState, table: str, check: str) -> str:
    if table in state.missing:
        return f"table {table} missing"
    if check == "snapshot_id":
        return _fmt_snapshot(state.snapshot_id)
    if check == "data_files":
        return _fmt_files(state)
    return f"{len(state.metadata)} keys"


# --- the whole catalog, row by row (the online mode's proof of equality) -------------------------
# Per table: the row count and an order-free digest of its rows (the sum of the first 64 bits of
# each row's md5, as numeric: constant memory whatever the table's size). The session's output
# settings are pinned first so both sides print every value the same way.
_OUTPUT_SETTINGS = (
    "SET TimeZone = 'UTC'",
    "SET DateStyle = 'ISO, MDY'",
    "SET IntervalStyle = 'postgres'",
    "SET extra_float_digits = 1",
    "SET bytea_output = 'hex'",
)
_DIGEST = (
    "SELECT pg_catalog.count(*), COALESCE(pg_catalog.sum(('x' OPERATOR(pg_catalog.||) "
    "pg_catalog.substr(pg_catalog.md5(t::pg_catalog.text), 1, 16))::pg_catalog.bit(64)"
    "::pg_catalog.int8::pg_catalog.numeric), 0)::pg_catalog.text FROM public.{} AS t"
)


@dataclass(frozen=True)
class TableComparison:
    """The whole-catalog comparison: ``differing`` is empty when every table matched."""

    tables: int
    rows: int
    differing: tuple[str, ...]

    @property
    def message(self) -> str:
        if not self.differing:
            return (
                f"whole-catalog comparison passed: {self.tables} tables, {self.rows} rows equal "
                "row by row (count and digest) between the fenced source and the target"
            )
        shown = ", ".join(self.differing[:10])
        more = f" and {len(self.differing) - 10} more" if len(self.differing) > 10 else ""
        return (
            f"whole-catalog comparison failed: {len(self.differing)} of {self.tables} tables "
            f"differ between the fenced source and the target ({shown}{more})"
        )


def _digests(conn: Connection, tables: Iterable[str]) -> dict[str, tuple[int, str]]:
    pin_session(conn)
    for statement in _OUTPUT_SETTINGS:
        conn.execute(statement)
    out: dict[str, tuple[int, str]] = {}
    for table in tables:
        row = conn.execute(sql.SQL(_DIGEST).format(sql.Identifier(table))).fetchone()
        assert row is not None
        out[table] = (int(row[0]), str(row[1]))
    return out


def _ducklake_tables(conn: Connection) -> list[str]:
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT c.relname::pg_catalog.text FROM pg_catalog.pg_class c JOIN "
            "pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
            "AND c.relkind = 'r' AND c.relname LIKE 'ducklake\\_%' ORDER BY 1"
        )
    ]


def compare_tables(source: Connection, target: Connection) -> TableComparison:
    """Every ``ducklake_*`` table of both sides, row by row, each side in the snapshot its
    connection is in (reads only). A table on one side only differs."""
    names_source, names_target = _ducklake_tables(source), _ducklake_tables(target)
    both = [t for t in names_source if t in set(names_target)]
    one_side = sorted(set(names_source) ^ set(names_target))
    sides = _on_both(lambda conn: _digests(conn, both), source, target)
    left, right = (side.result() for side in sides)
    differing = tuple(one_side + [t for t in both if left[t] != right[t]])
    rows = sum(count for count, _ in left.values())
    return TableComparison(len(set(names_source) | set(names_target)), rows, differing)
