"""Janitor leadership under real concurrency: threads with their own connections, real lease
rows, the database clock (spec reshard §4.14, §4.15; safeguard 41)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from reshard.control.janitor import TickReport
from tests.fixtures.janitor import (
    FakeLauncher,
    janitor_env,
    make_janitor,
    refresh,
    sql,
    stale_pending,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("janitor_env")]
assert janitor_env


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()

    return run


def test_two_ticks_at_once_only_the_lease_holder_acts() -> None:
    ops = [stale_pending() for _ in range(3)]
    launcher = FakeLauncher()
    janitors = [make_janitor(launcher, holder=f"replica-{i}.1.0000000{i}") for i in range(2)]
    barrier = threading.Barrier(2)
    reports: list[TickReport] = []
    lock = threading.Lock()

    def tick(i: int) -> None:
        barrier.wait()
        report = janitors[i].reconcile()
        with lock:
            reports.append(report)

    threads = [threading.Thread(target=_in_thread(functools.partial(tick, i))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.leader for r in reports) == [False, True]
    for op in ops:
        assert launcher.creates(op.id) == [("create", op.id, True)]
        assert refresh(op).respawn_attempts == 1


@pytest.mark.safeguard("reshard-41")
def test_blocked_renewals_stop_the_leader_and_another_takes_over_only_after_expiry(
    settings: Any,
) -> None:
    settings.DUCKGRES_JANITOR_LEASE_SECONDS = 4
    settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = 2
    op = stale_pending()
    launcher = FakeLauncher()
    a = make_janitor(launcher, holder="replica-a.1.aaaaaaaa")
    b = make_janitor(launcher, holder="replica-b.2.bbbbbbbb")

    t0 = time.monotonic()
    assert a.reconcile().leader
    assert refresh(op).respawn_attempts == 1
    launcher.kill(op.id, reason="Error")  # its runner dies: the op needs a runner again

    # Block every renewal: another connection holds the lease row.
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            sql("SELECT 1 FROM duckgres_leases WHERE name = 'janitor' FOR UPDATE")
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=_in_thread(hold))
    holder.start()
    try:
        assert locked.wait(10)
        time.sleep(max(0.0, t0 + 2.2 - time.monotonic()))  # past A's renew deadline
        report = a.reconcile()
        assert not report.leader, "renew blocked and past the deadline: A does not act"
        assert not b.reconcile().leader, "B cannot take a row it cannot even lock"
    finally:
        release.set()
        holder.join()
    assert time.monotonic() - t0 < 3.8, "test timing: still inside A's lease"
    assert not b.reconcile().leader, "the row has not expired yet: no takeover"
    assert refresh(op).respawn_attempts == 1
    assert len(launcher.creates(op.id)) == 1, "no op relaunched twice in one lease window"

    time.sleep(max(0.0, t0 + 4.3 - time.monotonic()))  # A's lease has expired
    report = b.reconcile()
    assert report.leader
    assert b.lease.epoch == 2
    assert refresh(op).respawn_attempts == 2
    assert len(launcher.creates(op.id)) == 2
    assert not a.reconcile().leader, "A's renew matches zero rows: leadership lost"
    assert a.lease.epoch is None
