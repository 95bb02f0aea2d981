"""Safeguard 46: the target may not be the source database reached under another name, even when
the server will not tell us its identity (spec reshard §4.18 check 1 and its fallbacks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from duckgres_admin.lib.pgadmin import Endpoint
from reshard.engines import identity
from tests.fixtures.api import error
from tests.fixtures.rows import new_store, unique
from tests.fixtures.start import assert_nothing_created, cnpg_source  # noqa: F401

pytestmark = pytest.mark.safeguard("reshard-46")


@contextmanager
def revoked(cluster, *functions: str) -> Iterator[None]:
    """Revoke EXECUTE on ``functions`` from PUBLIC on ``cluster`` (as managed servers do)."""
    with cluster.superuser_conn() as conn:
        for fn in functions:
            conn.execute(f"REVOKE EXECUTE ON FUNCTION {fn} FROM PUBLIC")
    try:
        yield
    finally:
        with cluster.superuser_conn() as conn:
            for fn in functions:
                conn.execute(f"GRANT EXECUTE ON FUNCTION {fn} TO PUBLIC")


def test_alias_is_refused_when_pg_control_system_is_revoked(clients, published, cnpg_source):  # noqa: F811
    source = cnpg_source.clusters.source
    alias = new_store(source, name=unique("alias"), host="localhost")
    with revoked(source, "pg_control_system()"):
        response = clients.internal.post(
            cnpg_source.path, {"target": {"type": "cnpg", "cnpg_shard": alias.name}}, format="json"
        )
    assert response.status_code == 400
    assert error(response) == "target is the same PostgreSQL database as the source"
    assert_nothing_created(published)


def test_the_address_fallback_reads_what_it_can(store_clusters):
    source = store_clusters.source
    with revoked(source, "pg_control_system()"), source.provisioner_conn() as conn:
        ident = identity.read_server_identity(conn, Endpoint("localhost", source.port, "require"))
    assert ident.system_identifier in (None, "")
    assert ident.address == ("127.0.0.1", source.port)
    assert "pg_control_system()" in ident.unreadable


def test_with_nothing_readable_a_warning_names_what_is_missing(store_clusters):
    source = store_clusters.source
    functions = ("pg_control_system()", "inet_server_addr()")
    with revoked(source, *functions), source.provisioner_conn() as conn:
        src = identity.read_server_identity(conn, Endpoint("127.0.0.1", source.port, "require"))
        tgt = identity.read_server_identity(conn, Endpoint("127.0.0.1.", source.port, "require"))
    assert set(src.unreadable) >= {"pg_control_system()", "inet_server_addr()", "data_directory"}
    verdict = identity.compare_databases(
        src,
        "catalog_db",
        tgt,
        "catalog_db",
        source_configured=("127.0.0.1", source.port),
        target_configured=("127.0.0.1.", source.port),
    )
    assert verdict.same, "host:port:database as configured (trailing dot normalised) is the same"
    assert "pg_control_system()" in verdict.warning
    assert "inet_server_addr()" in verdict.warning
    assert "comparing host:port:database as configured" in verdict.warning

    different = identity.compare_databases(
        src,
        "catalog_db",
        tgt,
        "catalog_db",
        source_configured=("127.0.0.1", source.port),
        target_configured=("127.0.0.1", source.port + 1),
    )
    assert not different.same
