"""A metadata store being drained accepts no new warehouses (docs/drains.md).

Below the reshard start's checks and the warehouse writes, which both refuse a store being
drained as the place for a warehouse; ``reshard.control.drains`` (the plan) sits above them."""

from __future__ import annotations

from duckgres_admin.models import ACTIVE_DRAIN_STATES, StoreDrain


def draining_refusal(store_name: str) -> str:
    """'' unless ``store_name`` is being drained; then the refusal for a new warehouse on it."""
    drain = (
        StoreDrain.objects.filter(store_id=store_name, state__in=ACTIVE_DRAIN_STATES)
        .values_list("id", flat=True)
        .first()
    )
    if drain is None:
        return ""
    return (
        f"metadata store {store_name} is being drained (drain {drain}): it accepts no new "
        "warehouses; choose another store"
    )
