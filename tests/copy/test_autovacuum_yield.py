"""The write fence against a real autovacuum (``lib.pgadmin.yield_autovacuum_sooner``,
``reshard.engines.copy.catalog.lock_source``).

PostgreSQL cancels an autovacuum that blocks a lock request only after the request has waited
its session's ``deadlock_timeout`` (1 s by default): a vacuum of a large catalog table, which
runs for minutes, added that second to the window whenever the fence met it (the 7,000-table
bench, 2026-12-07). A provisioner given ``GRANT SET ON PARAMETER deadlock_timeout`` lowers it
for its own sessions, and the vacuum yields within 50 ms; one without keeps the second and the
op log says why. A server of its own (PostgreSQL 18), its autovacuum woken every second and the
table's vacuum slowed to a crawl so that it is still running when the fence comes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from duckgres_admin.lib.pgadmin import AUTOVACUUM_YIELD_MS, yield_autovacuum_sooner
from reshard.engines.copy.catalog import AUTOVACUUM_NOTE, lock_source
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.pg18 import Pg18, pg18

__all__ = ["pg18"]  # fixtures used here

PASSWORD = "autovacuum-yield-pw"


@pytest.fixture
def server(pg18: Pg18) -> Iterator[Pg18]:
    try:
        _prepare(pg18)
        yield pg18
    finally:  # the server is the module's: nothing of this test outlives it, set up or not
        with pg18.conn() as admin:
            admin.execute("ALTER SYSTEM RESET autovacuum_naptime")
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("DROP DATABASE IF EXISTS av_catalog WITH (FORCE)")
            if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'av_granted'").fetchone():
                admin.execute("REVOKE SET ON PARAMETER deadlock_timeout FROM av_granted")
            for role in ("av_granted", "av_plain", "av_tenant"):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _prepare(pg18: Pg18) -> None:
    with pg18.conn() as admin:
        admin.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
        admin.execute("SELECT pg_reload_conf()")
        for role in ("av_tenant", "av_granted", "av_plain"):
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(PASSWORD)
                )
            )
        admin.execute("GRANT av_tenant TO av_granted, av_plain")
        admin.execute("GRANT SET ON PARAMETER deadlock_timeout TO av_granted")
        admin.execute("CREATE DATABASE av_catalog OWNER av_tenant")
    with _login(pg18, "av_tenant") as conn:
        conn.execute("CREATE TABLE public.ducklake_small (id bigint)")
        conn.execute("CREATE TABLE public.ducklake_big (id bigint, v text)")
        # Every page a vacuum touches costs at least 1 and, past a limit of 1, sleeps 100 ms:
        # a vacuum of this table runs for minutes, holding its SHARE UPDATE EXCLUSIVE lock.
        conn.execute(
            "ALTER TABLE public.ducklake_big SET (autovacuum_vacuum_threshold = 0, "
            "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_cost_delay = 100, "
            "autovacuum_vacuum_cost_limit = 1)"
        )
        conn.execute(
            "INSERT INTO public.ducklake_big SELECT g, 'x' FROM generate_series(1, 50000) g"
        )
        conn.execute("DELETE FROM public.ducklake_big WHERE id % 2 = 0")


def _login(server: Pg18, user: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1", port=server.port, user=user, password=PASSWORD,
        dbname="av_catalog", autocommit=True,
    )  # fmt: skip


def _vacuuming(server: Pg18) -> int:
    """Wait (30 s at most) until an autovacuum worker holds ducklake_big; its pid."""
    deadline = time.monotonic() + 30
    seen: list[Any] = []
    with server.conn("av_catalog") as admin:
        while time.monotonic() < deadline:
            seen = admin.execute(
                "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.relation = 'public.ducklake_big'::regclass AND l.granted "
                "AND a.backend_type = 'autovacuum worker'"
            ).fetchall()
            if seen:
                return int(seen[0][0])
            time.sleep(0.1)
    raise AssertionError("no autovacuum of ducklake_big started within 30 s")


def _fence(server: Pg18, login: str) -> tuple[float, RecordingHooks]:
    """The fence as a cnpg source session has it: the login, then SET ROLE to the tenant."""
    hooks = RecordingHooks()
    with _login(server, login) as conn:
        lowered = yield_autovacuum_sooner(conn)
        assert lowered is (login == "av_granted")
        conn.execute("SET ROLE av_tenant")
        started = time.monotonic()
        tables = lock_source(conn, hooks)
        took = time.monotonic() - started
        assert tables == ["ducklake_big", "ducklake_small"]
        conn.execute("ROLLBACK")
    return took, hooks


@pytest.mark.safeguard("reshard-147")
def test_an_autovacuum_yields_to_the_fence_within_the_lowered_deadlock_timeout(
    server: Pg18,
) -> None:
    vacuum = _vacuuming(server)
    took, hooks = _fence(server, "av_granted")
    assert took < 0.5, f"the fence waited {took:.2f} s for the autovacuum"
    assert AUTOVACUUM_NOTE not in hooks.messages()
    with server.conn("av_catalog") as admin:
        held = admin.execute(
            "SELECT 1 FROM pg_locks WHERE pid = %s AND relation = 'public.ducklake_big'::regclass",
            (vacuum,),
        ).fetchall()
    assert not held, "the autovacuum was cancelled, not waited out"

    # Without the grant the server's 1 s stays (the autovacuum starts again on its own), and
    # the op log says what would shorten it.
    _vacuuming(server)
    took, hooks = _fence(server, "av_plain")
    assert took >= 0.9, f"the fence waited only {took:.2f} s: was the autovacuum running?"
    assert AUTOVACUUM_NOTE in hooks.messages()
    assert f"{AUTOVACUUM_YIELD_MS} ms" in AUTOVACUUM_NOTE
