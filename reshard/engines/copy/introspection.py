"""Catalog introspection on the source: the introspection seam of the copy (safeguard reshard-60).

Everything the source answers is untrusted: a hostile or compromised source server, or a tenant
who planted objects in its own catalog database, controls these rows. They are read from
structured catalog columns only (type names, typmods, attnums, flags; never ``format_type``,
``pg_get_constraintdef`` or ``indexdef`` text). The ``read_*`` functions are the seam tests feed
hostile rows at; every caller reaches them through this module, so a patched seam is the one the
copy uses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reshard.engines.copy.base import Connection, CopyError, show

_DISCOVER = """
SELECT table_name::text FROM information_schema.tables
WHERE table_schema = 'public' AND table_type = 'BASE TABLE'
  AND table_name LIKE 'ducklake\\_%'
ORDER BY table_name COLLATE "C"
"""


_TABLES = """
SELECT c.relname::text, c.relkind::text, c.relispartition, c.reloftype <> 0
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relname = ANY(%s)
ORDER BY c.relname
"""


_COLUMN_FIELDS = """
SELECT c.relname::text, a.attnum::int, a.attname::text,
       tn.nspname::text, t.typname::text, t.typtype::text, t.typcategory::text,
       en.nspname::text, e.typname::text, a.atttypmod::int, a.attnotnull,
       a.attidentity::text, a.attgenerated::text,
       a.attcollation = 0 OR a.attcollation = t.typcollation
         OR (t.typcategory = 'A' AND a.attcollation = e.typcollation),
       d.adbin::text, pg_get_expr(d.adbin, d.adrelid), c.oid::int8
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_namespace tn ON tn.oid = t.typnamespace
LEFT JOIN pg_type e ON t.typcategory = 'A' AND e.oid = t.typelem
LEFT JOIN pg_namespace en ON en.oid = e.typnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = 'public' AND c.relname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""
_COLUMNS = _COLUMN_FIELDS + "ORDER BY c.relname, a.attnum"
# The same rows, one md5 per table over their text in attnum order, computed by the server: at
# 2,029 tables (18,190 columns) half the time of reading them (0.10 s against 0.19 s). Each row
# carries its table's oid (read_columns ignores it), so a table dropped and created again under
# its name digests differently even with the same columns.
_COLUMN_DIGESTS = f"""
SELECT r.relname, pg_catalog.md5(pg_catalog.string_agg(r::text, '|' ORDER BY r.attnum))
FROM ({_COLUMN_FIELDS}) AS r(relname, attnum) GROUP BY r.relname
"""


# Whether an index (alias ``x``, its relation ``xc``) is a plain b-tree over columns: no
# expressions, predicate, INCLUDE columns, storage options, NULLS NOT DISTINCT (PostgreSQL 15+,
# read through to_jsonb so every server version answers), explicit collations or non-default
# operator classes.
_PLAIN_INDEX = """(
  am.amname = 'btree' AND x.indexprs IS NULL AND x.indpred IS NULL
  AND x.indnatts = x.indnkeyatts AND xc.reloptions IS NULL
  AND NOT coalesce((to_jsonb(x) ->> 'indnullsnotdistinct')::boolean, false)
  AND NOT EXISTS (SELECT 1 FROM unnest(x.indclass::oid[]) AS k(opc)
                  JOIN pg_opclass o ON o.oid = k.opc WHERE NOT o.opcdefault)
  AND NOT EXISTS (SELECT 1 FROM unnest(x.indcollation::oid[], x.indkey::int2[]) AS k(coll, num)
                  LEFT JOIN pg_attribute ka ON ka.attrelid = x.indrelid AND ka.attnum = k.num
                  WHERE k.coll <> 0 AND k.coll IS DISTINCT FROM ka.attcollation))"""


# contype is the internal "char" type: cast to text, or psycopg hands back bytes (safeguard 32).
_CONSTRAINTS = f"""
SELECT c.relname::text, con.conname::text, con.contype::text, con.conkey::int[],
       rn.nspname::text, r.relname::text, con.confkey::int[],
       con.confupdtype::text, con.confdeltype::text, con.confmatchtype::text,
       con.condeferrable, con.convalidated,
       coalesce((to_jsonb(con) ->> 'conperiod')::boolean, false)
         OR coalesce(to_jsonb(con) -> 'confdelsetcols', 'null') <> 'null',
       CASE WHEN con.conindid = 0 THEN NULL ELSE coalesce((
         SELECT {_PLAIN_INDEX} FROM pg_index x JOIN pg_class xc ON xc.oid = x.indexrelid
         JOIN pg_am am ON am.oid = xc.relam WHERE x.indexrelid = con.conindid), false) END
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_class r ON r.oid = con.confrelid
LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace
WHERE n.nspname = 'public' AND c.relname = ANY(%s)
ORDER BY c.relname, con.conname
"""


