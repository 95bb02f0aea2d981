"""The provisioner may act as the tenant roles it creates, on every PostgreSQL version the
stores run (safeguard reshard-106): on 16+ a CREATEROLE role holds the roles it creates with
ADMIN but without SET, so membership (``pg_has_role … MEMBER``) no longer means it may ``SET
ROLE`` to them, and ``CREATE DATABASE … OWNER <tenant>`` — the cutover's, and an in-place
restore's sibling — is refused. ``connections.ensure_can_set_role`` checks ``SET`` there and
grants it. Against real servers: the CI store cluster (PostgreSQL 15) and a PostgreSQL 18 one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from reshard.runner import connections
from tests.fixtures.pg18 import Pg18, pg18
from tests.fixtures.stores import StoreClusters

__all__ = ["pg18"]

Conn = psycopg.Connection[tuple[object, ...]]


def _provisioner(superuser: Conn, connect: Callable[[str, str], Conn]) -> tuple[Conn, str]:
    """A CREATEROLE CREATEDB provisioner of this test (what a store's provisioner is)."""
    name, password = f"prov_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    superuser.execute(
        sql.SQL("CREATE ROLE {} LOGIN CREATEROLE CREATEDB PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(password)
        )
    )
    return connect(name, password), name


def _check(
    superuser: Conn, connect: Callable[[str, str], Conn], *, refusal: str, member: bool
) -> None:
    prov, name = _provisioner(superuser, connect)
    tenant, database = f"tenant_{secrets.token_hex(4)}", f"cat_{secrets.token_hex(4)}"
    try:
        with prov:
            prov.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(tenant)))
            seen = prov.execute("SELECT pg_has_role(current_user, %s, 'MEMBER')", [tenant])
            assert seen.fetchone() == (member,)
            create = sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(tenant)
            )
            # What the server answers before the grant: the reason for it (on 18 the role's
            # creator is a MEMBER already, so a membership check would skip the grant).
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=refusal):
                prov.execute(create)
            connections.ensure_can_set_role(prov, tenant, name)
            connections.ensure_can_set_role(prov, tenant, name)  # idempotent
            prov.execute(create)
            prov.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(tenant)))
            owner = prov.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [database]
            ).fetchone()
            assert owner == (tenant,)
    finally:
        superuser.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)))
        for role in (tenant, name):
            superuser.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.mark.safeguard("reshard-106")
def test_on_postgresql_18_the_provisioner_gets_set_on_the_roles_it_creates(pg18: Pg18) -> None:
    def connect(user: str, password: str) -> Conn:
        return psycopg.connect(
            host="127.0.0.1", port=pg18.port, user=user, password=password,
            dbname="postgres", autocommit=True,
        )  # fmt: skip

    with pg18.conn() as superuser:
        _check(superuser, connect, refusal="must be able to SET ROLE", member=True)


@pytest.mark.safeguard("reshard-106")
def test_on_postgresql_15_membership_is_granted_as_before(
    store_clusters: StoreClusters,
) -> None:
    cluster = store_clusters.source

    def connect(user: str, password: str) -> Conn:
        return cluster.connect(user, password)

    with cluster.superuser_conn() as superuser:
        _check(superuser, connect, refusal="must be member of role", member=False)
