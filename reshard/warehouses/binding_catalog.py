"""The catalog check of a warehouse binding change (safeguard reshard-72, docs/api.md
"Repointing a binding").

A ``PATCH /warehouses/<org>`` that changes where the binding points (kind, cnpg store, external
host or port, database: :data:`LOCATION_FIELDS`) is applied only when the new binding holds a
DuckLake catalog: the database exists on that server and its ``public`` schema has
``ducklake_*`` base tables (what the copy calls a catalog, ``reshard/engines/copy/``).
Otherwise the answer is 409 ``binding_without_catalog``; a server that cannot be reached (or logged
into) is 503 ``catalog_check_unavailable``: a binding is never repointed blind. The caller who knows
the catalog will be created or restored there sends ``"force_empty_binding": true`` (never stored);
the override is audited with the old and the new binding.

The check connects through ``lib.pgadmin`` (TLS rules, SCRAM only, pinned session, the 8 s
connect and statement timeouts of the submit probes), after the host denylist and the secret
reference allowlists: a cnpg store is read with its provisioner (the reshard start's probe), an
external binding with its own tenant credentials. It runs outside the per-org lock (a slow store
never stalls lease grants); the locked update then applies only the binding that was checked.
Nothing secret reaches a message: resolved passwords join the scrubber.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models import MetadataStore, StoreKind, Warehouse, WarehouseState
from reshard.warehouses import rules, vetting

FORCE_FLAG = "force_empty_binding"
WITHOUT_CATALOG = "binding_without_catalog"
UNAVAILABLE = "catalog_check_unavailable"
CHANGED = "binding_changed"
APPLICATION_NAME = "duckgres-admin-binding-check"

# Where the binding points; a change of any of them is a repoint (user, reference and sslmode
# changes are credentials, not a new location).
LOCATION_FIELDS = (
    "metadata_store_kind",
    "metadata_store",
    "metadata_store_host",
    "metadata_store_port",
    "metadata_store_database",
)

_FORCE_HINT = (
    "to repoint anyway (you know the catalog will be created or restored there) send "
    f'"{FORCE_FLAG}": true'
)

# The ``ducklake_*`` base tables of ``public`` (from pg_class: what the catalog holds, whatever
# the connecting role's privileges on them).
_CATALOG_TABLES = """
SELECT count(*) FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname LIKE 'ducklake\\_%'
"""


@dataclass(frozen=True)
class CatalogFound:
    """A binding that was checked: its values (the key the locked update compares) and the
    number of ``ducklake_*`` tables found."""

    key: tuple[Any, ...]
    tables: int


def moves(changed: dict[str, Any], merged: dict[str, Any]) -> bool:
    """Whether a write repoints the binding to a (non-empty) location."""
    return bool(set(LOCATION_FIELDS) & changed.keys()) and merged.get("metadata_store_kind") in (
        StoreKind.CNPG,
        StoreKind.EXTERNAL,
    )


def binding_key(values: dict[str, Any]) -> tuple[Any, ...]:
    """Everything the check depends on (location and the credentials it may log in with)."""
    return tuple(values.get(f) for f in rules.BINDING_FIELDS)


def describe(values: dict[str, Any]) -> str:
    """A binding for the audit record (endpoints, names and users are not secrets)."""
    kind = values.get("metadata_store_kind", "")
    database = values.get("metadata_store_database", "")
    user = values.get("metadata_store_user", "")
    if kind == StoreKind.CNPG:
        where = f"cnpg store {values.get('metadata_store') or ''}"
    elif kind == StoreKind.EXTERNAL:
        host = str(values.get("metadata_store_host") or "")
        where = f"external {vetting.hostport(host, int(values.get('metadata_store_port') or 5432))}"
    else:
        return "none"
    return f"{where} database {database} user {user}"


def override_note(old: dict[str, Any], new: dict[str, Any]) -> str:
    return (
        f"catalog check overridden ({FORCE_FLAG}): binding {describe(old)} → {describe(new)}, "
        "not checked for a DuckLake catalog"
    )


def _no_catalog(why: str) -> ServiceError:
    return ServiceError(
        409,
        f"metadata_store_database: {why}; bind the database that holds this warehouse's "
        f"catalog, or, {_FORCE_HINT}",
        code=WITHOUT_CATALOG,
    )


def _unavailable(field: str, label: str, database: str, cause: str) -> ServiceError:
    return ServiceError(
        503,
        f"{field}: cannot check {label} for a DuckLake catalog in database {database}: {cause}; "
        "a binding is never repointed unchecked: retry when the store accepts connections, or, "
        f"{_FORCE_HINT}",
        code=UNAVAILABLE,
    )


def _connect(endpoint: Endpoint, *, dbname: str, user: str, password: str) -> Any:
    return pgadmin.connect(
        endpoint,
        dbname=dbname,
        user=user,
        password=password,
        application_name=APPLICATION_NAME,
        connect_timeout=vetting.PROBE_TIMEOUT_SECONDS,
        statement_timeout=float(vetting.PROBE_TIMEOUT_SECONDS),
    )


def _count_tables(conn: Any) -> int:
    row = conn.execute(_CATALOG_TABLES).fetchone()
    return int(str(row[0])) if row else 0


def check(values: dict[str, Any]) -> CatalogFound:
    """Raise unless the (validated, complete) binding ``values`` holds a DuckLake catalog."""
    database = str(values.get("metadata_store_database") or "")
    scrubber = process_scrubber()
    if values.get("metadata_store_kind") == StoreKind.CNPG:
        store = MetadataStore.objects.get(name=values["metadata_store"])
        field, label = "metadata_store_name", f"store {store.name}"
        endpoint = Endpoint(store.host, store.port, store.sslmode)
        user, ref = store.provisioner_user, store.provisioner_password_ref
        vetting.ref_allowed(ref, "provisioner", f"{field}: {label}: provisioner_password_ref")
        vetting.check_host(f"{field}: {label}: host", store.host)
    else:
        host, port = str(values["metadata_store_host"]), int(values["metadata_store_port"] or 5432)
        field, label = "metadata_store_host", f"external server {vetting.hostport(host, port)}"
        endpoint = Endpoint(host, port, str(values.get("metadata_store_sslmode") or ""))
        user, ref = str(values["metadata_store_user"]), str(values["metadata_store_password_ref"])
        vetting.ref_allowed(ref, "tenant", "metadata_store_password_ref")
        vetting.check_host(field, host)
    try:
        password = secretrefs.resolve(ref)
    except Exception as exc:  # noqa: BLE001 - reported naming the reference, never a value
        raise _unavailable(
            field, label, database, f"cannot resolve the password {ref}: {exc}"
        ).scrubbed(scrubber) from None
    scrubber.add(password)
    missing = f"database {database} does not exist on {label}, so it holds no DuckLake catalog"
    try:
        if values.get("metadata_store_kind") == StoreKind.CNPG:
            # The provisioner reads pg_database first: a missing database is named as such.
            with _connect(endpoint, dbname="postgres", user=user, password=password) as conn:
                row = conn.execute(
                    "SELECT 1 FROM pg_catalog.pg_database WHERE datname = %s", [database]
                ).fetchone()
            if row is None:
                raise _no_catalog(missing)
        try:
            conn = _connect(endpoint, dbname=database, user=user, password=password)
        except psycopg.OperationalError as exc:
            if f'database "{database}" does not exist' in str(exc):
                raise _no_catalog(missing) from None
            raise
        with conn:
            tables = _count_tables(conn)
    except ServiceError as exc:
        raise exc.scrubbed(scrubber) from None
    except Exception as exc:  # noqa: BLE001 - any failure is "cannot check", with its cause
        as_user = f"as {user}: " if user else ""
        raise _unavailable(field, label, database, f"{as_user}{exc}").scrubbed(scrubber) from None
    if tables == 0:
        raise _no_catalog(
            f"{label} has no DuckLake catalog in database {database} (no ducklake_* tables in "
            "its public schema)"
        )
    return CatalogFound(binding_key(values), tables)


def precheck(*, org_id: str, changes: dict[str, Any], force: bool) -> CatalogFound | None:
    """Before the per-org lock: when ``changes`` repoint the binding (and the write would pass
    the resharding guard and the binding rules), check the new binding unless ``force``.
    None when there is nothing to check; the locked update re-validates everything."""
    warehouse = Warehouse.objects.filter(org_id=org_id).first()
    if warehouse is None:
        return None  # the locked update answers 404
    current = rules._warehouse_values(warehouse)
    changed = {k: v for k, v in changes.items() if current.get(k) != v}
    merged = {**current, **changes}
    if not moves(changed, merged):
        return None
    guarded = bool(rules.GUARDED_WAREHOUSE_FIELDS & changed.keys())
    if guarded and warehouse.state == WarehouseState.RESHARDING:
        raise rules.WAREHOUSE_RESHARDING
    rules.validate_warehouse(merged, check_state=False, org_id=org_id, written=frozenset(changed))
    if force:
        return None
    return check(merged)


def changed_while_checked() -> ServiceError:
    return ServiceError(
        409,
        "metadata_store_database: the warehouse binding changed while its catalog was checked; "
        "read the warehouse again and retry",
        code=CHANGED,
    )
