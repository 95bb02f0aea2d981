"""Reshard reads of the API (spec reshard §5.2): the targets a reshard may move a catalog to."""

from __future__ import annotations

from typing import Any

from duckgres_admin.models import MetadataStore, StoreKind, Warehouse, WarehouseState

LIVE_WAREHOUSE_EXCLUDED = (WarehouseState.DELETING, WarehouseState.DELETED)


def reshard_targets() -> dict[str, list[dict[str, Any]]]:
    """§5.2 ``GET /reshards/targets``: every cnpg store (empty ones too) and external bindings."""
    live = Warehouse.objects.exclude(state__in=LIVE_WAREHOUSE_EXCLUDED)
    counts: dict[str, int] = {}
    for name in live.filter(metadata_store_kind=StoreKind.CNPG).values_list(
        "metadata_store_id", flat=True
    ):
        if name:
            counts[str(name)] = counts.get(str(name), 0) + 1
    shards = [
        {"name": s.name, "tenants": counts.get(s.name, 0)}
        for s in MetadataStore.objects.filter(kind=StoreKind.CNPG).order_by("name")
    ]
    seen: set[tuple[Any, ...]] = set()
    externals: list[dict[str, Any]] = []

    def add(entry: dict[str, Any]) -> None:
        key = tuple(entry.values())
        if key not in seen:
            seen.add(key)
            externals.append(entry)

    for w in live.filter(metadata_store_kind=StoreKind.EXTERNAL).order_by("org_id"):
        add(
            {
                "host": w.metadata_store_host,
                "port": w.metadata_store_port,
                "sslmode": w.metadata_store_sslmode,
                "user": w.metadata_store_user,
                "database": w.metadata_store_database,
                "password_secret_ref": w.metadata_store_password_ref,
            }
        )
    for s in MetadataStore.objects.filter(kind=StoreKind.EXTERNAL).order_by("name"):
        add(
            {
                "host": s.host,
                "port": s.port,
                "sslmode": s.sslmode,
                "user": s.provisioner_user,
                "database": "",
                "password_secret_ref": s.provisioner_password_ref,
            }
        )
    externals.sort(key=lambda e: (str(e["host"]), int(e["port"] or 0)))
    return {"shards": shards, "external_stores": externals}
