"""The rules of a warehouse row (spec reshard §2.3, §5.5), below every writer: the guarded
columns a running reshard owns, the binding fields, the validation of a binding (server, TLS,
one warehouse per catalog). ``reshard.warehouses.writes`` (the writes) and
``reshard.warehouses.binding_catalog`` (the repoint's catalog check) both import it; it imports
neither.
"""

from __future__ import annotations

from typing import Any

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lib import secretrefs
from duckgres_admin.models import (
    EXTERNAL_SSLMODES,
    MetadataStore,
    StoreKind,
    Warehouse,
    WarehouseState,
)
from reshard.engines import identity
from reshard.warehouses import store_tls
from reshard.warehouses.drain_guard import draining_refusal
from reshard.warehouses.selectors import LIVE_WAREHOUSE_EXCLUDED
from reshard.warehouses.vetting import check_host, hostport

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
# The columns a running reshard owns: its binding, its state and its compaction switch.
GUARDED_WAREHOUSE_FIELDS = frozenset({"state", "compaction_enabled", *BINDING_FIELDS})
WAREHOUSE_RESHARDING = ServiceError(
    409,
    "a metadata-store reshard owns this warehouse until it finishes",
    code="warehouse_resharding",
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


def _check_cnpg_binding(
    values: dict[str, Any], store_name: Any, *, drained_check: bool
) -> MetadataStore:
    """A cnpg binding: its identity fields, a registered cnpg store (not one being drained
    when the binding names it anew), no external-only fields; returns the store."""
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
    if drained_check:
        drained = draining_refusal(str(store_name))
        if drained:
            raise ServiceError(
                409, f"invalid body: metadata_store_name: {drained}", code="store_draining"
            )
    for key in ("metadata_store_host", "metadata_store_sslmode"):
        if values.get(key):
            raise ServiceError(400, f"invalid body: {key}: must be empty for cnpg bindings")
    if values.get("metadata_store_port") is not None:
        raise ServiceError(
            400, "invalid body: metadata_store_port: must be empty for cnpg bindings"
        )
    return store


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
        store = _check_cnpg_binding(values, store_name, drained_check=writes("metadata_store"))
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
        if writes("metadata_store_sslmode", "metadata_store_host", "metadata_store_port"):
            store_tls.require_endpoint_opt_in(  # verify-full unless opted in (reshard-122)
                "invalid body: metadata_store_sslmode",
                str(values["metadata_store_host"]),
                int(values["metadata_store_port"]),
                str(values.get("metadata_store_sslmode") or ""),
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
    *BINDING_FIELDS,
    "compaction_enabled",
    "data_bucket",
    "data_region",
    "data_role_arn",
    "max_connection_leases",
)
UNIQUE_BINDING_CONSTRAINTS = ("warehouse_cnpg_binding_unique", "warehouse_external_binding_unique")
