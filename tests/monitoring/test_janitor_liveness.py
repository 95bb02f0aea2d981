"""The janitor liveness gauge ``duckgres_janitor_last_reconcile_timestamp_seconds``: set to the
wall clock at the end of every leader tick that ran to completion, and only then (a non-leader
tick, a tick stopped past the renew deadline and a tick whose listing failed leave it alone);
served by the real control worker after a real ``reshard.reconcile``."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError

from reshard.control import janitor as janitor_module
from reshard.control import metrics
from tests.fixtures.janitor import (
    FakeClock,
    FakeLauncher,
    janitor_env,
    make_janitor,
    reset_leases,
    sample,
    stale_pending,
)
from tests.fixtures.processes import CeleryWorker

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env

LAST = "duckgres_janitor_last_reconcile_timestamp_seconds"
SENTINEL = 12345.0


@pytest.fixture(autouse=True)
def _sentinel() -> None:
    metrics.JANITOR_LAST_RECONCILE.set(SENTINEL)


def test_the_gauge_is_an_unlabelled_gauge_of_the_default_registry() -> None:
    from prometheus_client import REGISTRY

    families = {family.name: family for family in REGISTRY.collect()}
    assert families[LAST].type == "gauge"
    assert not metrics.JANITOR_LAST_RECONCILE._labelnames


def test_a_completed_leader_tick_sets_it_to_now() -> None:
    stale_pending()  # the tick has work to do: a relaunch, then the gauges, then the reap
    launcher = FakeLauncher()
    before = time.time()
    report = make_janitor(launcher).reconcile()
    after = time.time()
    assert report.leader
    assert report.completed
    assert not report.stopped
    assert launcher.creates(), "the tick really reconciled"
    assert before <= sample(LAST) <= after


def test_a_tick_with_nothing_to_do_is_still_a_completed_reconcile() -> None:
    before = time.time()
    report = make_janitor(FakeLauncher()).reconcile()
    assert report.completed
    assert sample(LAST) >= before


def test_a_non_leader_tick_leaves_it_alone() -> None:
    leader = make_janitor(FakeLauncher())
    assert leader.reconcile().completed
    metrics.JANITOR_LAST_RECONCILE.set(SENTINEL)
    other = make_janitor(FakeLauncher(), holder="other.2.bbbbbbbb")
    report = other.reconcile()
    assert not report.leader
    assert not report.completed
    assert sample(LAST) == SENTINEL


def test_a_tick_stopped_past_the_renew_deadline_leaves_it_alone(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DUCKGRES_JANITOR_LEASE_SECONDS = 90
    settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = 60
    stale_pending()
    stale_pending()
    clock = FakeClock()
    launcher = FakeLauncher()
    janitor = make_janitor(launcher, clock=clock)
    assert janitor.lease.acquire()

    from django.db import OperationalError

    def blocked(*_: Any, **__: Any) -> int | None:
        raise OperationalError("canceling statement due to lock timeout")

    monkeypatch.setattr(janitor.lease, "_execute", blocked)
    launcher.on_call = lambda name, _op: clock.advance(61) if name == "create" else None
    clock.advance(30)
    report = janitor.reconcile()
    assert report.leader
    assert report.stopped
    assert not report.completed
    assert sample(LAST) == SENTINEL


def test_a_tick_whose_listing_failed_leaves_it_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Broken:
        class objects:  # stands in for a model manager
            @staticmethod
            def filter(*_: Any, **__: Any) -> Any:
                raise DatabaseError("relation is locked")

    monkeypatch.setattr(janitor_module, "ReshardOperation", _Broken)
    report = make_janitor(FakeLauncher()).reconcile()
    assert report.leader
    assert not report.completed
    assert not report.stopped
    assert sample(LAST) == SENTINEL


def test_one_failing_op_does_not_make_the_tick_incomplete() -> None:
    stale_pending()
    launcher = FakeLauncher()
    launcher.phase_error = RuntimeError("apiserver unreachable")
    before = time.time()
    report = make_janitor(launcher).reconcile()
    assert report.completed
    assert sample(LAST) >= before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gauge_from_exporter(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith(LAST + " "):
            return float(line.split()[1])
    return None


@pytest.mark.django_db(transaction=True)
def test_the_control_worker_exports_it_after_a_real_reconcile(
    celery_worker_factory: Callable[..., CeleryWorker],
) -> None:
    reset_leases()
    port = _free_port()
    celery_worker_factory(
        queues=("duckgres.control",), extra_env={"DUCKGRES_CONTROL_METRICS_PORT": str(port)}
    )
    deadline = time.monotonic() + 30
    while _gauge_from_exporter(port) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gauge_from_exporter(port) == 0.0, "0 until the process completes a tick"

    from duckgres_admin.celery import app

    before = time.time()
    app.send_task("reshard.reconcile")
    value: float | None = 0.0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        value = _gauge_from_exporter(port)
        if value:
            break
        time.sleep(0.2)
    assert value is not None
    assert before - 1 <= value <= time.time() + 1
