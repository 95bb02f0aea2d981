"""The shapes a DuckLake catalog may contain, checked before anything reaches the target
(safeguard reshard-60): built-in types, integer/boolean/string constant defaults, primary keys,
unique constraints, foreign keys between copied tables, plain b-tree indexes. The target DDL is
composed from the checked values with ``sql.Identifier``/``sql.Literal`` and this module's own
keywords; any other shape fails the copy naming the object."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from reshard.engines.copy import introspection
from reshard.engines.copy.base import Connection, CopyError, show
from reshard.engines.copy.introspection import ColumnRow, ConstraintRow, IndexRow, TableRow

# pg_catalog base types a DuckLake catalog (its metadata tables and the inlined-data tables of
# DuckDB's types) can use, and how this module writes each in DDL (schema-qualified, so no
# SQL-standard spelling applies: ``pg_catalog.bpchar`` is unbounded, unlike ``char``).
_TYPE_SQL: Mapping[str, str] = {
    name: f"pg_catalog.{name}"
    for name in (
        "bool", "int2", "int4", "int8", "float4", "float8", "numeric", "text", "varchar",
        "bpchar", "bytea", "date", "time", "timetz", "timestamp", "timestamptz", "interval",
        "uuid", "json", "jsonb",
    )
}  # fmt: skip


_LENGTH_TYPES = frozenset({"varchar", "bpchar"})


_PRECISION_TYPES = frozenset({"time", "timetz", "timestamp", "timestamptz"})


_VARHDRSZ = 4


# Column defaults: integer, boolean and string constants only.
_INT_TYPE_OIDS = frozenset({20, 21, 23})  # int8, int2, int4


_BOOL_TYPE_OID = 16


_STRING_TYPE_OIDS = frozenset({25, 1042, 1043})  # text, bpchar, varchar


_CONST_NODE = re.compile(r"\{CONST :consttype (\d+) [^{}]*:constisnull (true|false) [^{}]*\}")


_CAST_NODE = re.compile(
    r"\{FUNCEXPR :funcid \d+ :funcresulttype (\d+) [^{}]*:funcformat 2 [^{}]*"
    r":args \((\{CONST [^{}]*\})\) [^{}]*\}"
)


_INT_TEXT = re.compile(r"'?(-?[0-9]{1,19})'?(?:::(?:smallint|integer|bigint))?")


_STRING_TEXT = re.compile(r"'((?:[^'\\]|'')*)'::(?:text|character varying|bpchar|character)")


_FK_ACTIONS: Mapping[str, str] = {
    "a": "NO ACTION",
    "r": "RESTRICT",
    "c": "CASCADE",
    "n": "SET NULL",
    "d": "SET DEFAULT",
}


_INDOPTION_DESC = 1


_INDOPTION_NULLS_FIRST = 2


@dataclass(frozen=True)
class Column:
    """A checked column: the composed type and default, never source text."""

    name: str
    type: sql.Composable
    default: sql.Composable | None
    not_null: bool


@dataclass(frozen=True)
class Constraint:
    """A checked constraint; ``clause`` (``PRIMARY KEY (…)``, ``UNIQUE (…)``, ``FOREIGN KEY …``)
    is composed from identifiers and this module's keywords."""

    name: str
    contype: str
    clause: sql.Composable


@dataclass(frozen=True)
class IndexDef:
    """A checked index; ``create`` is the composed ``CREATE [UNIQUE] INDEX … USING btree``."""

    name: str
    create: sql.Composed


@dataclass(frozen=True)
class Catalog:
    columns: dict[str, list[Column]]
    constraints: dict[str, list[Constraint]]
    indexes: dict[str, list[IndexDef]]


def _refuse(what: str, why: str) -> CopyError:
    return CopyError(
        f"refusing to copy: {what} is not a shape a DuckLake catalog contains ({why}); "
        "nothing was written to the target"
    )


