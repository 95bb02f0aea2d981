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
    EXTERNAL_SSLMODES,
    MetadataStore,
    StoreKind,
    Warehouse,
    WarehouseState,
)
from duckgres_admin.orglock import lock_org
from reshard import identity
from reshard.selectors import LIVE_WAREHOUSE_EXCLUDED
from reshard.vetting import check_host, hostport

GUARDED_WAREHOUSE_FIELDS = frozenset(
    {
        "state",
        "compaction_enabled",
        "metadata_store_kind",
        "metadata_store",
        "metadata_store_host",
        "metadata_store_port",
        "metadata_store_sslmode",
        "metadata_store_database",
        "metadata_store_user",
        "metadata_store_password_ref",
    }
)
WAREHOUSE_RESHARDING = ServiceError(
    409,
    "a metadata-store reshard owns this warehouse until it finishes",
    code="warehouse_resharding",
)


BINDING_FIELDS = (
    "metadata_store_kind",
    "metadata_store",
    "metadata_store_host",
    "metadata_store_port",
    "metadata_store_sslmode",
    "metadata_store_database",
    "metadata_store_user",
    "metadata_store_password_ref",
)
BINDING_IN_USE = "binding_in_use"


def _show(value: Any) -> str:
    """An audited value: references and endpoints are not secrets; empty strings stay visible."""
    if value is None:
        return "null"
    return f"'{value}'" if isinstance(value, str) else str(value)


def audit_changes(
    old: dict[str, Any] | None, new: dict[str, Any], fields: tuple[str, ...]
) -> list[str]:
    """``field 'old' → 'new'`` for each audited field that changed (``old`` None: a create,
    ``field 'value'`` for each one set)."""
    label = {"metadata_store": "metadata_store_name"}
    out: list[str] = []
    for f in fields:
        if f not in new:
            continue
        name = label.get(f, f)
        if old is None:
            if new[f] not in ("", None):
                out.append(f"{name} {_show(new[f])}")
        elif old.get(f) != new[f]:
            out.append(f"{name} {_show(old.get(f))} → {_show(new[f])}")
    return out


def validate_warehouse(
    values: dict[str, Any],
    *,
    check_state: bool = True,
    org_id: str = "",
    written: frozenset[str] | None = None,
) -> None:
    """The §2.3 CHECKs and binding rules on a complete set of column values.

    ``written`` names the fields this request writes (None: every field, a create): the
    allowlist, host and role-name rules apply to what is written, so a legacy row is not
    refused for a field nobody touches. The one-warehouse-per-catalog rule applies whenever the
    binding or the state changes."""

    def writes(*keys: str) -> bool:
        return written is None or any(k in written for k in keys)

    kind = values.get("metadata_store_kind", "")
    store_name = values.get("metadata_store")
    store: MetadataStore | None = None
    if check_state and values.get("state") == WarehouseState.RESHARDING:
        raise ServiceError(400, "state resharding is set only by a reshard")
    if kind == StoreKind.CNPG:
        for key in (
            "metadata_store_database",
            "metadata_store_user",
            "metadata_store_password_ref",
        ):
            if not values.get(key):
                raise ServiceError(400, f"invalid body: {key}: required for cnpg bindings")
        if not store_name:
            raise ServiceError(400, "invalid body: metadata_store_name: required for cnpg bindings")
        store = MetadataStore.objects.filter(name=store_name).first()
        if store is None or store.kind != StoreKind.CNPG:
            raise ServiceError(
                400, "invalid body: metadata_store_name: must name a registered cnpg store"
            )
        for key in ("metadata_store_host", "metadata_store_sslmode"):
            if values.get(key):
                raise ServiceError(400, f"invalid body: {key}: must be empty for cnpg bindings")
        if values.get("metadata_store_port") is not None:
            raise ServiceError(
                400, "invalid body: metadata_store_port: must be empty for cnpg bindings"
            )
    elif kind == StoreKind.EXTERNAL:
        for key in (
            "metadata_store_host",
            "metadata_store_database",
            "metadata_store_user",
            "metadata_store_password_ref",
        ):
            if not values.get(key):
                raise ServiceError(400, f"invalid body: {key}: required for external bindings")
        if values.get("metadata_store_port") is None:
            raise ServiceError(
                400, "invalid body: metadata_store_port: required for external bindings"
            )
        if store_name:
            raise ServiceError(
                400, "invalid body: metadata_store_name: must be empty for external bindings"
            )
        if values.get("metadata_store_sslmode", "") not in ("", *EXTERNAL_SSLMODES):
            raise ServiceError(
                400,
                "invalid body: metadata_store_sslmode: must be one of "
                + ", ".join(EXTERNAL_SSLMODES),
            )
        if writes("metadata_store_host"):
            check_host("invalid body: metadata_store_host", str(values["metadata_store_host"]))
    elif kind == "" and store_name:
        raise ServiceError(
            400, "invalid body: metadata_store_name: requires metadata_store_kind cnpg"
        )
    ref = values.get("metadata_store_password_ref")
    if ref:
        try:
            secretrefs.parse(ref)
            if writes("metadata_store_password_ref"):
                secretrefs.check_allowed(ref, "tenant")
        except secretrefs.SecretRefError as exc:
            raise ServiceError(400, f"invalid body: metadata_store_password_ref: {exc}") from None
    if store is not None and writes("metadata_store_user", "metadata_store", "metadata_store_kind"):
        refusal = identity.tenant_role_message(
            None,
            org_id=org_id,
            role=str(values["metadata_store_user"]),
            database=str(values["metadata_store_database"]),
            store=store,
        )
        if refusal:
            code = BINDING_IN_USE if "also the role of warehouse" in refusal else None
            raise ServiceError(
                409 if code else 400, f"invalid body: metadata_store_user: {refusal}", code=code
            )
    if writes(*BINDING_FIELDS, "state"):
        _check_binding_unique(values, org_id=org_id, store=store)


