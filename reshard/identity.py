"""Target identity checks (spec reshard §4.18), shared by the start API and the runner.

1. Not the source database: compare the servers' ``system_identifier`` (else address, port and
   data directory, else the configured ``host:port``) together with the database names.
2. Not another warehouse's catalog: no other org's live warehouse bound to the same server
   (same cnpg store name, or a shared ``host:port`` endpoint) and the same database.
3. cnpg target database ownership: an existing target database must be owned by the tenant
   role; we never adopt someone else's database.

Each check returns an error message (``None`` when the check passes); callers decide whether
that is a 400 (submit) or a step failure (runner). Connections come from ``lib.pgadmin``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models import MetadataStore, StoreKind, Warehouse, WarehouseState

PgConnection = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class ServerIdentity:
    """What a connection tells us about the server behind it (None = not readable)."""

    configured: tuple[str, int]
    system_identifier: str | None = None
    address: tuple[str, int] | None = None
    data_directory: str | None = None
    unreadable: tuple[str, ...] = field(default=())


def normalize_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


def read_server_identity(conn: PgConnection, configured: Endpoint) -> ServerIdentity:
    """Read ``pg_control_system()``; when refused, fall back to address/port/data directory."""
    key = (normalize_host(configured.host), configured.port)
    try:
        row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
        if row and row[0]:
            return ServerIdentity(configured=key, system_identifier=str(row[0]))
    except psycopg.Error:
        pass
    unreadable = ["pg_control_system()"]
    address: tuple[str, int] | None = None
    try:
        row = conn.execute("SELECT inet_server_addr()::text, inet_server_port()").fetchone()
        if row and row[0] is not None and row[1] is not None:
            address = (str(row[0]).split("/", 1)[0], int(str(row[1])))
        else:
            unreadable.append("inet_server_addr()")
    except psycopg.Error:
        unreadable.append("inet_server_addr()")
    data_directory: str | None = None
    try:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        data_directory = str(row[0]) if row and row[0] else None
    except psycopg.Error:
        unreadable.append("data_directory")
    return ServerIdentity(
        configured=key,
        address=address,
        data_directory=data_directory,
        unreadable=tuple(unreadable),
    )


@dataclass(frozen=True)
class SameDatabaseVerdict:
    same: bool
    warning: str = ""


SAME_DATABASE_MESSAGE = "target is the same PostgreSQL database as the source"


def compare_databases(
    source: ServerIdentity | None,
    source_database: str,
    target: ServerIdentity | None,
    target_database: str,
    *,
    source_configured: tuple[str, int],
    target_configured: tuple[str, int],
) -> SameDatabaseVerdict:
    """Check 1. ``None`` identities (no connection) compare as configured, with a warning."""
    if source_database != target_database:
        return SameDatabaseVerdict(False)
    if source and target and source.system_identifier and target.system_identifier:
        return SameDatabaseVerdict(source.system_identifier == target.system_identifier)
    if source and target and source.address and target.address:
        same_server = source.address == target.address
        if source.data_directory and target.data_directory:
            same_server = same_server and source.data_directory == target.data_directory
        return SameDatabaseVerdict(same_server)
    missing: list[str] = []
    for label, ident in (("source", source), ("target", target)):
        if ident is None:
            missing.append(f"{label}: no connection")
        elif ident.unreadable:
            missing.append(f"{label}: {', '.join(ident.unreadable)}")
    warning = (
        "could not read the server identity ("
        + "; ".join(missing)
        + "); comparing host:port:database as configured"
    )
    src = (normalize_host(source_configured[0]), source_configured[1])
    tgt = (normalize_host(target_configured[0]), target_configured[1])
    return SameDatabaseVerdict(src == tgt, warning)


def store_endpoints(store: MetadataStore) -> set[tuple[str, int]]:
    """A cnpg store's direct and pooler endpoints."""
    endpoints = {(normalize_host(store.host), store.port)}
    if store.pooler_host:
        endpoints.add((normalize_host(store.pooler_host), store.pooler_port or store.port))
    return endpoints


def _binding_server(
    warehouse: Warehouse, stores: dict[str, MetadataStore]
) -> tuple[str | None, set[tuple[str, int]]]:
    if warehouse.metadata_store_kind == StoreKind.CNPG and warehouse.metadata_store_id:
        store = stores.get(str(warehouse.metadata_store_id))
        return str(warehouse.metadata_store_id), store_endpoints(store) if store else set()
    if warehouse.metadata_store_kind == StoreKind.EXTERNAL and warehouse.metadata_store_host:
        port = warehouse.metadata_store_port or 5432
        return None, {(normalize_host(warehouse.metadata_store_host), port)}
    return None, set()


def other_warehouse_message(
    *,
    org_id: str,
    target_database: str,
    target_store: str | None,
    target_endpoints: Iterable[tuple[str, int]],
    target_label: str,
) -> str | None:
    """Check 2: the message naming the other org, or None."""
    endpoints = {(normalize_host(h), p) for h, p in target_endpoints}
    stores = {s.name: s for s in MetadataStore.objects.all()}
    candidates = (
        Warehouse.objects.exclude(org_id=org_id)
        .exclude(state__in=[WarehouseState.DELETING, WarehouseState.DELETED])
        .filter(metadata_store_database=target_database)
        .order_by("org_id")
    )
    for warehouse in candidates:
        store_name, bound = _binding_server(warehouse, stores)
        if (target_store and store_name == target_store) or (bound & endpoints):
            return (
                f"target database {target_database} on {target_label} is the catalog of "
                f"another warehouse ({warehouse.org_id})"
            )
    return None


def database_owner_message(
    conn: PgConnection, *, database: str, tenant_role: str, store_name: str
) -> str | None:
    """Check 3 on a provisioner connection to the target store."""
    row = conn.execute(
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [database]
    ).fetchone()
    if row is None:
        return None
    owner = str(row[0])
    if owner == tenant_role:
        return None
    return (
        f"target database {database} on store {store_name} already exists and is owned by "
        f"{owner}, not the tenant role {tenant_role} — refusing to adopt it"
    )