def _column_type(col: ColumnRow) -> sql.Composable:
    what = f"column {show(col.name)} of {show(col.table)}"
    array = col.type_category == "A"
    schema, name = (col.element_schema, col.element_name) if array else (
        col.type_schema, col.type_name
    )  # fmt: skip
    if col.type_schema != "pg_catalog" or col.type_kind != "b" or schema != "pg_catalog":
        raise _refuse(what, f"type {show(col.type_schema)}.{show(col.type_name)} is not a "
                            "built-in base type")  # fmt: skip
    if name is None or name not in _TYPE_SQL:
        raise _refuse(what, f"type {show(name)}{'[]' if array else ''} is not one of "
                            f"{', '.join(sorted(_TYPE_SQL))}")  # fmt: skip
    base: sql.Composable = sql.SQL(_TYPE_SQL[name])
    mods = _type_mods(name, col.type_mod, what)
    if mods:
        base = sql.SQL("{}({})").format(base, sql.SQL(", ").join(sql.Literal(m) for m in mods))
    return sql.SQL("{}[]").format(base) if array else base


def _type_mods(name: str, typmod: int, what: str) -> list[int]:
    if typmod == -1:
        return []
    if name in _LENGTH_TYPES and typmod > _VARHDRSZ:
        return [typmod - _VARHDRSZ]
    if name in _PRECISION_TYPES and 0 <= typmod <= 6:
        return [typmod]
    if name == "numeric" and typmod >= _VARHDRSZ:
        raw = typmod - _VARHDRSZ
        precision, scale = (raw >> 16) & 0xFFFF, ((raw & 0x7FF) ^ 1024) - 1024
        if 1 <= precision <= 1000 and -1000 <= scale <= 1000:
            return [precision, scale]
    raise _refuse(what, f"type modifier {typmod} of {name}")


def _column_default(col: ColumnRow) -> sql.Composable | None:
    """An integer, boolean or string constant, recognised from the node tree (a bare constant,
    or an implicit integer cast of one) and its value read from the deparsed form with a strict
    grammar; it is written back as a literal. Anything else (functions, operators, casts to other
    types, strings with backslashes) is refused."""
    if col.default_node is None:
        return None
    what = f"the default of column {show(col.name)} of {show(col.table)}"
    node, text = col.default_node.strip(), (col.default_text or "").strip()
    const = _CONST_NODE.fullmatch(node)
    cast = _CAST_NODE.fullmatch(node)
    if cast is not None:
        const = _CONST_NODE.fullmatch(cast[2])
        if const is None or int(cast[1]) not in _INT_TYPE_OIDS:
            const = None
    refusal = _refuse(what, "only integer, boolean and string constants are allowed as defaults")
    if const is None or const[2] != "false":
        raise refusal
    type_oid = int(const[1])
    if type_oid == _BOOL_TYPE_OID and cast is None and text in ("true", "false"):
        return sql.SQL("true" if text == "true" else "false")
    number = _INT_TEXT.fullmatch(text)
    if type_oid in _INT_TYPE_OIDS and number is not None:
        return sql.Literal(int(number[1]))
    string = _STRING_TEXT.fullmatch(text)
    if type_oid in _STRING_TYPE_OIDS and cast is None and string is not None:
        return sql.Literal(string[1].replace("''", "'"))
    raise refusal


def _checked_column(col: ColumnRow) -> Column:
    what = f"column {show(col.name)} of {show(col.table)}"
    if col.identity or col.generated:
        raise _refuse(what, "identity and generated columns are not used by DuckLake")
    if not col.plain_collation:
        raise _refuse(what, "an explicit collation")
    return Column(col.name, _column_type(col), _column_default(col), col.not_null)


def _names(keys: Sequence[int], by_num: Mapping[int, str], what: str) -> list[str]:
    if not keys:
        raise _refuse(what, "no key columns")
    names = []
    for num in keys:
        if num not in by_num:
            raise _refuse(what, f"attribute number {num} is not a column of its table")
        names.append(by_num[num])
    return names


