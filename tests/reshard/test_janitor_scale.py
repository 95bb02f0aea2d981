"""The janitor at fleet scale (issue: under load and at fleet scale): one reconcile tick issues a
number of queries that does not grow with the number of operations it has nothing to do for —
finished operations (already observed, nothing to reap) and active ones with a live runner.

Counted with Django's query capture on the real config store at two sizes, 10x apart; the
tick's time at 100,000 + 1,000 operations is measured by ``bench/bench_janitor.py``, never here.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.fixtures.janitor import FakeLauncher, janitor_env, make_janitor, new_op
from tests.reshard.scale_support import clone

assert janitor_env  # a fixture, used by name below

pytestmark = pytest.mark.django_db(transaction=True)


def tick_queries(janitor: Any) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        report = janitor.reconcile()
    assert report.leader
    assert report.completed
    assert report.actions == []  # nothing to do for any of these operations
    return [q["sql"] for q in captured.captured_queries]


def test_a_tick_costs_the_same_queries_for_10x_more_operations(janitor_env: None) -> None:
    template = new_op("succeeded")
    leader = make_janitor(FakeLauncher())
    clone(template, "finished", 200, "small")
    clone(template, "fresh", 20, "small")
    clone(template, "pending", 5, "small")
    leader.reconcile()  # the first tick observes the template's metrics once; not counted
    small = tick_queries(leader)

    clone(template, "finished", 2000, "large")
    clone(template, "fresh", 200, "large")
    clone(template, "pending", 50, "large")
    large = tick_queries(leader)
    assert len(large) == len(small), "\n".join(large)
    # 13 since the tick exports the restore tests' newest verified backup age (one aggregate);
    # 14 since it lists the runner logins to drop (one query: reshard-133); 15 since it
    # counts the warehouses whose backups no restore test covered (one query).
    assert len(small) <= 15, "\n".join(small)
