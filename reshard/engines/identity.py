"""Target identity checks (spec reshard §4.18), shared by the start API and the runner.

1. Not the source database: compare the servers' ``system_identifier`` (else address, port and
   data directory, else the configured ``host:port``) together with the database names.
2. Not another warehouse's catalog: no other org's live warehouse bound to the same server
   (same cnpg store name, or a shared ``host:port`` endpoint) and the same database.
3. cnpg target database ownership: an existing target database must be owned by the tenant
   role; we never adopt someone else's database.
4. An existing target database is adopted only **empty** (:func:`database_contents`): no
   table, view, sequence, function or schema of anyone's in it. An operation then owns
   everything it finds in its target later (it created all of it), so a rollback that drops
   what its copy or restore wrote can never drop a stranger's table (docs/restore.md).

Each check returns an error message (``None`` when the check passes); callers decide whether
that is a 400 (submit) or a step failure (runner). Connections come from ``lib.pgadmin``.

Also here, because submit and runner share them:

- **Tenant role identity** (:func:`tenant_role_message`): the role a reshard acts on (the source
  role it fences and un-fences, the target role it creates, adopts, or sets NOLOGIN) is never
  the store's provisioner, ``postgres`` or a ``pg_*`` role, never privileged (superuser,
  createrole, createdb, replication, bypassrls) nor a member of another role, never used by
  another live warehouse's binding or another org's active reshard on the same server, and owns
  no database but the tenant's own. Checked at submit and by the runner right before every
  role statement.
- **One warehouse per catalog** (:func:`other_binding`): no two live warehouses are bound to
  the same database on the same server (same cnpg store, or a shared ``host:port``).
- **Store hosts** (:func:`host_refusal`): a DNS name or one literal address (``lib.hosts``, no
  host list, socket path or zone id), a name that resolves, and no address in
  ``DUCKGRES_STORE_HOST_DENYLIST`` (link-local, cloud metadata, "any"), literal or resolved.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

from duckgres_admin.lib import hosts, pgadmin
from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models import (
    ActiveTarget,
    BindingCoordinates,
    MetadataStore,
    ReshardOperation,
    StoreKind,
    WarehouseState,
)

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
    warehouse: BindingCoordinates, stores: dict[str, MetadataStore]
) -> tuple[str | None, set[tuple[str, int]]]:
    if warehouse.metadata_store_kind == StoreKind.CNPG and warehouse.metadata_store_id:
        store = stores.get(str(warehouse.metadata_store_id))
        return str(warehouse.metadata_store_id), store_endpoints(store) if store else set()
    if warehouse.metadata_store_kind == StoreKind.EXTERNAL and warehouse.metadata_store_host:
        port = warehouse.metadata_store_port or 5432
        return None, {(normalize_host(warehouse.metadata_store_host), port)}
    return None, set()


LIVE_EXCLUDED = (WarehouseState.DELETING, WarehouseState.DELETED)


def _bindings_on_server(
    *, org_id: str, store_name: str | None, endpoints: Iterable[tuple[str, int]], **match: str
) -> Iterable[BindingCoordinates]:
    """Live warehouses of other orgs bound to the same server (the cnpg store ``store_name``,
    or a binding sharing one of ``endpoints``) whose binding matches ``match``. Read through
    the coordinates view, which a runner's own login may read too (models/coordinates.py)."""
    wanted = {(normalize_host(h), p) for h, p in endpoints}
    stores = {s.name: s for s in MetadataStore.objects.all()}
    candidates = (
        BindingCoordinates.objects.exclude(org_id=org_id)
        .exclude(state__in=LIVE_EXCLUDED)
        .exclude(metadata_store_kind="")
        .filter(**{f"metadata_store_{k}": v for k, v in match.items()})
        .order_by("org_id")
    )
    for warehouse in candidates:
        name, bound = _binding_server(warehouse, stores)
        if (store_name and name == store_name) or (bound & wanted):
            yield warehouse


