"""Connection leases: the data plane's grant path (spec reshard §2.4, §5.4).

Invariant (§1.5): after the block step commits (``ready → resharding`` under the per-org
advisory lock), no lease can be granted. Every grant therefore runs in one transaction that
takes the same lock (``duckgres_admin.platform.orglock.lock_org``) and re-reads the warehouse state
under it, in a statement that starts after the lock is held (PostgreSQL takes a statement's
snapshot when the statement starts: a read in the lock's own statement could see the state
from before a block that committed while it waited). The ``queued → granted`` move is a
guarded UPDATE on ``state='queued'``.

The hot path is short (docs/performance.md "Lease path"): a new request is **one round trip**,
the lock and one statement (``_GRANT_SQL``: read the warehouse and its store, count the active
leases when the org has a cap, insert the row in its decided state) sent together as one
simple-protocol query string (``_LOCKED_GRANT_SQL``) on the autocommit connection. PostgreSQL
runs the statements of such a string as one implicit transaction: the transaction-scoped lock
is held until the insert commits, and the grant statement, a statement of its own, takes its
snapshot after the lock is held. A renew and a release are one guarded ``UPDATE`` each.
Safeguard reshard-82 pins the counts.

The lease row has no TTL column: while a lease is ``queued`` its ``expires_at`` holds
``requested_at + ttl`` so a later grant (``GET`` re-attempt) can reuse the requested TTL as
``expires_at - requested_at``. A queued row is never *active* (active = ``granted`` and
``expires_at > now()``), so the placeholder has no effect on caps or the drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Func
from django.db.models.functions import Now

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.times import rfc3339
from duckgres_admin.lib import pgadmin
from duckgres_admin.models import (
    ConnectionLease,
    LeaseState,
    MetadataStore,
    StoreKind,
    Warehouse,
    WarehouseState,
)
from duckgres_admin.platform.orglock import lock_org, org_lock_key

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
    return rfc3339(value) if value else None


class ClockTimestamp(Func):
    """``clock_timestamp()``: the database clock at the statement, not at transaction start.

    Grants stamp it under the per-org lock, so every ``granted_at`` orders strictly against
    the block transaction that takes the same lock.
    """

    template = "clock_timestamp()"
    output_field = DateTimeField()


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


# The grant of a new request: one statement, run under the per-org lock (a statement of its
# own before it, so this one's snapshot is taken after the lock is held and sees a committed
# block). It reads the warehouse and its store (the binding), counts the org's active leases
# only when the org has a cap, decides, and inserts the request's row in its decided state:
# ``granted`` (``granted_at`` = ``clock_timestamp()`` under the lock), ``queued`` (cap reached
# with a wait), or ``refused`` (resharding, not ready, cap reached without a wait). No
# warehouse: no row, nothing inserted (404).
_GRANT_SQL = """
WITH w AS (
    SELECT w.state, w.max_connection_leases AS cap, w.metadata_store_kind AS kind,
           w.metadata_store_host, w.metadata_store_port, w.metadata_store_sslmode,
           w.metadata_store_database, w.metadata_store_user, w.metadata_store_password_ref,
           s.host AS store_host, s.port AS store_port, s.sslmode AS store_sslmode,
           s.pooler_host, s.pooler_port, s.pooler_sslmode
    FROM duckgres_managed_warehouses w
    LEFT JOIN duckgres_metadata_stores s ON s.name = w.metadata_store_name
    WHERE w.org_id = %(org)s
), d AS (
    SELECT w.*, clock_timestamp() AS stamp,
           CASE
               WHEN w.state <> 'ready' THEN 'refused'
               WHEN w.cap IS NOT NULL AND w.cap <= (
                   SELECT count(*) FROM duckgres_connection_leases l
                   WHERE l.org_id = %(org)s AND l.state = 'granted' AND l.expires_at > now()
               ) THEN CASE WHEN %(wait)s > 0 THEN 'queued' ELSE 'refused' END
               ELSE 'granted'
           END AS decided
    FROM w
), ins AS (
    INSERT INTO duckgres_connection_leases
        (org_id, holder, purpose, state, requested_at, queue_deadline, granted_at, expires_at)
    SELECT %(org)s, %(holder)s, %(purpose)s, d.decided, now(),
           now() + make_interval(secs => %(wait)s),
           CASE WHEN d.decided = 'granted' THEN d.stamp END,
           CASE WHEN d.decided = 'granted' THEN d.stamp ELSE now() END
               + make_interval(secs => %(ttl)s)
    FROM d
    RETURNING id, state, queue_deadline, expires_at
)
SELECT ins.id, ins.state, ins.queue_deadline, ins.expires_at, d.state, d.cap, d.kind,
       d.metadata_store_host, d.metadata_store_port, d.metadata_store_sslmode,
       d.metadata_store_database, d.metadata_store_user, d.metadata_store_password_ref,
       d.store_host, d.store_port, d.store_sslmode, d.pooler_host, d.pooler_port,
       d.pooler_sslmode