def _binding_server(
    values: dict[str, Any], store: MetadataStore | None
) -> tuple[str | None, set[tuple[str, int]], str] | None:
    """(cnpg store name, endpoints, label) of a complete binding; None without one."""
    kind = values.get("metadata_store_kind", "")
    if kind == StoreKind.CNPG and store is not None:
        name, endpoints = identity.store_server(store)
        return name, endpoints, f"store {store.name}"
    if kind == StoreKind.EXTERNAL and values.get("metadata_store_host"):
        host, port = str(values["metadata_store_host"]), int(values["metadata_store_port"] or 5432)
        return None, {(host, port)}, hostport(host, port)
    return None


def _check_binding_unique(
    values: dict[str, Any], *, org_id: str, store: MetadataStore | None
) -> None:
    """409 naming the other warehouse when a live warehouse of another org is bound to the same
    database on the same server (the unique indexes of migration 0008 back this up)."""
    if values.get("state") in LIVE_WAREHOUSE_EXCLUDED or not values.get("metadata_store_database"):
        return
    server = _binding_server(values, store)
    if server is None:
        return
    name, endpoints, label = server
    database = str(values["metadata_store_database"])
    other = identity.other_binding(
        org_id=org_id, database=database, store_name=name, endpoints=endpoints
    )
    if other is not None:
        raise ServiceError(
            409,
            f"metadata_store_database: database {database} on {label} is already the catalog "
            f"of warehouse {other.org_id}; a catalog belongs to one warehouse (bind this one to "
            "its own database, or move the other first)",
            code=BINDING_IN_USE,
        )


def _warehouse_values(warehouse: Warehouse) -> dict[str, Any]:
    values = {f: getattr(warehouse, f) for f in WAREHOUSE_WRITABLE_FIELDS if f != "metadata_store"}
    values["metadata_store"] = warehouse.metadata_store_id
    return values


WAREHOUSE_WRITABLE_FIELDS = (
    "database_name",
    "state",
    "metadata_store_kind",
    "metadata_store",
    "metadata_store_host",
    "metadata_store_port",
    "metadata_store_sslmode",
    "metadata_store_database",
    "metadata_store_user",
    "metadata_store_password_ref",
    "compaction_enabled",
    "data_bucket",
    "data_region",
    "data_role_arn",
    "max_connection_leases",
)
UNIQUE_BINDING_CONSTRAINTS = ("warehouse_cnpg_binding_unique", "warehouse_external_binding_unique")


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
    checked before the lock (``reshard.binding_catalog``, safeguard reshard-72), unless
    ``force_empty_binding`` (then the write carries the override for the audit record)."""
    from reshard import binding_catalog

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