def other_binding(
    *,
    org_id: str,
    database: str,
    store_name: str | None,
    endpoints: Iterable[tuple[str, int]],
) -> BindingCoordinates | None:
    """The live warehouse of another org bound to ``database`` on this server, if any."""
    return next(
        iter(
            _bindings_on_server(
                org_id=org_id, store_name=store_name, endpoints=endpoints, database=database
            )
        ),
        None,
    )


def store_server(store: MetadataStore) -> tuple[str, set[tuple[str, int]]]:
    """(name, endpoints) of a cnpg store, the arguments of the server checks."""
    return store.name, store_endpoints(store)


def other_warehouse_message(
    *,
    org_id: str,
    target_database: str,
    target_store: str | None,
    target_endpoints: Iterable[tuple[str, int]],
    target_label: str,
) -> str | None:
    """Check 2: the message naming the other org, or None."""
    other = other_binding(
        org_id=org_id,
        database=target_database,
        store_name=target_store,
        endpoints=target_endpoints,
    )
    if other is None:
        return None
    return (
        f"target database {target_database} on {target_label} is the catalog of another "
        f"warehouse ({other.org_id})"
    )


def shared_catalog_message(*, org_id: str, database: str, store: MetadataStore) -> str | None:
    """A cnpg source catalog that another live warehouse is bound to as well (then fencing its
    role or dropping it would hit that warehouse): the message naming it, or None."""
    name, endpoints = store_server(store)
    other = other_binding(org_id=org_id, database=database, store_name=name, endpoints=endpoints)
    if other is None:
        return None
    return (
        f"source database {database} on store {store.name} is also the catalog of warehouse "
        f"{other.org_id}"
    )


# --- tenant role identity ----------------------------------------------------------------------

PRIVILEGED_ATTRIBUTES = (
    ("rolsuper", "superuser"),
    ("rolcreaterole", "createrole"),
    ("rolcreatedb", "createdb"),
    ("rolreplication", "replication"),
    ("rolbypassrls", "bypassrls"),
)


def _role_name_message(role: str, store: MetadataStore) -> str | None:
    if not role:
        return f"the tenant role is empty (store {store.name})"
    if role == store.provisioner_user:
        return (
            f"tenant role {role} is the provisioner of store {store.name}: a reshard never "
            "logs in as, alters or fences the provisioner; bind the warehouse to its own role"
        )
    if role == "postgres" or role.startswith("pg_"):
        return (
            f"tenant role {role} on store {store.name} is a reserved PostgreSQL role: a "
            "reshard never alters it; bind the warehouse to a role of its own"
        )
    return None


def _role_users_message(*, org_id: str, role: str, store: MetadataStore) -> str | None:
    name, endpoints = store_server(store)
    for other in _bindings_on_server(
        org_id=org_id, store_name=name, endpoints=endpoints, user=role
    ):
        return (
            f"tenant role {role} on store {store.name} is also the role of warehouse "
            f"{other.org_id}: a reshard never alters a role another warehouse uses"
        )
    same_server = [
        s.name for s in MetadataStore.objects.all() if store_endpoints(s) & endpoints
    ] or [name]
    op = (
        ActiveTarget.objects.filter(
            target_kind=StoreKind.CNPG,
            to_shard__in=same_server,
            target_user=role,
        )
        .exclude(org_id=org_id)
        .values_list("id", "org_id")
        .first()
    )
    if op is not None:
        return (
            f"tenant role {role} on store {store.name} is the target role of reshard "
            f"operation {op[0]} of warehouse {op[1]}: a role is never shared by two warehouses"
        )
    return None


