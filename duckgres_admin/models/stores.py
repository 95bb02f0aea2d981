"""Metadata stores: PostgreSQL servers holding tenant catalogs (spec reshard §2.2)."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

# A DNS label: lowercase alphanumerics and dashes, at most 63 characters.
STORE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
LIBPQ_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


class StoreKind(models.TextChoices):
    CNPG = "cnpg"
    EXTERNAL = "external"


class MetadataStore(models.Model):
    name = models.TextField(primary_key=True)
    kind = models.TextField(choices=StoreKind.choices)
    host = models.TextField()
    port = models.IntegerField(default=5432)
    sslmode = models.TextField(default="require")
    pooler_host = models.TextField(default="", blank=True)
    pooler_port = models.IntegerField(null=True, blank=True)
    pooler_sslmode = models.TextField(default="", blank=True)
    provisioner_user = models.TextField(default="", blank=True)
    provisioner_password_ref = models.TextField(default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_metadata_stores"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(name__regex=STORE_NAME_PATTERN),
                name="metadata_store_name_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=["cnpg", "external"]), name="metadata_store_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(port__gte=1, port__lte=65535), name="metadata_store_port_range"
            ),
            models.CheckConstraint(
                condition=models.Q(sslmode__in=LIBPQ_SSLMODES), name="metadata_store_sslmode_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(kind="cnpg")
                | (~models.Q(provisioner_user="") & ~models.Q(provisioner_password_ref="")),
                name="metadata_store_cnpg_provisioner",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def tenant_host(self) -> str:
        """The endpoint tenants use: the pooler when configured, else the direct endpoint."""
        return self.pooler_host or self.host

    @property
    def tenant_port(self) -> int:
        return (self.pooler_port or self.port) if self.pooler_host else self.port

    @property
    def tenant_sslmode(self) -> str:
        return (self.pooler_sslmode or self.sslmode) if self.pooler_host else self.sslmode
