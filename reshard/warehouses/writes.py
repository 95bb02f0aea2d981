"""Warehouse and metadata-store writes (spec reshard §5.5): the §2.3 rules on a binding, the
one-warehouse-per-catalog rule, and the guard that keeps a running reshard's warehouse columns
unchanged until it finishes. Every binding change returns its audited ``old → new`` list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.models import (
    MetadataStore,
    StoreKind,
    Warehouse,
    WarehouseState,
)
from duckgres_admin.platform.orglock import lock_org
from reshard.warehouses import binding_catalog, store_tls
from reshard.warehouses.rules import (
    BINDING_FIELDS,
    BINDING_IN_USE,
    GUARDED_WAREHOUSE_FIELDS,
    UNIQUE_BINDING_CONSTRAINTS,
    WAREHOUSE_RESHARDING,
    WAREHOUSE_WRITABLE_FIELDS,
    _check_binding_unique,
    _warehouse_values,
    audit_changes,
    validate_warehouse,
)
from reshard.warehouses.vetting import check_host


@dataclass(frozen=True)
class WarehouseWrite:
    warehouse: Warehouse
    changes: list[str]  # audited binding changes, ``field 'old' → 'new'``
    catalog_override: str = ""  # audited: a repoint applied without the catalog check


def _integrity_refusal(exc: IntegrityError, values: dict[str, Any], org_id: str) -> ServiceError:
    name = _constraint_name(exc)
    if name in UNIQUE_BINDING_CONSTRAINTS:
        # Lost a race with another write: name the winner (the check above missed it).
        store = (
            MetadataStore.objects.filter(name=values.get("metadata_store")).first()
            if values.get("metadata_store")
            else None
        )
        try:
            _check_binding_unique(values, org_id=org_id, store=store)
        except ServiceError as refusal:
            return refusal
        return ServiceError(
            409,
            "metadata_store_database: the database is already the catalog of another warehouse",
            code=BINDING_IN_USE,
        )
    return ServiceError(400, f"invalid warehouse: {name}")


def warehouse_create(*, values: dict[str, Any]) -> WarehouseWrite:
    org_id = str(values["org_id"])
    full = {f: values[f] for f in WAREHOUSE_WRITABLE_FIELDS if f in values}
    full.setdefault("state", WarehouseState.PENDING)
    validate_warehouse(full, org_id=org_id)
    changes = audit_changes(None, full, BINDING_FIELDS)
    store = full.pop("metadata_store", None)
    try:
        with transaction.atomic():
            warehouse = Warehouse.objects.create(org_id=org_id, metadata_store_id=store, **full)
    except IntegrityError as exc:
        if Warehouse.objects.filter(org_id=org_id).exists():
            raise ServiceError(409, f"org {org_id} already has a managed warehouse") from None
        raise _integrity_refusal(exc, {**full, "metadata_store": store}, org_id) from None
    return WarehouseWrite(warehouse, changes)


def _constraint_name(exc: IntegrityError) -> str:
    cause: Any = exc.__cause__
    diag = getattr(cause, "diag", None)
    return str(getattr(diag, "constraint_name", "") or "constraint violated")


def warehouse_update(
    *, org_id: str, changes: dict[str, Any], force_empty_binding: bool = False
) -> WarehouseWrite:
    """PATCH under the per-org lock; guarded columns change only while not ``resharding``.

    A repoint of the binding is applied only when the new binding holds a DuckLake catalog,
    checked before the lock (``reshard.warehouses.binding_catalog``, safeguard reshard-72), unless
    ``force_empty_binding`` (then the write carries the override for the audit record)."""
    if changes.get("state") == WarehouseState.RESHARDING:
        raise ServiceError(400, "state resharding is set only by a reshard")
    checked = binding_catalog.precheck(org_id=org_id, changes=changes, force=force_empty_binding)
    override = ""
    with transaction.atomic():
        lock_org(org_id)
        warehouse = Warehouse.objects.filter(org_id=org_id).first()
        if warehouse is None:
            raise ServiceError(404, "org has no managed warehouse")
        current = _warehouse_values(warehouse)
        changed = {k: v for k, v in changes.items() if current.get(k) != v}
        guarded = bool(GUARDED_WAREHOUSE_FIELDS & changed.keys())
        if guarded and warehouse.state == WarehouseState.RESHARDING:
            raise WAREHOUSE_RESHARDING
        merged = {**current, **changes}
        validate_warehouse(merged, check_state=False, org_id=org_id, written=frozenset(changed))
        if not changed:
            return WarehouseWrite(warehouse, [])
        if binding_catalog.moves(changed, merged):
            if force_empty_binding:
                override = binding_catalog.override_note(current, merged)
            elif checked is None or checked.key != binding_catalog.binding_key(merged):
                raise binding_catalog.changed_while_checked()
        audited = audit_changes(current, changed, BINDING_FIELDS)
        update = dict(changed)
        if "metadata_store" in update:
            update["metadata_store_id"] = update.pop("metadata_store")
        qs = Warehouse.objects.filter(org_id=org_id)
        if guarded:
            qs = qs.exclude(state=WarehouseState.RESHARDING)
        try:
            with transaction.atomic():
                rows = qs.update(updated_at=Now(), **update)
        except IntegrityError as exc:
            raise _integrity_refusal(exc, merged, org_id) from None
        if rows != 1:
            raise WAREHOUSE_RESHARDING
    warehouse.refresh_from_db()
    return WarehouseWrite(warehouse, audited, override)


STORE_FIELDS = (
    "name",
    "kind",
    "host",
    "port",
    "sslmode",
    "pooler_host",
    "pooler_port",
    "pooler_sslmode",
    "tls_policy",
    "tls_policy_reason",
    "provisioner_user",
    "provisioner_password_ref",
)
AUDITED_STORE_FIELDS = STORE_FIELDS[2:]


def validate_store(values: dict[str, Any], *, written: frozenset[str] | None = None) -> None:
    """A store definition. ``written``: the fields this request writes (None: a create); the
    host and allowlist rules apply to what is written, the sslmode rule always."""

    def writes(key: str) -> bool:
        return written is None or key in written

    if values.get("kind") == StoreKind.CNPG:
        for key in ("provisioner_user", "provisioner_password_ref"):
            if not values.get(key):
                raise ServiceError(400, f"invalid body: {key}: required for cnpg stores")
    if values.get("pooler_port") is not None and not values.get("pooler_host"):
        raise ServiceError(400, "invalid body: pooler_port: requires pooler_host")
    for key in ("sslmode", "pooler_sslmode"):
        value = values.get(key)
        if value == "disable":
            raise ServiceError(
                400,
                f"invalid body: {key}: disable is refused for every store (the provisioner "
                "password and the tenant catalogs would cross the network unencrypted); use "
                "require, verify-ca or verify-full",
            )
        # The same rule the connection seam applies: refused here, not at the first connect.
        problem = pgadmin.sslmode_refusal(str(value)) if value else None
        if problem is not None and writes(key):
            raise ServiceError(400, f"invalid body: {key}: {problem}")
    # verify-full unless the store opts in (tls_policy allow-weaker + reason; reshard-122).
    tls_problem = store_tls.store_values_refusal(values, written=written)
    if tls_problem is not None:
        raise ServiceError(400, f"invalid body: {tls_problem}")
    for key in ("host", "pooler_host"):
        if values.get(key) and writes(key):
            check_host(f"invalid body: {key}", str(values[key]))
    ref = values.get("provisioner_password_ref")
    if ref:
        try:
            secretrefs.parse(ref)
            if writes("provisioner_password_ref"):
                secretrefs.check_allowed(ref, "provisioner")
        except secretrefs.SecretRefError as exc:
            raise ServiceError(400, f"invalid body: provisioner_password_ref: {exc}") from None


@dataclass(frozen=True)
class StoreWrite:
    store: MetadataStore
    changes: list[str]  # audited endpoint/provisioner changes, ``field 'old' → 'new'``


def metadata_store_create(*, values: dict[str, Any]) -> StoreWrite:
    full = {k: v for k, v in values.items() if k in STORE_FIELDS}
    validate_store(full)
    name = str(full["name"])
    try:
        with transaction.atomic():
            store = MetadataStore.objects.create(**full)
    except IntegrityError as exc:
        if MetadataStore.objects.filter(name=name).exists():
            raise ServiceError(409, f"metadata store {name} already exists") from None
        raise ServiceError(400, f"invalid metadata store: {_constraint_name(exc)}") from None
    return StoreWrite(store, audit_changes(None, _store_values(store), AUDITED_STORE_FIELDS))


def _store_values(store: MetadataStore) -> dict[str, Any]:
    return {f: getattr(store, f) for f in STORE_FIELDS}


def metadata_store_update(*, name: str, changes: dict[str, Any]) -> StoreWrite:
    """PATCH by compare-and-swap on the values read, so the audited ``old → new`` is exact."""
    store = MetadataStore.objects.filter(name=name).first()
    if store is None:
        raise ServiceError(404, "no such metadata store")
    current = _store_values(store)
    changed = {k: v for k, v in changes.items() if current.get(k) != v}
    merged = {**current, **changes}
    validate_store(merged, written=frozenset(changed))
    if not changed:
        return StoreWrite(store, [])
    try:
        with transaction.atomic():
            rows = MetadataStore.objects.filter(
                name=name, **{k: current[k] for k in changed}
            ).update(updated_at=Now(), **changed)
    except IntegrityError as exc:
        raise ServiceError(400, f"invalid metadata store: {_constraint_name(exc)}") from None
    if rows != 1:
        raise ServiceError(
            409,
            f"metadata store {name} changed while this update was applied; read it again and retry",
        )
    store.refresh_from_db()
    return StoreWrite(store, audit_changes(current, changed, AUDITED_STORE_FIELDS))
