"""Org reconcile and failure recording (spec trino-pools §4.10, §4.9, §2.1 write rules).

``reconcile_org(org_id)`` makes one org's catalog in its owning pool match its warehouse, and
records the outcome on the org's Trino row; ``reconcile_orgs()`` is the leader's sweep. Both run
in the trino worker, which holds the catalog writers (the Celery wrappers live in
``trino_pools.tasks``).

Invariants:

1. **Skips write nothing.** An unassigned or unconfigured owner, and a warehouse in
   ``resharding``, return before any read of the catalog store and before any write: no
   publication, no removal, no state write (a finished reshard's binding is published later).
2. **Non-leaders never touch org rows.** The first catalog call happens before the first row
   write; ``NotThisReplica`` from it (or any later call) leaves the row exactly as it was. A
   lost fence (``WriterFenced``, ``PoolConflict``) also leaves the row untouched and releases
   this process's writer and authority for the pool: a fenced term never fights back.
3. **Every state write is guarded** by ``enabled = true`` and the owner read at the start, so a
   write racing a disable or a move is dropped. Disabled rows only ever get ``catalog_name``
   cleared, and only after their catalog is gone from the owning pool.
4. **A catalog name is claimed before its first publication** with a guarded update; the
   partial unique index ``(trino_cell_id, catalog_name)`` makes a second org with the same name
   fail (naming the holder) while the holder's catalog is untouched.
5. **Ready needs evidence.** ``ready`` is written only after the publication (if any) and a
   successful checkpoint of the catalog's revision onto ``publication_revision``; a failed
   checkpoint is a failure (an org not ready yet stays not ready; a ready one: see 7) and the
   next pass checkpoints again because the watermark is still behind the catalog's revision.
   With tenant admission the publication row must also show an admitted target (§4.10 step 5).
6. **Any other failure is recorded** (except as in 7): ``state=failed``, ``failed_at=now()``,
   the error text clipped to 1024 characters (errors of the catalog store never carry its DSN).
7. **A publisher blip never un-readies a published org.** For a row that was ``ready`` when
   the pass read it, a failure of the publication machinery after the name claim — the
   catalog-store write (alter, create, drop of a former name), the read-back of the written
   definition (an error or a definition that is not the rendered one), or the checkpoint of
   the watermark — keeps ``state=ready`` (its previously published catalog still serves) and
   records the error the same way (``status_message`` clipped, ``failed_at=now()``), guarded
   by ``state = 'ready'`` as well. The sweep reconciles every enabled row, so the next pass
   retries, and its success clears the message and ``failed_at``. Problems of the org itself
   (an unrenderable warehouse, a catalog name held by another org) and refusals that are
   decisions (``IntentChanged``) still mark it ``failed``.
8. **Orphans are removed only with proof.** The sweep removes a pool's catalog only when its
   definition names an org that is deleted or owned by another pool (a move), checked under the
   org's advisory lock that a move also takes; catalogs naming no org are never touched.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Q

from duckgres_admin.models.trino import (
    PublicationState,
    TrinoPoolPublication,
    WarehouseTrino,
    clip_status_message,
)
from duckgres_admin.models.warehouses import Warehouse, WarehouseState
from duckgres_admin.platform.orglock import lock_org
from trino_pools import authority, catalog_writer, config, operator
from trino_pools.authority import NotThisReplica, PoolConflict
from trino_pools.catalog_writer import WriterFenced
from trino_pools.catalogs import catalog_name, payload_hash, render_definition
from trino_pools.registry import Cell

_log = logging.getLogger("duckgres.trino.reconcile")

WAITING_PUBLISH = "waiting for the pool to publish this warehouse"
REVOKED = "this warehouse's admission was revoked"
WAITING_ADMIT = "waiting for the pool to admit this warehouse: {state}"
UNREADABLE = "the pool's publication state is unreadable"

# Outcomes returned by reconcile_org (also the log vocabulary).
ABSENT = "absent"
UNCONFIGURED = "unconfigured"
RESHARDING = "resharding"
NOT_THIS_REPLICA = "not_this_replica"
FENCED = "fenced"
RACED = "raced"
DISABLED = "disabled"
REMOVED = "removed"
FAILED = "failed"
READY = "ready"
READY_RETRYING = "ready_retrying"  # still ready; its republication failed (invariant 7)
PROVISIONING = "provisioning"


class CatalogNameTaken(Exception):
    """Another org of the pool holds the catalog name (§4.9)."""


class _Raced(Exception):
    """The row changed under this reconcile (disabled or moved): drop the pass."""


class _PublisherBlip(Exception):
    """The publication machinery failed while republishing an org that was already ready
    (invariant 7): recorded on the row, which stays ready."""


def _name_taken(name: str, public_id: str, holder: str) -> str:
    return (
        f"catalog name {name} on Trino pool {public_id} is already used by warehouse {holder}; "
        "rename one database_name or move one warehouse"
    )


def _execute(sql: str, params: list[Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def _to_provisioning(org_id: str, owner: str) -> None:
    _execute(
        "UPDATE duckgres_managed_warehouse_trino SET state = 'provisioning', updated_at = now() "
        "WHERE org_id = %s AND enabled = true AND trino_cell_id = %s AND state = 'pending'",
        [org_id, owner],
    )


def _write_ready(org_id: str, owner: str) -> None:
    _execute(
        "UPDATE duckgres_managed_warehouse_trino SET state = 'ready', status_message = '', "
        "ready_at = COALESCE(ready_at, now()), failed_at = NULL, updated_at = now() "
        "WHERE org_id = %s AND enabled = true AND trino_cell_id = %s AND (state <> 'ready' "
        "OR status_message <> '' OR ready_at IS NULL OR failed_at IS NOT NULL)",
        [org_id, owner],
    )


def _write_provisioning(org_id: str, owner: str, message: str) -> None:
    _execute(
        "UPDATE duckgres_managed_warehouse_trino SET state = 'provisioning', "
        "status_message = %s, failed_at = NULL, updated_at = now() "
        "WHERE org_id = %s AND enabled = true AND trino_cell_id = %s AND (state <> "
        "'provisioning' OR status_message <> %s OR failed_at IS NOT NULL)",
        [clip_status_message(message), org_id, owner, clip_status_message(message)],
    )


def _write_failed(org_id: str, owner: str, message: str) -> None:
    _execute(
        "UPDATE duckgres_managed_warehouse_trino SET state = 'failed', status_message = %s, "
        "failed_at = now(), updated_at = now() "
        "WHERE org_id = %s AND enabled = true AND trino_cell_id = %s",
        [clip_status_message(message), org_id, owner],
    )


def _write_ready_error(org_id: str, owner: str, message: str) -> bool:
    """Record a publisher blip on a ready row (invariant 7); False if it is no longer ready."""
    return (
        _execute(
            "UPDATE duckgres_managed_warehouse_trino SET status_message = %s, "
            "failed_at = now(), updated_at = now() "
            "WHERE org_id = %s AND enabled = true AND trino_cell_id = %s AND state = 'ready'",
            [clip_status_message(message), org_id, owner],
        )
        == 1
    )


def _claim(org_id: str, owner: str, public_id: str, old: str, name: str) -> None:
    """Claim ``name`` in the owning pool (guarded); raises CatalogNameTaken or _Raced."""
    try:
        with transaction.atomic():
            claimed = _execute(
                "UPDATE duckgres_managed_warehouse_trino SET catalog_name = %s, "
                "updated_at = now() WHERE org_id = %s AND enabled = true "
                "AND trino_cell_id = %s AND catalog_name = %s",
                [name, org_id, owner, old],
            )
    except IntegrityError:
        holder = (
            WarehouseTrino.objects.filter(trino_cell_id=owner, catalog_name=name)
            .exclude(warehouse_id=org_id)
            .values_list("warehouse_id", flat=True)
            .first()
        )
        raise CatalogNameTaken(_name_taken(name, public_id, str(holder or "another org"))) from None
    if claimed != 1:
        raise _Raced()


def _gate(org_id: str, cell: Cell) -> tuple[str, str]:
    """The ready gate (§4.10 step 5): ``(state, status message)``."""
    if not cell.pool.tenant_admission:
        return READY, ""
    try:
        with transaction.atomic():
            pub = (
                TrinoPoolPublication.objects.filter(pool_id=cell.stored_id, org_id=org_id)
                .values("state", "admitted_target_revision")
                .first()
            )
    except DatabaseError:
        _log.warning("org %s: the publication row of %s is unreadable", org_id, cell.id)
        return PROVISIONING, UNREADABLE
    if pub is None:
        return PROVISIONING, WAITING_PUBLISH
    if pub["state"] == PublicationState.REVOKED:
        return PROVISIONING, REVOKED
    admitted = pub["admitted_target_revision"]
    if admitted in (None, "", 0):
        return PROVISIONING, WAITING_ADMIT.format(state=pub["state"])
    return READY, ""


def _live_authority(cell: Cell) -> authority.Authority:
    auth = authority.HOLDER.get(cell.stored_id)
    if auth is None:
        raise NotThisReplica(cell.id)
    return auth


def _checkpoint(cell: Cell, revision: int) -> None:
    """Make ``publication_revision`` cover ``revision``; errors propagate (org not ready)."""
    if revision <= 0 or catalog_writer.publication_revision(cell.stored_id) >= revision:
        return
    catalog_writer.checkpoint_revision(_live_authority(cell), revision)


def _write_and_check(
    client: catalog_writer.CatalogClient,
    cell: Cell,
    org_id: str,
    published: dict[str, str],
    target: tuple[str, str, dict[str, Any], str],
) -> None:
    """Publish when the store's hash differs, remove a former name, read the catalog back and
    checkpoint its revision (§4.10 step 2). ``target`` is ``(former name, name, definition,
    payload hash)``. Raises on any failure (the caller decides what the row records)."""
    old, name, definition, digest = target
    revision = 0
    if published.get(name) != digest:
        if name in published:
            revision = client.alter(name, definition, digest)
        else:
            revision = client.create(name, definition, digest)
        _log.info(
            "org %s: published catalog %s on %s (revision %d)", org_id, name, cell.id, revision
        )
    if old and old != name and old in published:
        revision = max(revision, client.drop(old))
        _log.info("org %s: removed its former catalog %s from %s", org_id, old, cell.id)
    entry = client.describe(name)
    if entry is None or entry.payload_hash != digest:
        raise catalog_writer.CatalogStoreError(
            f"catalog {name} on Trino pool {cell.id} does not hold the rendered definition"
        )
    _checkpoint(cell, max(revision, entry.revision))


def _publish(row: WarehouseTrino, warehouse: Warehouse, cell: Cell) -> str:
    """Steps 2 and 5 of §4.10 for an enabled row; raises on failure."""
    org_id, owner = warehouse.org_id, cell.stored_id
    client = catalog_writer.client_for(owner)
    published = client.list_catalogs()  # NotThisReplica here, before any row write
    _live_authority(cell)
    if row.state == "pending":
        _to_provisioning(org_id, owner)
    settings = config.current()
    definition = render_definition(warehouse, row, settings)
    name = catalog_name(warehouse.database_name)
    digest = payload_hash(definition)
    old = row.catalog_name
    if old != name:
        _claim(org_id, owner, cell.id, old, name)
    try:
        _write_and_check(client, cell, org_id, published, (old, name, definition, digest))
    except (catalog_writer.CatalogStoreError, DatabaseError) as exc:
        if row.state == READY:
            raise _PublisherBlip(str(exc) or type(exc).__name__) from exc
        raise
    state, message = _gate(org_id, cell)
    if state == READY:
        _write_ready(org_id, owner)
    else:
        _write_provisioning(org_id, owner, message)
    return state


def _teardown(row: WarehouseTrino, cell: Cell) -> str:
    """A disabled row: remove its catalog from the owning pool, then clear ``catalog_name``."""
    name = row.catalog_name
    if not name:
        return DISABLED
    client = catalog_writer.client_for(cell.stored_id)
    if name in client.list_catalogs():
        revision = client.drop(name)
        _checkpoint(cell, revision)
        _log.info("org %s: removed catalog %s from %s", row.warehouse_id, name, cell.id)
    _execute(
        "UPDATE duckgres_managed_warehouse_trino SET catalog_name = '', updated_at = now() "
        "WHERE org_id = %s AND enabled = false AND trino_cell_id = %s AND catalog_name = %s",
        [row.warehouse_id, cell.stored_id, name],
    )
    return REMOVED


def _fence_lost(cell: Cell, exc: BaseException) -> None:
    """A fence refusal ends the pool's term (``operator.end_term``: holder, writer, metrics, and
    no new term for one lease duration), exactly as it would inside the pool tick."""
    auth = authority.HOLDER.get(cell.stored_id)
    writer = catalog_writer.installed(cell.stored_id)
    catalog_writer.uninstall(cell.stored_id, writer)
    if auth is not None:
        authority.HOLDER.clear(cell.stored_id, auth)
    operator.operator().end_term(cell.stored_id, fenced=True, reason=f"org reconcile: {exc}")
    _log.warning("Trino pool %s: catalog writer fenced during an org reconcile: %s", cell.id, exc)


def reconcile_org(org_id: str) -> str:
    """Reconcile one org (§4.10); returns the outcome (one of the module's outcome words)."""
    settings = config.current()
    row = (
        WarehouseTrino.objects.select_related("warehouse", "warehouse__metadata_store")
        .filter(warehouse__org_id=org_id)
        .first()
    )
    if row is None:
        return ABSENT
    cell = settings.cell_by_stored_id(row.trino_cell_id) if row.trino_cell_id else None
    if cell is None:
        return UNCONFIGURED  # the ownership audit reports it; never mutated here
    warehouse = row.warehouse
    if warehouse.state == WarehouseState.RESHARDING:
        return RESHARDING
    try:
        if not row.enabled:
            return _teardown(row, cell)
        try:
            return _publish(row, warehouse, cell)
        except (NotThisReplica, WriterFenced, PoolConflict, _Raced):
            raise
        except _PublisherBlip as blip:
            if _write_ready_error(org_id, cell.stored_id, str(blip)):
                _log.warning(
                    "org %s: republishing its Trino catalog failed; it stays ready on the "
                    "published catalog and the sweep retries: %s",
                    org_id,
                    blip,
                )
                return READY_RETRYING
            _write_failed(org_id, cell.stored_id, str(blip))
            _log.warning("org %s: Trino reconcile failed: %s", org_id, blip)
            return FAILED
        except Exception as exc:  # noqa: BLE001 - §4.10 step 4: any other failure is recorded
            message = str(exc) or type(exc).__name__
            _write_failed(org_id, cell.stored_id, message)
            _log.warning("org %s: Trino reconcile failed: %s", org_id, message)
            return FAILED
    except NotThisReplica:
        _log.debug("org %s: no catalog writer for %s on this control plane", org_id, cell.id)
        return NOT_THIS_REPLICA
    except (WriterFenced, PoolConflict) as exc:
        _fence_lost(cell, exc)
        return FENCED
    except _Raced:
        return RACED
    except Exception as exc:  # noqa: BLE001 - a disabled row: nothing to record, retried later
        _log.warning("org %s: removing its Trino catalog failed: %s", org_id, exc)
        return FAILED


def remove_orphans(pool_id: str) -> list[str]:
    """Remove the pool's catalogs whose org no longer lives here (moved away or deleted).

    A catalog is an orphan only when its definition names an org (``org_id``) whose Trino row
    is gone or is owned by another pool; catalogs without an ``org_id`` are never touched, and
    an org still owned here (enabled or disabled) is left to ``reconcile_org``. The check and
    the removal run under the org's advisory lock, which a move takes too, so a move back to
    this pool cannot interleave. Returns the removed catalog names.
    """
    pair = catalog_writer.live(pool_id)
    if pair is None:
        return []
    writer, auth = pair
    removed: list[str] = []
    for name, org_id in writer.owners().items():
        if not org_id:
            continue
        with transaction.atomic():
            lock_org(org_id)
            owner = (
                WarehouseTrino.objects.filter(warehouse__org_id=org_id)
                .values_list("trino_cell_id", flat=True)
                .first()
            )
            if owner == pool_id:
                continue
            revision = writer.drop(name)
        catalog_writer.checkpoint_revision(auth, revision)
        removed.append(name)
        _log.info(
            "Trino pool %s: removed catalog %s of org %s (%s)",
            auth.public_id,
            name,
            org_id,
            "deleted" if owner is None else f"now owned by {owner or 'nobody'}",
        )
    return removed


def reconcile_orgs() -> int:
    """The leader's sweep: every enabled row, and every disabled row still holding a catalog
    name, of the pools whose writer this process holds. Each org is isolated. Returns the
    number of orgs reconciled."""
    settings = config.current()
    pools = [c.stored_id for c in settings.cells if catalog_writer.live(c.stored_id) is not None]
    if not pools:
        return 0
    org_ids = list(
        WarehouseTrino.objects.filter(trino_cell_id__in=pools)
        .filter(Q(enabled=True) | ~Q(catalog_name=""))
        .order_by("warehouse_id")
        .values_list("warehouse_id", flat=True)
    )
    for pool_id in pools:
        try:
            remove_orphans(pool_id)
        except (WriterFenced, PoolConflict) as exc:
            cell = settings.cell_by_stored_id(pool_id)
            if cell is not None:
                _fence_lost(cell, exc)
        except Exception:  # noqa: BLE001 - the org reconciles below still run
            _log.exception("Trino pool %s: removing orphaned catalogs failed", pool_id)
    done = 0
    for org_id in org_ids:
        try:
            reconcile_org(str(org_id))
        except Exception:  # noqa: BLE001 - one org never stops the sweep
            _log.exception("org %s: Trino reconcile raised", org_id)
            continue
        done += 1
    return done


__all__ = [
    "READY_RETRYING",
    "REVOKED",
    "UNREADABLE",
    "WAITING_ADMIT",
    "WAITING_PUBLISH",
    "CatalogNameTaken",
    "reconcile_org",
    "reconcile_orgs",
    "remove_orphans",
]
