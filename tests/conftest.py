"""Suite-wide pytest configuration: shared fixtures and the marked-suite policy.

Marked suites (``kube``, ``rgw``, ``browser``, ``faults``, ``e2e``) need real endpoints.
Without ``CI`` a marked test whose endpoint is unavailable is skipped with the reason; with
``CI`` set (``CI=true`` in CI), ANY skip of a marked test is turned into a failure, so a
broken service can never make CI green by skipping. See docs/testing.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fixtures.availability import MARKED_SUITES, ci_enabled, unavailable

pytest_plugins = [
    "tests.fixtures.stores",
    "tests.fixtures.rows",
    "tests.fixtures.processes",
    "tests.fixtures.kube",
    "tests.fixtures.s3",
    # Trino pool doubles and the operator harness (their fixtures: gateway, coordinator, world).
    "tests.trino.gateway_double",
    "tests.trino.coordinator_double",
    "tests.trino.operator_harness",
]


_PER_PROCESS_DB = re.compile(r"^test_duckgres_admin_(\d+)$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_orphan_runner_logins(conn: psycopg.Connection[Any]) -> None:
    """Runner logins are server-wide; a test database's go with it. Drop those that hold no
    grant any more (their database was dropped); one still granted in a live test database
    cannot be dropped and is kept."""
    rows = conn.execute(
        "SELECT rolname FROM pg_roles WHERE starts_with(rolname, 'duckgres_runner_')"
    ).fetchall()
    for (name,) in rows:
        try:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(str(name))))
        except psycopg.errors.DependentObjectsStillExist:
            continue


def pytest_sessionstart(session: pytest.Session) -> None:
    """Drop per-process test databases whose pytest process is gone (killed runs)."""
    try:
        with psycopg.connect(
            os.environ["DUCKGRES_CONFIG_STORE"], dbname="postgres", autocommit=True,
            connect_timeout=3,
        ) as conn:  # fmt: skip
            for (name,) in conn.execute("SELECT datname FROM pg_database").fetchall():
                match = _PER_PROCESS_DB.match(str(name))
                if match and not _pid_alive(int(match[1])):
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(str(name))
                        )
                    )
            _drop_orphan_runner_logins(conn)
    except psycopg.Error:
        pass  # the config store is down: the tests that need it will say so


def _suites(item: pytest.Item) -> list[str]:
    return [name for name in MARKED_SUITES if item.get_closest_marker(name) is not None]


def pytest_report_header(config: pytest.Config) -> str:
    mode = "CI: skips of marked suites FAIL" if ci_enabled() else "local: marked suites may skip"
    return f"duckgres: {mode} ({', '.join(MARKED_SUITES)})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test using the real apiserver is in the kube suite even if its author forgot the mark."""
    for item in items:
        if "kube_api" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("kube"):
            item.add_marker(pytest.mark.kube)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for suite in _suites(item):
        reason = unavailable(suite)
        if reason:
            pytest.skip(f"[{suite}] {reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not (report.skipped and ci_enabled()) or hasattr(report, "wasxfail"):
        return report
    suites = _suites(item)
    if not suites:
        return report
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"CI is set: the marked suite {'/'.join(suites)} must run, but it was skipped: {reason}"
    )
    return report