FROM ins, d
"""


def _binding_from_row(row: tuple[Any, ...]) -> dict[str, Any]:
    """The binding of a ``_GRANT_SQL`` row, as :func:`_binding` builds it from the models."""
    (kind, host, port, sslmode, database, user, ref, s_host, s_port, s_ssl, p_host, p_port,
     p_ssl) = row[6:19]  # fmt: skip
    if kind == StoreKind.CNPG:
        if p_host:
            host, port, sslmode = p_host, p_port or s_port, p_ssl or s_ssl
        else:
            host, port, sslmode = s_host, s_port, s_ssl
    else:
        port = port or 5432
        sslmode = sslmode or pgadmin.DEFAULT_SSLMODE
    return {
        "kind": kind,
        "host": host,
        "port": port,
        "sslmode": sslmode,
        "database": database,
        "user": user,
        "password_secret_ref": ref,
    }


# The lock, then the grant: two statements in one query string, one round trip (module doc).
_LOCKED_GRANT_SQL = "SELECT pg_advisory_xact_lock(%(key)s);\n" + _GRANT_SQL


def lease_request(*, org_id: str, request: LeaseRequest) -> LeaseOutcome:
    """``POST /warehouses/<org>/leases``: decide and insert the request's row, in one
    transaction under the per-org lock, in one round trip (``_LOCKED_GRANT_SQL``).

    Refusals are read from the committed row (not raised inside the transaction) so the
    ``refused`` row commits, as every request's row always has.
    """
    params: dict[str, str | int] = {
        "key": org_lock_key(org_id),
        "org": org_id,
        "holder": request.holder,
        "purpose": request.purpose,
        "wait": int(request.wait_seconds),
        "ttl": int(request.ttl_seconds),
    }
    with connection.cursor() as cursor:
        # Autocommit (the API's requests hold no transaction): the string is its own implicit
        # transaction. Inside a caller's transaction it joins that one, the lock held to its end.
        cursor.execute(_LOCKED_GRANT_SQL, params)
        if not cursor.cursor.nextset():  # the lock's result, then the grant's
            raise ServiceError(500, "the lease grant returned no result")
        row = cursor.fetchone()
    if row is None:
        raise ServiceError(404, "org has no managed warehouse")
    lease_id, state, queue_deadline, expires_at, warehouse_state, cap = row[:6]
    if state == LeaseState.GRANTED:
        return LeaseOutcome(
            201,
            {
                "lease_id": lease_id,
                "state": LeaseState.GRANTED.value,
                "expires_at": _iso(expires_at),
                "binding": _binding_from_row(row),
            },
        )
    if state == LeaseState.QUEUED:
        return LeaseOutcome(
            202,
            {
                "lease_id": lease_id,
                "state": LeaseState.QUEUED.value,
                "queue_deadline": _iso(queue_deadline),
            },
        )
    if warehouse_state == WarehouseState.RESHARDING:
        raise ServiceError(
            503,
            RESHARDING_MESSAGE,
            code="warehouse_resharding",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if warehouse_state != WarehouseState.READY:
        raise ServiceError(
            409,
            f"warehouse is not ready (currently {warehouse_state})",
            code="warehouse_not_ready",
        )
    raise ServiceError(429, f"connection lease cap reached ({cap})", code="lease_cap_reached")


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
    """Extend a granted, unexpired lease (allowed while ``resharding``: the drain waits).

    One guarded ``UPDATE … RETURNING``; only a refusal reads again (404 or 410)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_connection_leases SET expires_at = now() + make_interval(secs => %s)"
            " WHERE id = %s AND org_id = %s AND state = 'granted' AND expires_at > now()"
            " RETURNING expires_at",
            [int(ttl_seconds), lease_id, org_id],
        )
        row = cursor.fetchone()
    if row is None:
        if not ConnectionLease.objects.filter(pk=lease_id, org_id=org_id).exists():
            raise ServiceError(404, "no such lease")
        raise _gone(lease_id)
    return LeaseOutcome(200, {"lease_id": lease_id, "expires_at": _iso(row[0])})


def lease_release(*, org_id: str, lease_id: int) -> None:
    """``DELETE``: → ``released`` (idempotent; terminal leases are left as they are).

    One guarded ``UPDATE`` (raw: the lease routes are the data plane's hot path); only when it
    matches nothing is the lease's existence read (404 for an unknown lease, else the idempotent
    204)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_connection_leases SET state = 'released', released_at = now()"
            " WHERE id = %s AND org_id = %s AND state IN ('queued', 'granted')",
            [lease_id, org_id],
        )
        rows = cursor.rowcount
    if rows == 0 and not ConnectionLease.objects.filter(pk=lease_id, org_id=org_id).exists():
        raise ServiceError(404, "no such lease")
