"""Django admin registrations. Secrets are references only; no password field exists."""

from __future__ import annotations

from django.contrib import admin

from duckgres_admin.models import (
    AuditRecord,
    ConnectionLease,
    Lease,
    MetadataStore,
    Operator,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
    Warehouse,
)


@admin.register(ReshardOperation)
class ReshardOperationAdmin(admin.ModelAdmin[ReshardOperation]):
    list_display = ("id", "org_id", "state", "step", "source_kind", "target_kind", "created_at")
    list_filter = ("state", "source_kind", "target_kind")
    search_fields = ("org_id", "from_shard", "to_shard")

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False  # the op row belongs to the runner; operators act through the API


@admin.register(Warehouse)
class WarehouseAdmin(admin.ModelAdmin[Warehouse]):
    list_display = (
        "org_id",
        "state",
        "metadata_store_kind",
        "metadata_store",
        "compaction_enabled",
    )
    list_filter = ("state", "metadata_store_kind")
    search_fields = ("org_id",)


@admin.register(MetadataStore)
class MetadataStoreAdmin(admin.ModelAdmin[MetadataStore]):
    list_display = ("name", "kind", "host", "port", "sslmode", "pooler_host")


@admin.register(ConnectionLease)
class ConnectionLeaseAdmin(admin.ModelAdmin[ConnectionLease]):
    list_display = ("id", "org_id", "holder", "purpose", "state", "expires_at")
    list_filter = ("state", "purpose")


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin[Lease]):
    """Read-only: leases are written only by the lease protocol (SQL on the database clock)."""

    list_display = ("name", "holder", "epoch", "renewed_at", "expires_at")

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False


for _model in (ReshardLogEntry, ReshardStepTiming, Operator, AuditRecord):
    admin.site.register(_model)