def _role_catalog_message(
    conn: PgConnection, *, role: str, database: str, store: MetadataStore, also: str = ""
) -> str | None:
    """What the store says about an existing role (None: absent or usable)."""
    attributes = ", ".join(column for column, _ in PRIVILEGED_ATTRIBUTES)
    row = conn.execute(
        f"SELECT {attributes} FROM pg_roles WHERE rolname = %s",  # a constant column list
        [role],
    ).fetchone()
    if row is None:
        return None
    held = [label for (_, label), value in zip(PRIVILEGED_ATTRIBUTES, row, strict=True) if value]
    if held:
        return (
            f"tenant role {role} on store {store.name} has {', '.join(held)}: a tenant role is "
            "never privileged, and a reshard never alters a privileged role"
        )
    groups = [
        str(r[0])
        for r in conn.execute(
            "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
            "JOIN pg_roles g ON g.oid = m.roleid WHERE r.rolname = %s ORDER BY 1",
            [role],
        )
    ]
    if groups:
        return (
            f"tenant role {role} on store {store.name} is a member of {', '.join(groups)}: a "
            "tenant role inherits nothing (REVOKE the membership, or use another role)"
        )
    owned = [
        str(r[0])
        for r in conn.execute(
            "SELECT d.datname FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba "
            "WHERE r.rolname = %s AND d.datname <> ALL(%s) ORDER BY 1",
            [role, [name for name in (database, also) if name]],
        )
    ]
    if owned:
        return (
            f"tenant role {role} on store {store.name} owns other databases ({', '.join(owned)}), "
            f"not only the tenant's {database}: it is not this warehouse's role alone"
        )
    return None


def tenant_role_message(
    conn: PgConnection | None,
    *,
    org_id: str,
    role: str,
    database: str,
    store: MetadataStore,
    also: str = "",
) -> str | None:
    """Whether a reshard of ``org_id`` may act on ``role`` on the cnpg ``store`` (create it,
    adopt it, fence it, set it NOLOGIN or LOGIN): the refusal, or None.

    The rule (docs/api.md "Tenant role identity"): not the provisioner, ``postgres`` or a
    ``pg_*`` role; no other live warehouse bound to the same server names it and no other org's
    active reshard targets it there; and, when it exists (read on ``conn``, a provisioner
    connection to the store), no superuser/createrole/createdb/replication/bypassrls, no
    membership in any role, and it owns no database other than ``database`` (and ``also``: an
    in-place restore's other catalog on the same server). Without ``conn`` only the first two
    parts are checked (submit when the store cannot be reached)."""
    message = _role_name_message(role, store) or _role_users_message(
        org_id=org_id, role=role, store=store
    )
    if message or conn is None:
        return message
    return _role_catalog_message(conn, role=role, database=database, store=store, also=also)


# --- store hosts --------------------------------------------------------------------------------


def op_role_refusal(
    conn: PgConnection, op: ReshardOperation, side: str, store: MetadataStore
) -> str | None:
    """:func:`tenant_role_message` for the ``source`` or ``target`` tenant role of ``op``, the
    refusal prefixed with the side ("target role … is …"), or None: the runner's re-check right
    before each statement on that role."""
    role, database, other = (
        (op.source_user, op.source_database, op.target_database)
        if side == "source"
        else (op.target_user, op.target_database, op.source_database)
    )
    refusal = tenant_role_message(
        conn,
        org_id=op.org_id,
        role=role,
        database=database,
        store=store,
        also=other if op.in_place else "",
    )
    return f"{side} {refusal}" if refusal else None


