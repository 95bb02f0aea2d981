"""Store drains: a plan that empties one metadata store through ordinary reshards (docs/drains.md).

A ``StoreDrain`` row is the plan; one ``StoreDrainItem`` per warehouse bound to the store when the
plan was made. The janitor's leader launches each item as a reshard operation whose
``drain_item`` points back at it; that column is unique, so an item is launched at most once
whatever the number of leaders that try (reshard/control/drains.py states the protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db import models
from django.db.models.functions import Now

from duckgres_admin.models.reshard import ACTIVE_STATES


class DrainState(models.TextChoices):
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    FINISHED = "finished"


ACTIVE_DRAIN_STATES = (DrainState.RUNNING, DrainState.PAUSED, DrainState.CANCELLING)
ENDED_DRAIN_STATES = (DrainState.FINISHED, DrainState.CANCELLED)
# The progress an operator sees, in this order (an item's shown state: ``shown_state``).
PROGRESS_KEYS = ("waiting", "running", "succeeded", "failed", "cancelled", "skipped")


class DrainRule(models.TextChoices):
    # Of several target stores, the one with the fewest warehouses bound or moving to it.
    FEWEST_WAREHOUSES = "fewest_warehouses"


class ItemState(models.TextChoices):
    WAITING = "waiting"  # not launched yet
    LAUNCHED = "launched"  # a reshard operation exists (its state is the item's progress)
    SKIPPED = "skipped"  # could not move now; ``reason`` says why
    CANCELLED = "cancelled"  # never launched: the drain was cancelled first


class StoreDrain(models.Model):
    id = models.BigAutoField(primary_key=True)
    store = models.ForeignKey(
        "duckgres_admin.MetadataStore", on_delete=models.PROTECT, related_name="drains"
    )
    target_stores = models.JSONField(default=list)  # store names, in the operator's order
    rule = models.TextField(choices=DrainRule.choices, default=DrainRule.FEWEST_WAREHOUSES)
    max_concurrent = models.IntegerField(default=1)
    drain_timeout_seconds = models.IntegerField(default=1800)
    state = models.TextField(choices=DrainState.choices, default=DrainState.RUNNING)
    created_by = models.TextField(default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    summary = models.TextField(default="", blank=True)

    class Meta:
        db_table = "duckgres_store_drains"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["store"],
                condition=models.Q(state__in=ACTIVE_DRAIN_STATES),
                name="store_drain_one_active_per_store",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in DrainState]),
                name="store_drain_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(max_concurrent__gte=1, max_concurrent__lte=16),
                name="store_drain_max_concurrent_range",
            ),
        ]

    def __str__(self) -> str:
        return f"drain {self.id} of {self.store_id} ({self.state})"

    def items_with_operations(self) -> list[StoreDrainItem]:
        """The items in order, each with its child operation (one query)."""
        return list(self.items.select_related("operation").order_by("id"))

    def progress(self) -> dict[str, int]:
        """How many of its items show each state (``PROGRESS_KEYS``)."""
        return progress_of(self.items_with_operations())


class StoreDrainItem(models.Model):
    id = models.BigAutoField(primary_key=True)
    drain = models.ForeignKey(StoreDrain, on_delete=models.CASCADE, related_name="items")
    org_id = models.TextField()
    state = models.TextField(choices=ItemState.choices, default=ItemState.WAITING)
    reason = models.TextField(default="", blank=True)
    target_store = models.TextField(default="", blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_store_drain_items"
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["drain", "org_id"], name="store_drain_item_once"),
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in ItemState]),
                name="store_drain_item_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.org_id} in drain {self.drain_id} ({self.state})"

    def child(self) -> Any:
        """The reshard operation launched for this item, or None."""
        try:
            return self.operation
        except ObjectDoesNotExist:
            return None

    def shown_state(self) -> str:
        """What the operator sees: the child operation's state once launched (``running`` while
        it is pending or running)."""
        if self.state != ItemState.LAUNCHED:
            return str(self.state)
        op = self.child()
        if op is None or op.state in ACTIVE_STATES:
            return "running"
        return str(op.state)


def progress_of(items: Sequence[StoreDrainItem]) -> dict[str, int]:
    """How many of ``items`` show each state (``PROGRESS_KEYS``, all present)."""
    counts = dict.fromkeys(PROGRESS_KEYS, 0)
    for item in items:
        counts[item.shown_state()] += 1
    return counts