_INDEXES = f"""
SELECT c.relname::text, xc.relname::text, x.indisunique, am.amname::text,
       x.indkey::int2[]::int[], x.indoption::int2[]::int[], {_PLAIN_INDEX}
FROM pg_index x
JOIN pg_class xc ON xc.oid = x.indexrelid
JOIN pg_am am ON am.oid = xc.relam
JOIN pg_class c ON c.oid = x.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relname = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = x.indexrelid
                  AND con.contype IN ('p', 'u', 'x'))
ORDER BY c.relname, xc.relname
"""


@dataclass(frozen=True)
class TableRow:
    """One ``pg_class`` row as the source answered it (untrusted)."""

    name: str
    relkind: str
    is_partition: bool
    typed: bool


@dataclass(frozen=True)
class ColumnRow:
    """One ``pg_attribute`` row (with its type and default) as the source answered it."""

    table: str
    attnum: int
    name: str
    type_schema: str
    type_name: str
    type_kind: str  # typtype
    type_category: str  # typcategory ('A': array)
    element_schema: str | None
    element_name: str | None
    type_mod: int
    not_null: bool
    identity: str
    generated: str
    plain_collation: bool
    default_node: str | None  # pg_attrdef.adbin as text (a node tree): the default's shape
    default_text: str | None  # pg_get_expr: parsed with a strict grammar, never executed


@dataclass(frozen=True)
class ConstraintRow:
    """One ``pg_constraint`` row as the source answered it."""

    table: str
    name: str
    contype: str
    keys: tuple[int, ...]
    ref_schema: str | None
    ref_table: str | None
    ref_keys: tuple[int, ...]
    on_update: str
    on_delete: str
    match: str
    deferrable: bool
    validated: bool
    unsupported: bool  # WITHOUT OVERLAPS / ON DELETE SET NULL (cols)
    plain_index: bool | None  # the index behind a p/u/x constraint is a plain b-tree


@dataclass(frozen=True)
class IndexRow:
    """One ``pg_index`` row (not backing a constraint) as the source answered it."""

    table: str
    name: str
    unique: bool
    method: str
    keys: tuple[int, ...]
    options: tuple[int, ...]
    plain: bool


def discover_tables(conn: Connection) -> list[str]:
    """The ``ducklake_*`` base tables of ``public``, sorted (byte order)."""
    return [str(row[0]) for row in conn.execute(_DISCOVER).fetchall()]


def read_tables(conn: Connection, tables: Sequence[str]) -> list[TableRow]:
    return [
        TableRow(str(name), str(kind), bool(part), bool(typed))
        for name, kind, part, typed in conn.execute(_TABLES, (list(tables),))
    ]


def read_columns(conn: Connection, tables: Sequence[str]) -> list[ColumnRow]:
    return [
        ColumnRow(
            str(r[0]),
            int(r[1]),
            str(r[2]),
            str(r[3]),
            str(r[4]),
            str(r[5]),
            str(r[6]),
            _opt(r[7]),
            _opt(r[8]),
            int(r[9]),
            bool(r[10]),
            str(r[11]),
            str(r[12]),
            bool(r[13]),
            _opt(r[14]),
            _opt(r[15]),
        )
        for r in conn.execute(_COLUMNS, (list(tables),))
    ]


def read_column_digests(conn: Connection, tables: Sequence[str]) -> dict[str, str]:
    """A digest of each of ``tables``' columns as :func:`read_columns` reads them (a table
    with none is absent): what an equality check needs, without the rows."""
    return {str(t): str(d) for t, d in conn.execute(_COLUMN_DIGESTS, (list(tables),))}


def read_constraints(conn: Connection, tables: Sequence[str]) -> list[ConstraintRow]:
    rows: list[ConstraintRow] = []
    for r in conn.execute(_CONSTRAINTS, (list(tables),)):
        if not isinstance(r[2], str):  # safeguard 32: never a "char" decoded as bytes
            raise CopyError(f"constraint {show(r[1])} on {show(r[0])}: contype was not text")
        rows.append(
            ConstraintRow(
                str(r[0]),
                str(r[1]),
                r[2],
                _ints(r[3]),
                _opt(r[4]),
                _opt(r[5]),
                _ints(r[6]),
                str(r[7]),
                str(r[8]),
                str(r[9]),
                bool(r[10]),
                bool(r[11]),
                bool(r[12]),
                None if r[13] is None else bool(r[13]),
            )
        )
    return rows


def read_indexes(conn: Connection, tables: Sequence[str]) -> list[IndexRow]:
    return [
        IndexRow(str(r[0]), str(r[1]), bool(r[2]), str(r[3]), _ints(r[4]), _ints(r[5]), bool(r[6]))
        for r in conn.execute(_INDEXES, (list(tables),))
    ]


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def _ints(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise CopyError(f"catalog array value of unexpected type {type(value).__name__}")
    return tuple(int(v) for v in value)
