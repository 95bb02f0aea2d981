"""A drain cancel racing the janitor's launch (reshard/control/drains.py, issue 29 item 2; safeguard
reshard-112). The cancel commits from the API outside the drain's advisory lock, so a child the
janitor is starting at that moment is not in the cancel's transaction: the janitor marks the
item launched whatever the cancel wrote on it, and asks that child's cancel at once (not at the
next tick); a cancelled item whose operation exists is adopted like a waiting one; the cancel's
transaction waits for a row lock only so long. The cancel's own transaction (children asked,
waiting items cancelled, the answer) is tests/api/test_drains.py."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import ReshardLogEntry, ReshardOperation, StoreDrain, StoreDrainItem
from reshard.control import drains
from tests.fixtures.api import published
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.start import Setup, cnpg_source

pytestmark = pytest.mark.django_db
# Fixtures: the start's real stores, and the launch task captured (autouse), never sent.
__all__ = ["cnpg_source", "published"]


def _nothing() -> None:
    """``may_act`` of a leader whose lease is proven."""


@pytest.mark.safeguard("reshard-112")
def test_a_child_started_while_the_cancel_commits_is_asked_at_once(cnpg_source: Setup) -> None:
    source, target = cnpg_source.source_store, cnpg_source.target_store
    drain = drains.create_drain(
        source.name,
        target_stores=[target.name],
        max_concurrent=1,
        drain_timeout_seconds=30,
        actor="ops@example.com",
    )
    [item] = drain.items_with_operations()
    # The janitor's advance saw the drain running and is starting this item's reshard (the real
    # start, against the real stores) when the operator's cancel commits.
    done = drains.cancel_drain(drain.id, actor="ops@example.com")
    assert (done.waiting_cancelled, done.children) == (1, [])
    assert StoreDrainItem.objects.get(pk=item.pk).state == "cancelled"
    report = drains.AdvanceReport()
    assert drains._launch(drain, item, report) is True
    op = ReshardOperation.objects.get(drain_item_id=item.pk)
    assert op.state == "cancelled", "asked within the launch, before any runner claimed it"
    assert f"drain {drain.id}: cancel requested for op {op.id}" in report.actions
    assert StoreDrainItem.objects.get(pk=item.pk).state == "launched", "it has an operation"
    assert ReshardLogEntry.objects.filter(
        operation_id=op.id, message=f"cancelled by drain:{drain.id} before the runner claimed it"
    ).exists()
    drains.advance(_nothing)
    ended = StoreDrain.objects.get(pk=drain.id)
    assert (ended.state, ended.summary) == ("cancelled", "1 cancelled")


@pytest.mark.safeguard("reshard-112")
def test_a_cancelled_item_whose_operation_exists_is_adopted_and_asked() -> None:
    source, target = new_store(), new_store()
    name = unique("cat").replace("-", "_")
    wh = new_warehouse(
        store=source,
        metadata_store_database=name,
        metadata_store_user=name,
        metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
    )
    drain = drains.create_drain(
        source.name,
        target_stores=[target.name],
        max_concurrent=1,
        drain_timeout_seconds=30,
        actor="ops@example.com",
    )
    item = StoreDrainItem.objects.get(drain=drain)
    drains.cancel_drain(drain.id, actor="ops@example.com")
    # A launcher's insert that was in flight when the cancel marked the item (and that died
    # before marking it launched): the row exists, the item says cancelled.
    op = new_op(wh, to_store=target, state="running", step="blocking", drain_item=item)
    report = drains.advance(_nothing)
    assert f"drain {drain.id}: adopted op {op.id} of {wh.org_id}" in report.actions
    assert f"drain {drain.id}: cancel requested for op {op.id}" in report.actions
    assert ReshardOperation.objects.get(pk=op.pk).cancel_requested is True
    assert StoreDrainItem.objects.get(pk=item.pk).state == "launched"
    assert StoreDrain.objects.get(pk=drain.id).state == "cancelling", "its child still runs"
    ReshardOperation.objects.filter(pk=op.pk).update(state="cancelled")
    drains.advance(_nothing)
    ended = StoreDrain.objects.get(pk=drain.id)
    assert (ended.state, ended.summary) == ("cancelled", "1 cancelled")


@pytest.mark.django_db(transaction=True)
def test_a_cancel_waits_for_a_row_lock_only_so_long_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, target = new_store(), new_store()
    drain = drains.create_drain(
        source.name,
        target_stores=[target.name],
        max_concurrent=1,
        drain_timeout_seconds=30,
        actor="ops@example.com",
    )
    monkeypatch.setattr(drains, "CANCEL_LOCK_TIMEOUT_MS", 300)
    settings = connection.settings_dict
    other = psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        password=settings.get("PASSWORD") or None,
        **settings.get("OPTIONS", {}),
    )
    try:
        other.execute("SELECT 1 FROM duckgres_store_drains WHERE id = %s FOR UPDATE", [drain.id])
        started = time.monotonic()
        with pytest.raises(ServiceError) as refused:
            drains.cancel_drain(drain.id, actor="ops@example.com")
        assert time.monotonic() - started < 5, "bounded by the lock timeout"
        assert (refused.value.status, refused.value.message) == (
            503,
            f"drain {drain.id} is being written by another session: retry the cancel",
        )
    finally:
        other.rollback()
        other.close()
    assert StoreDrain.objects.get(pk=drain.id).state == "running", "nothing changed"
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone() == ("0",), "the session's own lock_timeout is untouched"
    assert drains.cancel_drain(drain.id, actor="ops@example.com").drain.state == "cancelling"
