"""Metadata stores: PostgreSQL servers holding tenant catalogs (spec reshard §2.2).

TLS policy (docs/configuration.md "Metadata-store TLS"; safeguard reshard-122): every endpoint
of a store is ``verify-full`` unless the store carries the explicit opt-in ``tls_policy =
allow-weaker`` with a ``tls_policy_reason``. The database enforces it
(``metadata_store_tls_weaker_opt_in``): a row whose ``sslmode`` or ``pooler_sslmode`` is
anything but ``verify-full`` (``""`` for the pooler: the store's own) cannot exist without the
opt-in, and an opt-in cannot exist without its reason. An ``external`` store row is also where
the opt-in of an external endpoint (a warehouse binding, a start request's external target)
lives: :func:`weaker_tls_store` finds the store that allows a weaker mode for a ``host:port``.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

# A DNS label: lowercase alphanumerics and dashes, at most 63 characters.
STORE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
LIBPQ_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


class StoreKind(models.TextChoices):
    CNPG = "cnpg"
    EXTERNAL = "external"


class TlsPolicy(models.TextChoices):
    VERIFY_FULL = "verify-full"  # the only mode is verify-full (the default)
    ALLOW_WEAKER = "allow-weaker"  # verify-ca / require are accepted, with a reason


class MetadataStore(models.Model):
    name = models.TextField(primary_key=True)
    kind = models.TextField(choices=StoreKind.choices)
    host = models.TextField()
    port = models.IntegerField(default=5432)
    sslmode = models.TextField(default="verify-full")
    pooler_host = models.TextField(default="", blank=True)
    pooler_port = models.IntegerField(null=True, blank=True)
    pooler_sslmode = models.TextField(default="", blank=True)
    tls_policy = models.TextField(
        choices=TlsPolicy.choices, default=TlsPolicy.VERIFY_FULL, db_default=TlsPolicy.VERIFY_FULL
    )
    tls_policy_reason = models.TextField(default="", db_default="", blank=True)
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
            models.CheckConstraint(
                condition=models.Q(tls_policy__in=TlsPolicy.values),
                name="metadata_store_tls_policy_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(tls_policy=TlsPolicy.ALLOW_WEAKER)
                | (
                    models.Q(sslmode="verify-full")
                    & models.Q(pooler_sslmode__in=["", "verify-full"])
                ),
                name="metadata_store_tls_weaker_opt_in",
            ),
            models.CheckConstraint(
                condition=~models.Q(tls_policy=TlsPolicy.ALLOW_WEAKER)
                | ~models.Q(tls_policy_reason=""),
                name="metadata_store_tls_reason",
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

    @property
    def allows_weaker_tls(self) -> bool:
        return self.tls_policy == TlsPolicy.ALLOW_WEAKER

    def endpoints(self) -> list[tuple[str, int]]:
        """The direct endpoint, then the pooler's when configured (host as stored)."""
        out = [(self.host, self.port)]
        if self.pooler_host:
            out.append((self.pooler_host, self.pooler_port or self.port))
        return out


def _same_host(a: str, b: str) -> bool:
    """Host names compare case-insensitively and without a trailing dot; addresses as text."""
    return a.strip().strip("[]").rstrip(".").lower() == b.strip().strip("[]").rstrip(".").lower()


def weaker_tls_store(host: str, port: int) -> MetadataStore | None:
    """The store (by name) whose direct or pooler endpoint is ``host:port`` and whose
    ``tls_policy`` allows a weaker sslmode there, or None. The opt-in of an external endpoint
    that is not a cnpg store: an ``external`` store row registered for it."""
    for store in MetadataStore.objects.filter(tls_policy=TlsPolicy.ALLOW_WEAKER).order_by("name"):
        if any(_same_host(h, host) and p == port for h, p in store.endpoints()):
            return store
    return None
