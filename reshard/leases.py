"""Connection leases: the data plane's grant path (spec reshard §2.4, §5.4).

Invariant (§1.5): after the block step commits (``ready → resharding`` under the per-org
advisory lock), no lease can be granted. Every grant therefore runs in one transaction that
takes the same lock (``duckgres_admin.orglock.lock_org``) and re-reads the warehouse state
under it; the
``queued → granted`` move is a guarded UPDATE on ``state='queued'``.

The lease row has no TTL column: while a lease is ``queued`` its ``expires_at`` holds
``requested_at + ttl`` so a later grant (``GET`` re-attempt) can reuse the requested TTL as
``expires_at - requested_at``. A queued row is never *active* (active = ``granted`` and
``expires_at > now()``), so the placeholder has no effect on caps or the drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Func
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lib import pgadmin
from duckgres_admin.models import (
    ConnectionLease,
    LeaseState,
    MetadataStore,
    StoreKind,
    Warehouse,
    WarehouseState,
)
from duckgres_admin.orglock import lock_org

RETRY_AFTER_SECONDS = 5
RESHARDING_MESSAGE = "metadata-store reshard in progress for this organization; retry shortly"


@dataclass(frozen=True)
class LeaseRequest:
    holder: str
    purpose: str
    ttl_seconds: int = 60
    wait_seconds: int = 0


@dataclass(frozen=True)
class LeaseOutcome:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


class ClockTimestamp(Func):
    """``clock_timestamp()``: the database clock at the statement, not at transaction start.

    Grants stamp it under the per-org lock, so every ``granted_at`` orders strictly against
    the block transaction that takes the same lock.
    """

    template = "clock_timestamp()"
    output_field = DateTimeField()


def _after(seconds: int) -> ExpressionWrapper[CombinedExpression]:
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def _binding(warehouse: Warehouse) -> dict[str, Any]:
    """The binding the data plane connects with (cnpg: the pooler endpoint when set)."""
    if warehouse.metadata_store_kind == StoreKind.CNPG:
        store = MetadataStore.objects.get(name=warehouse.metadata_store_id)
        host, port, sslmode = store.tenant_host, store.tenant_port, store.tenant_sslmode
    else:
        host = warehouse.metadata_store_host
        port = warehouse.metadata_store_port or 5432
        sslmode = warehouse.metadata_store_sslmode or pgadmin.DEFAULT_SSLMODE
    return {
        "kind": warehouse.metadata_store_kind,
        "host": host,
        "port": port,
        "sslmode": sslmode,
        "database": warehouse.metadata_store_database,
        "user": warehouse.metadata_store_user,
        "password_secret_ref": warehouse.metadata_store_password_ref,
    }


def _gone(lease_id: int) -> ServiceError:
    return ServiceError(410, f"lease {lease_id} is no longer active")


def _attempt_grant(org_id: str, lease_id: int) -> LeaseOutcome:
    """One transaction under the per-org lock: refuse, keep queued, or grant.

    Refusals are returned from the transaction (not raised inside it) so the row's
    ``refused``/``expired`` state commits with it.
    """
    with transaction.atomic():
        outcome = _attempt_grant_locked(org_id, lease_id)
    if isinstance(outcome, ServiceError):
        raise outcome
    return outcome


def _attempt_grant_locked(org_id: str, lease_id: int) -> LeaseOutcome | ServiceError:
    lock_org(org_id)
    warehouse = Warehouse.objects.filter(org_id=org_id).first()
    lease = ConnectionLease.objects.filter(pk=lease_id, org_id=org_id).first()
    if warehouse is None or lease is None:
        return ServiceError(404, "no such lease" if warehouse else "org has no managed warehouse")
    if lease.state != LeaseState.QUEUED:
        return _gone(lease_id)
    queued = ConnectionLease.objects.filter(pk=lease_id, state=LeaseState.QUEUED)
    if warehouse.state == WarehouseState.RESHARDING:
        queued.update(state=LeaseState.REFUSED)
        return ServiceError(
            503,
            RESHARDING_MESSAGE,
            code="warehouse_resharding",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if warehouse.state != WarehouseState.READY:
        queued.update(state=LeaseState.REFUSED)
        return ServiceError(
            409,
            f"warehouse is not ready (currently {warehouse.state})",
            code="warehouse_not_ready",
        )
    if warehouse.max_connection_leases is not None:
        active = ConnectionLease.objects.filter(
            org_id=org_id, state=LeaseState.GRANTED, expires_at__gt=Now()
        ).count()
        if active >= warehouse.max_connection_leases:
            waiting = ConnectionLease.objects.filter(pk=lease_id, queue_deadline__gt=Now()).exists()
            if waiting:
                return LeaseOutcome(
                    202,
                    {
                        "lease_id": lease.id,
                        "state": LeaseState.QUEUED.value,
                        "queue_deadline": _iso(lease.queue_deadline),
                    },
                )
            if lease.queue_deadline is not None and lease.queue_deadline > lease.requested_at:
                # It did wait, and its deadline has passed.
                queued.update(state=LeaseState.EXPIRED)
                return ServiceError(410, f"lease {lease_id} expired in the queue")
            queued.update(state=LeaseState.REFUSED)
            return ServiceError(
                429,
                f"connection lease cap reached ({warehouse.max_connection_leases})",
                code="lease_cap_reached",
            )
    ttl = F("expires_at") - F("requested_at")
    rows = queued.update(
        state=LeaseState.GRANTED,
        granted_at=ClockTimestamp(),
        expires_at=ExpressionWrapper(ClockTimestamp() + ttl, output_field=DateTimeField()),
    )
    if rows != 1:
        return _gone(lease_id)
    lease.refresh_from_db()
    return LeaseOutcome(
        201,
        {
            "lease_id": lease.id,
            "state": LeaseState.GRANTED.value,
            "expires_at": _iso(lease.expires_at),
            "binding": _binding(warehouse),
        },
    )


def lease_request(*, org_id: str, request: LeaseRequest) -> LeaseOutcome:
    """``POST /warehouses/<org>/leases``: insert ``queued``, then attempt the grant."""
    if not Warehouse.objects.filter(org_id=org_id).exists():
        raise ServiceError(404, "org has no managed warehouse")
    lease = ConnectionLease.objects.create(
        org_id=org_id,
        holder=request.holder,
        purpose=request.purpose,
        state=LeaseState.QUEUED,
        queue_deadline=_after(request.wait_seconds),
        expires_at=_after(request.ttl_seconds),
    )
    return _attempt_grant(org_id, lease.id)


def lease_get(*, org_id: str, lease_id: int) -> LeaseOutcome:
    """``GET``: queued → re-attempt the grant; granted → 200; anything else → 410."""
    lease = ConnectionLease.objects.filter(pk=lease_id, org_id=org_id).first()
    if lease is None:
        raise ServiceError(404, "no such lease")
    if lease.state == LeaseState.QUEUED:
        return _attempt_grant(org_id, lease_id)
    if (
        lease.state == LeaseState.GRANTED
        and ConnectionLease.objects.filter(
            pk=lease_id, state=LeaseState.GRANTED, expires_at__gt=Now()
        ).exists()
    ):
        return LeaseOutcome(
            200,
            {
                "lease_id": lease.id,
                "state": LeaseState.GRANTED.value,
                "expires_at": _iso(lease.expires_at),
            },
        )
    ConnectionLease.objects.filter(
        pk=lease_id, state=LeaseState.GRANTED, expires_at__lte=Now()
    ).update(state=LeaseState.EXPIRED)
    raise _gone(lease_id)


def lease_renew(*, org_id: str, lease_id: int, ttl_seconds: int) -> LeaseOutcome:
    """Extend a granted, unexpired lease (allowed while ``resharding``: the drain waits)."""
    rows = ConnectionLease.objects.filter(
        pk=lease_id, org_id=org_id, state=LeaseState.GRANTED, expires_at__gt=Now()
    ).update(expires_at=_after(ttl_seconds))
    if rows != 1:
        if not ConnectionLease.objects.filter(pk=lease_id, org_id=org_id).exists():
            raise ServiceError(404, "no such lease")
        raise _gone(lease_id)
    expires_at = (
        ConnectionLease.objects.filter(pk=lease_id).values_list("expires_at", flat=True).get()
    )
    return LeaseOutcome(200, {"lease_id": lease_id, "expires_at": _iso(expires_at)})


def lease_release(*, org_id: str, lease_id: int) -> None:
    """``DELETE``: → ``released`` (idempotent; terminal leases are left as they are)."""
    if not ConnectionLease.objects.filter(pk=lease_id, org_id=org_id).exists():
        raise ServiceError(404, "no such lease")
    ConnectionLease.objects.filter(
        pk=lease_id, org_id=org_id, state__in=[LeaseState.QUEUED, LeaseState.GRANTED]
    ).update(state=LeaseState.RELEASED, released_at=Now())