def host_refusal(field_name: str, host: str, *, resolve: bool = True) -> str | None:
    """Why ``host`` may not be a metadata store's address (None: it may).

    First the syntax rule (``lib.hosts``: a DNS name or one literal address; no host list,
    socket path or zone id; safeguard reshard-125). A literal address is then checked as is; a
    name is resolved (``getaddrinfo``) and every address it resolves to is checked. A name that
    does not resolve is refused (``resolve=False`` skips resolution: syntax and literal checks
    only). An empty ``host`` is "not given" (None): callers require it where it is required."""
    if not host:
        return None
    syntax = hosts.syntax_refusal(field_name, host)
    if syntax is not None:
        return syntax
    text = host.rstrip(".")  # an absolute name is judged as the name
    fix = (
        "link-local, cloud metadata and wildcard addresses (DUCKGRES_STORE_HOST_DENYLIST) are "
        "never metadata stores; use the server's own address"
    )
    network = pgadmin.denied_network(text)
    if network is not None:
        return f"{field_name}: {text} is in the denied network {network}: {fix}"
    try:
        ipaddress.ip_address(text)
        return None  # a literal address that is not denied
    except ValueError:
        pass
    if not resolve:
        return None
    try:
        infos = socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return (
            f"{field_name}: {text} did not resolve ({exc}): give a name this control plane "
            "resolves (its DNS, its cluster's service names) or the server's address"
        )
    for info in infos:
        address = str(info[4][0])
        network = pgadmin.denied_network(address)
        if network is not None:
            return (
                f"{field_name}: {text} resolves to {address}, in the denied network {network}: "
                f"{fix}"
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


# --- check 4: an existing target database is adopted only empty ------------------------------
CONTENTS_SHOWN = 5  # names quoted in a refusal; the rest are counted
_CONTENTS_SQL = """
WITH user_ns AS (
    SELECT oid, nspname FROM pg_catalog.pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema')
      AND nspname NOT LIKE 'pg\\_toast%' AND nspname NOT LIKE 'pg\\_temp\\_%'
)
SELECT kind, name FROM (
    SELECT CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'view' WHEN 'S' THEN 'sequence'
                ELSE 'table' END AS kind,
           pg_catalog.format('%I.%I', n.nspname, c.relname) AS name
    FROM pg_catalog.pg_class c JOIN user_ns n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
    UNION ALL
    SELECT 'function', pg_catalog.format('%I.%I', n.nspname, p.proname)
    FROM pg_catalog.pg_proc p JOIN user_ns n ON n.oid = p.pronamespace
    UNION ALL
    SELECT 'schema', pg_catalog.format('%I', n.nspname) FROM user_ns n WHERE n.nspname <> 'public'
) found
ORDER BY kind, name COLLATE "C"
LIMIT 1000
"""


@dataclass(frozen=True)
class Contents:
    """What a database holds besides the system catalogs (at most 1,000 objects read)."""

    objects: tuple[tuple[str, str], ...]  # (kind, qualified name), sorted

    @property
    def empty(self) -> bool:
        return not self.objects

    def summary(self) -> str:
        """``2 tables (public.a, public.b), 1 function (public.f)``; names sanitised (they
        come from a server the tenant may control)."""
        parts: list[str] = []
        for kind in dict.fromkeys(k for k, _ in self.objects):
            names = [_printable(n) for k, n in self.objects if k == kind]
            shown = ", ".join(names[:CONTENTS_SHOWN])
            more = (
                f", and {len(names) - CONTENTS_SHOWN} more" if len(names) > CONTENTS_SHOWN else ""
            )
            plural = kind if len(names) == 1 else f"{kind}s"
            parts.append(f"{len(names)} {plural} ({shown}{more})")
        return ", ".join(parts) if parts else "nothing"


def _printable(name: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in name)[:130]


def database_contents(conn: PgConnection) -> Contents:
    """Check 4's observation, on a connection to the database itself."""
    rows = conn.execute(_CONTENTS_SQL).fetchall()
    return Contents(tuple((str(kind), str(name)) for kind, name in rows))


def contents_message(contents: Contents, *, database: str, where: str) -> str | None:
    """Check 4's refusal (None: empty, adoptable)."""
    if contents.empty:
        return None
    return (
        f"target database {database} on {where} already exists and holds "
        f"{contents.summary()}: refusing to adopt it — nothing of it belongs to this operation; "
        "drop those objects (or the database) or choose another target database"
    )
