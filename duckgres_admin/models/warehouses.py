"""Managed warehouses and the metadata-store binding (spec reshard §2.3)."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Lower, Now, Trim

from duckgres_admin.models.stores import MetadataStore


class WarehouseState(models.TextChoices):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    READY = "ready"
    FAILED = "failed"
    DELETING = "deleting"
    DELETED = "deleted"
    RESHARDING = "resharding"


EXTERNAL_SSLMODES = ("require", "verify-ca", "verify-full")
# Warehouses that hold no catalog any more: their binding may name a database another uses.
NOT_LIVE_STATES = (WarehouseState.DELETING.value, WarehouseState.DELETED.value)
LIVE = ~models.Q(state__in=NOT_LIVE_STATES)


def normalized_host(field: str = "metadata_store_host") -> models.Func:
    """``rtrim(lower(btrim(host)), '.')``: the external endpoint as the unique index compares
    it (``reshard.engines.identity.normalize_host`` is the same rule in Python)."""
    return models.Func(Lower(Trim(field)), models.Value("."), function="RTRIM")


class Warehouse(models.Model):
    org_id = models.TextField(unique=True)
    database_name = models.TextField(default="", blank=True)
    state = models.TextField(choices=WarehouseState.choices, default=WarehouseState.PENDING)
    status_message = models.TextField(default="", blank=True)
    metadata_store_kind = models.TextField(default="", blank=True)
    metadata_store = models.ForeignKey(
        MetadataStore,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        db_column="metadata_store_name",
        related_name="warehouses",
    )
    metadata_store_host = models.TextField(default="", blank=True)
    metadata_store_port = models.IntegerField(null=True, blank=True)
    metadata_store_sslmode = models.TextField(default="", blank=True)
    metadata_store_database = models.TextField(default="", blank=True)
    metadata_store_user = models.TextField(default="", blank=True)
    metadata_store_password_ref = models.TextField(default="", blank=True)
    compaction_enabled = models.BooleanField(null=True, blank=True)
    data_bucket = models.TextField(default="", blank=True)
    data_region = models.TextField(default="", blank=True)
    data_role_arn = models.TextField(default="", blank=True)
    max_connection_leases = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_managed_warehouses"
        ordering = ["org_id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in WarehouseState]),
                name="warehouse_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(metadata_store_kind__in=["", "cnpg", "external"]),
                name="warehouse_store_kind_valid",
            ),
            models.CheckConstraint(
                condition=~models.Q(metadata_store_kind="cnpg")
                | (
                    models.Q(metadata_store__isnull=False)
                    & ~models.Q(metadata_store_database="")
                    & ~models.Q(metadata_store_user="")
                    & ~models.Q(metadata_store_password_ref="")
                ),
                name="warehouse_cnpg_binding_complete",
            ),
            models.CheckConstraint(
                condition=~models.Q(metadata_store_kind="external")
                | (
                    ~models.Q(metadata_store_host="")
                    & models.Q(metadata_store_port__isnull=False)
                    & ~models.Q(metadata_store_database="")
                    & ~models.Q(metadata_store_user="")
                    & ~models.Q(metadata_store_password_ref="")
                ),
                name="warehouse_external_binding_complete",
            ),
            models.CheckConstraint(
                condition=models.Q(max_connection_leases__isnull=True)
                | models.Q(max_connection_leases__gte=0),
                name="warehouse_lease_cap_nonnegative",
            ),
            # One live warehouse per catalog (docs/api.md "Warehouses and metadata stores"): a
            # cnpg binding is keyed by its store row, an external one by its normalized
            # host:port. Aliases the database cannot see (two store rows on one server, an
            # external binding to a cnpg store's address) are refused by the API's check.
            models.UniqueConstraint(
                fields=["metadata_store", "metadata_store_database"],
                condition=models.Q(metadata_store_kind="cnpg") & LIVE,
                name="warehouse_cnpg_binding_unique",
            ),
            models.UniqueConstraint(
                normalized_host(),
                models.F("metadata_store_port"),
                models.F("metadata_store_database"),
                condition=models.Q(metadata_store_kind="external") & LIVE,
                name="warehouse_external_binding_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.org_id} ({self.state})"

    @property
    def writable(self) -> bool:
        return self.state != WarehouseState.RESHARDING
