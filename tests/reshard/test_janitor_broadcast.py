"""Every control-worker replica receives every janitor tick (spec reshard §4.14, docs/janitor.md).

``duckgres.control`` is a broadcast queue. With a direct queue beat's one message per interval
went to one replica at random, so the lease holder saw a random subset of the ticks: with two
replicas a death the launcher had observed waited 31 s at the median and 90 s at worst on the
one-node cluster, instead of at most one interval. These tests run two real control workers and
send the ticks as beat does (the beat row's queue and expiry)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from duckgres_admin.platform.leadership import read_lease
from tests.fixtures.janitor import janitor_env, reset_leases, send_tick
from tests.fixtures.processes import CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("janitor_env")]
assert janitor_env

_TASK = "reshard.reconcile"


def _outcome(worker: CeleryWorker, task_id: str) -> str | None:
    """``leader`` / ``standby`` once the worker ran the tick, else None."""
    match = re.search(
        rf"Task {_TASK}\[{re.escape(task_id)}\] succeeded in [0-9.e-]+s: "
        r"\{'leader': (True|False)",
        worker.log_text(),
    )
    if match is None:
        return None
    return "leader" if match.group(1) == "True" else "standby"


def _subscribed(workers: list[CeleryWorker], deadline_s: float = 60.0) -> None:
    """Send ticks until each worker ran one: a replica subscribes to the fanout channel just
    after it logs ``ready``, and a tick sent before that is (correctly) not delivered to it."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        task_id = send_tick()
        time.sleep(1.0)
        if all(_outcome(worker, task_id) for worker in workers):
            return
    raise AssertionError("the control workers never both received one tick")


@pytest.mark.safeguard("reshard-92")
def test_each_replica_runs_every_tick_and_one_acts(
    celery_worker_factory: Callable[..., CeleryWorker],
) -> None:
    reset_leases()
    workers = [celery_worker_factory(queues=("duckgres.control",)) for _ in range(2)]
    _subscribed(workers)
    ticks = [send_tick() for _ in range(6)]
    deadline = time.monotonic() + 60
    outcomes: dict[str, list[str | None]] = {}
    while time.monotonic() < deadline:
        outcomes = {t: [_outcome(w, t) for w in workers] for t in ticks}
        if all(None not in seen for seen in outcomes.values()):
            break
        time.sleep(0.5)
    missing = {t: seen for t, seen in outcomes.items() if None in seen}
    assert not missing, f"ticks a replica never ran (None = not received): {missing}"
    # Exactly one replica acts on each tick, and it is the same one throughout: the lease is
    # sticky, the standby's tick only finds the row held.
    leaders = {seen.index("leader") for seen in outcomes.values() if seen.count("leader") == 1}
    assert all(seen.count("leader") == 1 for seen in outcomes.values()), outcomes
    assert len(leaders) == 1, outcomes
    row = read_lease("janitor")
    assert row is not None
    assert row.live
    leader = workers[leaders.pop()]
    assert str(leader.proc.pid) in row.holder.split(".")
    assert row.epoch == 1, "one take, then renewals: the lease never changed hands"
