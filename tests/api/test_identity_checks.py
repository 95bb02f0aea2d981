"""§4.18 check 1 comparison rules (unit): identifier, then address, then configured endpoint."""

from __future__ import annotations

from typing import Any

from reshard.engines.identity import ServerIdentity, compare_databases

SRC = ("db1.example", 5432)
TGT = ("db2.example", 5432)


def ident(**kw: Any) -> ServerIdentity:
    return ServerIdentity(configured=("x", 1), **kw)


def test_system_identifier_decides_when_both_are_readable():
    same = compare_databases(
        ident(system_identifier="1"),
        "cat",
        ident(system_identifier="1"),
        "cat",
        source_configured=SRC,
        target_configured=TGT,
    )
    assert same.same
    assert not compare_databases(
        ident(system_identifier="1"),
        "cat",
        ident(system_identifier="2"),
        "cat",
        source_configured=SRC,
        target_configured=SRC,
    ).same
    # Different database names on one server are different catalogs.
    assert not compare_databases(
        ident(system_identifier="1"),
        "a",
        ident(system_identifier="1"),
        "b",
        source_configured=SRC,
        target_configured=SRC,
    ).same


def test_address_and_data_directory_fallback():
    a = ident(address=("10.0.0.1", 5432), data_directory="/d", unreadable=("pg_control_system()",))
    b = ident(address=("10.0.0.1", 5432), data_directory="/d", unreadable=("pg_control_system()",))
    c = ident(address=("10.0.0.1", 5432), data_directory="/e", unreadable=("pg_control_system()",))
    assert compare_databases(a, "x", b, "x", source_configured=SRC, target_configured=TGT).same
    assert not compare_databases(a, "x", c, "x", source_configured=SRC, target_configured=TGT).same


def test_configured_fallback_warns_naming_what_was_unreadable():
    verdict = compare_databases(
        None,
        "x",
        ident(unreadable=("pg_control_system()", "inet_server_addr()")),
        "x",
        source_configured=("DB1.example.", 5432),
        target_configured=("db1.example", 5432),
    )
    assert verdict.same
    assert "source: no connection" in verdict.warning
    assert "target: pg_control_system(), inet_server_addr()" in verdict.warning
    assert "comparing host:port:database as configured" in verdict.warning