def _idents(names: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _checked_constraint(
    con: ConstraintRow, by_num: Mapping[str, Mapping[int, str]], tables: frozenset[str]
) -> Constraint | None:
    what = f"constraint {show(con.name)} on {show(con.table)}"
    if con.contype == "n":
        return None  # PostgreSQL 18's catalogued NOT NULL: CREATE TABLE carries it (safeguard 5)
    if con.contype not in ("p", "u", "f"):
        raise _refuse(what, f"constraint type {show(con.contype)}; only primary keys, unique "
                            "constraints and foreign keys are replayed")  # fmt: skip
    if con.deferrable or not con.validated or con.unsupported:
        raise _refuse(what, "deferrable, NOT VALID, WITHOUT OVERLAPS or column-list actions")
    cols = _idents(_names(con.keys, by_num[con.table], what))
    if con.contype in ("p", "u"):
        if con.plain_index is not True:
            raise _refuse(what, "its index is not a plain b-tree over columns")
        keyword = "PRIMARY KEY" if con.contype == "p" else "UNIQUE"
        return Constraint(con.name, con.contype, sql.SQL(keyword + " ({})").format(cols))
    if con.ref_schema != "public" or con.ref_table not in tables:
        raise _refuse(what, f"it references {show(con.ref_schema)}.{show(con.ref_table)}, "
                            "which is not a copied ducklake_* table")  # fmt: skip
    if con.on_update not in _FK_ACTIONS or con.on_delete not in _FK_ACTIONS:
        raise _refuse(what, "an unknown referential action")
    if con.match not in ("s", "f"):
        raise _refuse(what, "MATCH PARTIAL")
    ref_cols = _idents(_names(con.ref_keys, by_num[con.ref_table], what))
    clause = sql.SQL("FOREIGN KEY ({}) REFERENCES public.{} ({})").format(
        cols, sql.Identifier(con.ref_table), ref_cols
    )
    if con.match == "f":
        clause = sql.SQL("{} MATCH FULL").format(clause)
    if con.on_update != "a":
        clause = sql.SQL("{} ON UPDATE " + _FK_ACTIONS[con.on_update]).format(clause)
    if con.on_delete != "a":
        clause = sql.SQL("{} ON DELETE " + _FK_ACTIONS[con.on_delete]).format(clause)
    return Constraint(con.name, con.contype, clause)


def _checked_index(idx: IndexRow, by_num: Mapping[int, str]) -> IndexDef:
    what = f"index {show(idx.name)} on {show(idx.table)}"
    if idx.method != "btree" or not idx.plain:
        raise _refuse(what, "only plain b-tree indexes over columns are replayed (no "
                            "expressions, predicates, INCLUDE, options, collations or operator "
                            "classes)")  # fmt: skip
    names = _names(idx.keys, by_num, what)
    if len(idx.options) != len(names):
        raise _refuse(what, "its per-column options do not match its columns")
    keys = []
    for name, option in zip(names, idx.options, strict=True):
        if option & ~(_INDOPTION_DESC | _INDOPTION_NULLS_FIRST):
            raise _refuse(what, f"column option {option}")
        desc, nulls_first = bool(option & _INDOPTION_DESC), bool(option & _INDOPTION_NULLS_FIRST)
        suffix = ""
        if desc:
            suffix = " DESC" if nulls_first else " DESC NULLS LAST"
        elif nulls_first:
            suffix = " NULLS FIRST"
        keys.append(sql.SQL("{}" + suffix).format(sql.Identifier(name)))
    create = sql.SQL("CREATE {}INDEX {} ON public.{} USING btree ({})").format(
        sql.SQL("UNIQUE " if idx.unique else ""),
        sql.Identifier(idx.name),
        sql.Identifier(idx.table),
        sql.SQL(", ").join(keys),
    )
    return IndexDef(idx.name, create)


def check_table_names(tables: Sequence[str]) -> None:
    """Discovery answers name ``ducklake_*`` tables only (every one is dropped on the target)."""
    for name in tables:
        if not name.startswith("ducklake_"):
            raise _refuse(f"table {show(name)}", "only ducklake_* tables are copied")


def shape_catalog(
    tables: Sequence[str],
    table_rows: Iterable[TableRow],
    column_rows: Iterable[ColumnRow],
    constraint_rows: Iterable[ConstraintRow],
    index_rows: Iterable[IndexRow],
) -> Catalog:
    """Check every introspected row against the DuckLake shapes and compose the target DDL;
    :class:`CopyError` naming the first object that does not fit."""
    wanted = frozenset(tables)
    seen = {row.name: row for row in table_rows if row.name in wanted}
    check_table_names(tables)
    for name in tables:
        row = seen.get(name)
        if row is None:
            raise _refuse(f"table {show(name)}", "the source did not describe it")
        if row.relkind != "r" or row.is_partition or row.typed:
            raise _refuse(f"table {show(name)}", "only plain tables (no partitions, partitioned "
                                                  "or typed tables) are copied")  # fmt: skip
    columns: dict[str, list[Column]] = {t: [] for t in tables}
    by_num: dict[str, dict[int, str]] = {t: {} for t in tables}
    for col in column_rows:
        if col.table not in wanted:
            raise _refuse(f"column {show(col.name)}", f"of unknown table {show(col.table)}")
        if col.attnum in by_num[col.table] or col.attnum < 1:
            raise _refuse(f"column {show(col.name)} of {show(col.table)}",
                          f"attribute number {col.attnum}")  # fmt: skip
        by_num[col.table][col.attnum] = col.name
        columns[col.table].append(_checked_column(col))
    for table in tables:
        if not columns[table]:
            raise CopyError(f"table {table} has no columns on the source; refusing to copy it")
    constraints: dict[str, list[Constraint]] = {t: [] for t in tables}
    for con in constraint_rows:
        if con.table not in wanted:
            raise _refuse(f"constraint {show(con.name)}", f"of unknown table {show(con.table)}")
        checked = _checked_constraint(con, by_num, wanted)
        if checked is not None:
            constraints[con.table].append(checked)
    indexes: dict[str, list[IndexDef]] = {t: [] for t in tables}
    for idx in index_rows:
        if idx.table not in wanted:
            raise _refuse(f"index {show(idx.name)}", f"of unknown table {show(idx.table)}")
        indexes[idx.table].append(_checked_index(idx, by_num[idx.table]))
    return Catalog(
        columns,
        {t: order_constraints(cons) for t, cons in constraints.items()},
        {t: sorted(idx, key=lambda i: i.name) for t, idx in indexes.items()},
    )


def read_catalog(conn: Connection, tables: Sequence[str]) -> Catalog:
    """Introspect ``tables`` on the source and shape them (the seam plus the checks)."""
    return shape_catalog(
        tables,
        introspection.read_tables(conn, tables),
        introspection.read_columns(conn, tables),
        introspection.read_constraints(conn, tables),
        introspection.read_indexes(conn, tables),
    )


def create_table_sql(table: str, columns: Sequence[Column]) -> sql.Composed:
    """``CREATE TABLE public."<t>" (…)`` from checked columns; zero columns is an error."""
    if not columns:
        raise CopyError(f"table {table} has no columns on the source; refusing to copy it")
    parts = []
    for col in columns:
        part = sql.SQL("{} {}").format(sql.Identifier(col.name), col.type)
        if col.default is not None:
            part = sql.SQL("{} DEFAULT {}").format(part, col.default)
        if col.not_null:
            part = sql.SQL("{} NOT NULL").format(part)
        parts.append(part)
    return sql.SQL("CREATE TABLE public.{} ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(parts)
    )


def order_constraints(constraints: Iterable[Constraint]) -> list[Constraint]:
    """Constraints ordered by name, foreign keys moved last (stable); ``contype 'n'``
    (PostgreSQL 18's catalogued NOT NULL) is never replayed (safeguard 5)."""
    kept = [c for c in sorted(constraints, key=lambda c: c.name) if c.contype != "n"]
    return [c for c in kept if c.contype != "f"] + [c for c in kept if c.contype == "f"]
