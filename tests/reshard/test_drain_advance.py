"""The janitor's drain advance on rows (reshard/control/drains.py; safeguards reshard-98,
reshard-99): a paused drain launches nothing, a cancel stops launching and cancels the active
children and ends only when none is active, an operation whose launcher died before marking its item
is adopted, a finished drain reports its counts, and a drain whose advisory lock another session
holds is left alone (two leaders never advance it together). The end-to-end drain with real
runners and a killed leader is tests/reshard/test_store_drain.py."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection

from duckgres_admin.models import ReshardOperation, StoreDrain, StoreDrainItem
from duckgres_admin.platform.lockkeys import STORE_DRAIN_LOCK_CLASS
from reshard.control import drains
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique

pytestmark = pytest.mark.django_db(transaction=True)


def _nothing() -> None:
    """``may_act`` of a leader whose lease is proven."""


def _plan(n: int, **extra: Any) -> tuple[StoreDrain, list[Any]]:
    source, target = new_store(), new_store()
    whs = []
    for _ in range(n):
        name = unique("cat").replace("-", "_")
        whs.append(
            new_warehouse(
                store=source,
                metadata_store_database=name,
                metadata_store_user=name,
                metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
            )
        )
    drain = drains.create_drain(
        source.name,
        target_stores=[target.name],
        max_concurrent=extra.get("max_concurrent", 2),
        drain_timeout_seconds=30,
        actor="ops@example.com",
    )
    return drain, whs


def _child(drain: StoreDrain, wh: Any, state: str = "running") -> ReshardOperation:
    item = StoreDrainItem.objects.get(drain=drain, org_id=wh.org_id)
    op = new_op(wh, to_store=new_store(), state=state, drain_item=item)
    StoreDrainItem.objects.filter(pk=item.pk).update(state="launched")
    return op


def test_a_paused_drain_launches_nothing_and_resumes() -> None:
    drain, _ = _plan(2)
    drains.change_drain(drain.id, "pause", actor="ops")
    drains.advance(_nothing)
    assert ReshardOperation.objects.count() == 0
    assert set(StoreDrainItem.objects.values_list("state", flat=True)) == {"waiting"}
    assert StoreDrain.objects.get(pk=drain.id).state == "paused"


@pytest.mark.safeguard("reshard-98")
def test_a_cancel_stops_launching_cancels_children_and_ends_when_none_is_active() -> None:
    drain, whs = _plan(3)
    running = _child(drain, whs[0])
    drains.change_drain(drain.id, "cancel", actor="ops")
    # The cancel asked the child in its own transaction (issue 29): the advance asks it no more.
    assert ReshardOperation.objects.get(pk=running.pk).cancel_requested is True
    report = drains.advance(_nothing)
    assert f"drain {drain.id}: cancel requested for op {running.id}" not in report.actions
    items = {i.org_id: i for i in StoreDrainItem.objects.filter(drain=drain)}
    assert items[whs[1].org_id].state == items[whs[2].org_id].state == "cancelled"
    assert items[whs[1].org_id].reason == "the drain was cancelled"
    assert ReshardOperation.objects.count() == 1, "nothing launched after the cancel"
    assert StoreDrain.objects.get(pk=drain.id).state == "cancelling", "a child is still active"
    ReshardOperation.objects.filter(pk=running.pk).update(state="cancelled")
    drains.advance(_nothing)
    ended = StoreDrain.objects.get(pk=drain.id)
    assert (ended.state, ended.summary) == ("cancelled", "3 cancelled")
    assert ended.finished_at is not None
    body = drains.drain_view(ended)
    assert body["progress"]["cancelled"] == 3


@pytest.mark.safeguard("reshard-99")
def test_an_operation_whose_launcher_died_before_marking_its_item_is_adopted() -> None:
    drain, whs = _plan(1)
    item = StoreDrainItem.objects.get(drain=drain)
    op = new_op(whs[0], to_store=new_store(), state="succeeded", drain_item=item)
    assert item.state == "waiting"  # the launcher died between the insert and the mark
    report = drains.advance(_nothing)
    assert f"drain {drain.id}: adopted op {op.id} of {whs[0].org_id}" in report.actions
    assert ReshardOperation.objects.count() == 1, "adopted, not launched again"
    finished = StoreDrain.objects.get(pk=drain.id)
    assert (finished.state, finished.summary) == ("finished", "1 succeeded")
    with pytest.raises(Exception, match="drain_item"):
        new_op(whs[0], to_store=new_store(), state="failed", drain_item=item)


@pytest.mark.safeguard("reshard-99")
def test_a_drain_whose_lock_another_session_holds_is_left_alone() -> None:
    drain, whs = _plan(1)
    _child(drain, whs[0], state="succeeded")
    settings = connection.settings_dict
    other = psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        password=settings.get("PASSWORD") or None,
        autocommit=True,
        **settings.get("OPTIONS", {}),
    )
    try:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [STORE_DRAIN_LOCK_CLASS, drain.id])
        report = drains.advance(_nothing)
        assert report.skipped_locked == [drain.id]
        assert StoreDrain.objects.get(pk=drain.id).state == "running"
    finally:
        other.close()
    drains.advance(_nothing)
    assert StoreDrain.objects.get(pk=drain.id).state == "finished"


def test_an_empty_store_finishes_with_nothing_to_move() -> None:
    drain, _ = _plan(0)
    drains.advance(_nothing)
    assert StoreDrain.objects.get(pk=drain.id).summary == "nothing to move"
