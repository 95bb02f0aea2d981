"""The leader lease (spec reshard §4.14): take/renew CAS on the database clock, monotonic
renew deadline, bounded renew attempts, one holder identity per process."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections

from duckgres_admin.platform import leadership
from duckgres_admin.platform.leadership import LeaderLease, holder_identity, read_lease
from tests.fixtures.janitor import FakeClock, expire_lease, janitor_env, reset_leases, sql

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env


def test_holder_identity_names_pod_pid_and_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "control-7f9c")
    ident = holder_identity()
    assert re.fullmatch(r"control-7f9c\.\d+\.[0-9a-f]{8}", ident)
    assert ident.split(".")[1] == str(__import__("os").getpid())
    assert holder_identity() != ident  # random suffix: two lease objects never share one
    monkeypatch.delenv("POD_NAME")
    assert holder_identity().startswith(__import__("socket").gethostname() + ".")


def test_seeded_row_is_taken_and_epoch_rises_on_every_take(db: None) -> None:
    a = LeaderLease("janitor", holder="a")
    b = LeaderLease("janitor", holder="b")
    assert a.acquire()
    assert a.epoch == 1
    row = read_lease("janitor")
    assert row is not None
    assert row.holder == "a"
    assert row.live
    assert not b.acquire(), "a live lease admits one actor"
    assert b.epoch is None
    assert a.renew()
    expire_lease()
    assert b.acquire()
    assert b.epoch == 2
    assert not a.renew(), "the old holder's renew matches zero rows: leadership lost"
    assert a.epoch is None
    assert not a.acting_allowed()


def test_renew_requires_holder_epoch_and_a_live_row(db: None) -> None:
    a = LeaderLease("janitor", holder="a")
    assert a.take()
    assert a.epoch is not None
    epoch = a.epoch
    a.epoch = epoch + 1
    assert not a.renew(), "wrong epoch"
    a.epoch = epoch
    assert a.take() is False, "take only matches an expired row"
    expire_lease()
    assert not a.renew(), "an expired row is not renewed, even by its last holder"
    assert a.acquire(), "... but it may be taken again, with a new epoch"
    assert a.epoch == epoch + 1


def test_renew_extends_expiry_on_the_database_clock(db: None, settings: Any) -> None:
    settings.DUCKGRES_JANITOR_LEASE_SECONDS = 90
    a = LeaderLease("janitor", holder="a")
    assert a.take()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at - now(), renewed_at = now(), acquired_at = now() "
            "FROM duckgres_leases WHERE name = 'janitor'"
        )
        ttl, renewed_now, acquired_now = cursor.fetchone()
    assert ttl.total_seconds() == 90
    assert renewed_now
    assert acquired_now


def test_trino_row_works_the_same_way(db: None) -> None:
    j = LeaderLease("janitor", holder="x")
    t = LeaderLease("trino", holder="x")
    assert j.acquire()
    assert t.acquire()
    assert (j.epoch, t.epoch) == (1, 1)
    assert not LeaderLease("trino", holder="y").acquire()


def test_acting_stops_at_the_renew_deadline_on_the_monotonic_clock(db: None, settings: Any) -> None:
    settings.DUCKGRES_JANITOR_LEASE_SECONDS = 90
    settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = 60
    clock = FakeClock()
    a = LeaderLease("janitor", holder="a", clock=clock)
    assert a.acquire()
    clock.advance(59)
    assert a.acting_allowed()
    clock.advance(2)
    assert not a.acting_allowed(), "past last successful renew + deadline: stop"
    assert a.ensure(), "a successful renew restarts the deadline"
    clock.advance(59.5)
    assert a.acting_allowed()


def test_a_failed_renew_keeps_the_last_success_until_the_deadline(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = 60
    clock = FakeClock()
    a = LeaderLease("janitor", holder="a", clock=clock)
    assert a.acquire()

    from django.db import OperationalError

    def broken(*_: Any, **__: Any) -> int | None:
        raise OperationalError("config store unreachable")

    monkeypatch.setattr(a, "_execute", broken)
    clock.advance(30)
    assert a.ensure(), "one failed renewal inside the deadline: still allowed"
    assert a.epoch is not None
    clock.advance(31)
    assert not a.ensure(), "past the deadline with renewals failing: stop"


def test_process_lease_is_one_object_per_name() -> None:
    assert leadership.lease("janitor") is leadership.lease("janitor")
    assert leadership.lease("janitor") is not leadership.lease("trino")


@pytest.mark.django_db(transaction=True)
def test_concurrent_takes_admit_exactly_one_holder() -> None:
    reset_leases()
    barrier = threading.Barrier(6)
    winners: list[str] = []
    lock = threading.Lock()

    def contender(i: int) -> None:
        lease = LeaderLease("janitor", holder=f"c{i}")
        try:
            barrier.wait()
            if lease.acquire():
                with lock:
                    winners.append(lease.holder)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    row = read_lease("janitor")
    assert row is not None
    assert (row.holder, row.epoch) == (winners[0], 1)


@pytest.mark.django_db(transaction=True)
def test_a_blocked_renew_gives_up_within_its_bound(settings: Any) -> None:
    """A renewal stuck behind a row lock fails after a bounded wait instead of hanging."""
    settings.DUCKGRES_JANITOR_LEASE_SECONDS = 10
    settings.DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = 4
    reset_leases()
    a = LeaderLease("janitor", holder="a")
    assert a.acquire()
    locked = threading.Event()
    release = threading.Event()

    def blocker() -> None:
        try:
            from django.db import transaction

            with transaction.atomic():
                sql("SELECT 1 FROM duckgres_leases WHERE name = 'janitor' FOR UPDATE")
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    t = threading.Thread(target=blocker)
    t.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        assert not a.renew()
        assert time.monotonic() - started < 3, "bounded by a quarter of the renew deadline"
        assert a.epoch is not None, "a failed attempt is not a loss"
    finally:
        release.set()
        t.join()
    assert a.renew()
