"""Connection leases (the data-plane contract, spec §2.4) and leader leases (§2.9, §4.14)."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

import duckgres_admin.platform.pgtypes  # noqa: F401 - lease rows hold -infinity; see that module


class LeasePurpose(models.TextChoices):
    QUERY = "query"
    WORKER = "worker"
    COMPACTION = "compaction"
    MAINTENANCE = "maintenance"


class LeaseState(models.TextChoices):
    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    REFUSED = "refused"


class ConnectionLease(models.Model):
    id = models.BigAutoField(primary_key=True)
    org_id = models.TextField(db_index=True)
    holder = models.CharField(max_length=200)
    purpose = models.TextField(choices=LeasePurpose.choices)
    state = models.TextField(choices=LeaseState.choices, default=LeaseState.QUEUED)
    requested_at = models.DateTimeField(db_default=Now())
    queue_deadline = models.DateTimeField(null=True, blank=True)
    granted_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "duckgres_connection_leases"
        indexes = [
            models.Index(
                fields=["org_id"],
                condition=models.Q(state__in=["queued", "granted"]),
                name="conn_lease_live_by_org",
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in LeaseState]),
                name="conn_lease_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(purpose__in=[p.value for p in LeasePurpose]),
                name="conn_lease_purpose_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.id} {self.org_id} {self.state}"


class Lease(models.Model):
    """A leadership lease row (`janitor`, `trino`); protocol in
    duckgres_admin.platform.leadership."""

    name = models.TextField(primary_key=True)
    holder = models.TextField(default="", blank=True)
    epoch = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "duckgres_leases"

    def __str__(self) -> str:
        return f"{self.name}: {self.holder or '-'} (epoch {self.epoch})"
