"""The start's preflight (spec reshard §5.1 steps 2-6, §6 ``pg_dump_client``): one ordered
table of named checks, :data:`CHECKS`, walked two ways.

- The start (:func:`validate_start`) walks it **fail-fast**: the first ``ServiceError`` is the
  answer (raised unscrubbed; the caller scrubs it), and nothing has been created.
- The dry run (:func:`report`) walks **all of it** and reports each check's outcome: ``ok`` with
  the observation, or the start's exact message followed by ``(start would answer <status>
  [<code>])``. An entry is ``ok`` exactly when the start would pass that check.

Each check reads what the earlier ones established on the shared :class:`Preflight` (the
resolved source, the valid target, the open target connection). A check whose inputs are missing
because an earlier one failed raises :class:`NotRun`: the dry run reports ``not run: <reason>``;
in the start it can only happen to ``pg_dump_client`` (a source server that cannot be read now is
not judged at submit: the runner's own checks report it with context). Checks marked
``refuses_start=False`` are reported by the dry run only: ``no_active_operation`` (the start's
insert answers it, through the one-active-op index) and ``source_catalog`` (an observation).
A check that does not apply to the request (``target_password`` of a cnpg→cnpg move,
``target_database_owner`` of an external target) has no entry.

Resolved secrets join the walk's scrubber as they are learned; every dry-run detail is scrubbed
with all of them (no password ever appears).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from django.conf import settings

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models import (
    ACTIVE_STATES,
    EXTERNAL_SSLMODES,
    STORE_NAME_PATTERN,
    MetadataStore,
    ReshardOperation,
    StoreKind,
    Warehouse,
    WarehouseState,
    WarehouseTrino,
)
from reshard.engines import clients, identity
from reshard.warehouses import store_tls
from reshard.warehouses.drain_guard import draining_refusal
from reshard.warehouses.vetting import (
    PROBE_TIMEOUT_SECONDS,
    check_host,
    constant_time_equal,
    hostport,
    parse_endpoint,
    ref_allowed,
    resolve_allowed,
    resolve_ref,
    vet_store,
)

DEFAULT_DRAIN_SECONDS = 1800
TARGET_TYPE_MESSAGE = "target.type must be cnpg or external"
ACTIVE_OP_MESSAGE = "org already has an active reshard operation"


@dataclass(frozen=True)
class TargetRequest:
    type: str
    cnpg_shard: str = ""
    endpoint: str = ""
    user: str = ""
    database: str = ""
    sslmode: str = ""
    password_secret_ref: str = ""
    password: str = field(default="", repr=False)


@dataclass(frozen=True)
class StartRequest:
    target: TargetRequest
    drain_timeout_seconds: int = DEFAULT_DRAIN_SECONDS
    cutover_timeout_seconds: int = 0
    dry_run: bool = False
    # "online", "offline" or "" (DUCKGRES_RESHARD_COPY_MODE); docs/copy.md "Online copy".
    copy_mode: str = ""
    # A restore onto the store the warehouse is on: the sibling database it restores into
    # (reshard.start.restores; never set by a request body).
    in_place_database: str = ""


@dataclass
class Plan:
    """Everything the start's preflight resolved; becomes the op row."""

    fields: dict[str, Any]
    description: str
    password: str = field(default="", repr=False)
    warnings: list[str] = field(default_factory=list)


# --- step 2: the warehouse ------------------------------------------------------------------


def warehouse_ready_check(warehouse: Warehouse) -> None:
    if warehouse.state != WarehouseState.READY:
        raise ServiceError(
            409, f"warehouse must be in ready state to reshard (currently {warehouse.state})"
        )


def trino_disabled_check(org_id: str) -> None:
    # Re-checked under the per-org lock by the block step (§4.4 A).
    if WarehouseTrino.objects.filter(warehouse_id=org_id, enabled=True).exists():
        raise ServiceError(
            409,
            "disable Trino for this warehouse before resharding (Trino catalogs do not take "
            "part in the drain yet)",
            code="trino_enabled",
        )


# --- step 3: the source from the binding ----------------------------------------------------


def _connect_checked(
    endpoint: Endpoint,
    *,
    what: str,
    dbname: str,
    user: str,
    password: str,
) -> identity.PgConnection:
    check_host(what, endpoint.host)
    return pgadmin.connect(
        endpoint,
        dbname=dbname,
        user=user,
        password=password,
        application_name="duckgres-admin-submit",
        connect_timeout=PROBE_TIMEOUT_SECONDS,
    )


@contextmanager
def _maybe_connect(
    endpoint: Endpoint,
    *,
    dbname: str,
    user: str,
    password_ref: str,
    purpose: secretrefs.Purpose,
) -> Iterator[identity.PgConnection | None]:
    """A best-effort connection for identity reads; None when it cannot be opened (or the
    reference is not allowed, or the host is denied)."""
    conn: identity.PgConnection | None = None
    with suppress(Exception):
        conn = _connect_checked(
            endpoint,
            what="host",
            dbname=dbname,
            user=user,
            password=resolve_allowed(password_ref, purpose),
        )
    try:
        yield conn
    finally:
        if conn is not None:
            conn.close()


def _source_identity(
    warehouse: Warehouse, store: MetadataStore | None
) -> identity.ServerIdentity | None:
    if store is not None:
        endpoint = Endpoint(store.host, store.port, store.sslmode)
        ctx = _maybe_connect(
            endpoint,
            dbname="postgres",
            user=store.provisioner_user,
            password_ref=store.provisioner_password_ref,
            purpose="provisioner",
        )
    else:
        endpoint = Endpoint(
            warehouse.metadata_store_host,
            warehouse.metadata_store_port or 5432,
            warehouse.metadata_store_sslmode or pgadmin.DEFAULT_SSLMODE,
        )
        ctx = _maybe_connect(
            endpoint,
            dbname=warehouse.metadata_store_database,
            user=warehouse.metadata_store_user,
            password_ref=warehouse.metadata_store_password_ref,
            purpose="tenant",
        )
    with ctx as conn:
        return identity.read_server_identity(conn, endpoint) if conn is not None else None


def _source_configured(warehouse: Warehouse, store: MetadataStore | None) -> tuple[str, int]:
    if store is not None:
        return store.host, store.port
    return warehouse.metadata_store_host, warehouse.metadata_store_port or 5432


def check_source(warehouse: Warehouse) -> tuple[dict[str, Any], MetadataStore | None, str]:
    """Step 3: the source fields of the op, the cnpg source store, and a short label."""
    kind = warehouse.metadata_store_kind
    incomplete = "the org's metadata-store identity is incomplete"
    if kind == "":
        raise ServiceError(
            400, f"{incomplete} (metadata_store_kind is empty); complete the binding first"
        )
    if kind not in (StoreKind.CNPG, StoreKind.EXTERNAL):
        raise ServiceError(409, f"unsupported source metadata-store kind {kind}")
    store: MetadataStore | None = None
    fields: dict[str, Any] = {"source_kind": kind}
    if kind == StoreKind.CNPG:
        name = str(warehouse.metadata_store_id or "")
        if not name:
            raise ServiceError(
                400,
                f"{incomplete}: the binding names no cnpg store (empty from_shard cannot "
                "roll back)",
            )
        store = MetadataStore.objects.filter(name=name).first()
        if store is None:
            raise ServiceError(400, f"{incomplete}: cnpg store {name} is not registered")
        if store.kind != StoreKind.CNPG:
            raise ServiceError(
                400,
                f"metadata-store identity drift: the binding says cnpg store {name} but {name} "
                f"is registered as {store.kind}; refusing to reshard until reconciled",
            )
        fields["from_shard"] = name
        label = name
    else:
        if not warehouse.metadata_store_host or not warehouse.metadata_store_password_ref:
            raise ServiceError(
                400,
                f"{incomplete}: the external binding is missing its endpoint or password "
                "secret reference",
            )
        port = warehouse.metadata_store_port or 5432
        fields.update(
            source_endpoint=warehouse.metadata_store_host,
            source_port=port,
            source_sslmode=warehouse.metadata_store_sslmode or pgadmin.DEFAULT_SSLMODE,
        )
        store_tls.require_endpoint_opt_in(  # the binding predates the opt-in? refused here
            "metadata_store_sslmode",
            warehouse.metadata_store_host,
            port,
            warehouse.metadata_store_sslmode,
        )
        label = hostport(warehouse.metadata_store_host, port)
    if not (
        warehouse.metadata_store_database
        and warehouse.metadata_store_user
        and warehouse.metadata_store_password_ref
    ):
        raise ServiceError(
            400,
            f"{incomplete}: the binding's database, user or password secret reference is empty",
        )
    fields.update(
        source_database=warehouse.metadata_store_database,
        source_user=warehouse.metadata_store_user,
        source_password_secret_ref=warehouse.metadata_store_password_ref,
    )
    ref_allowed(
        warehouse.metadata_store_password_ref,
        "tenant",
        "the binding's metadata_store_password_ref",
    )
    if store is not None:
        vet_store(store, f"metadata store {store.name}")
        _check_source_identity(warehouse, store)
    else:
        check_host("the binding's metadata_store_host", warehouse.metadata_store_host)
        other = identity.other_binding(
            org_id=warehouse.org_id,
            database=warehouse.metadata_store_database,
            store_name=None,
            endpoints={(warehouse.metadata_store_host, warehouse.metadata_store_port or 5432)},
        )
        if other is not None:
            raise ServiceError(
                409,
                f"source database {warehouse.metadata_store_database} on {label} is also the "
                f"catalog of warehouse {other.org_id}; give each warehouse its own catalog "
                "before resharding",
            )
    return fields, store, label


def _check_source_identity(warehouse: Warehouse, store: MetadataStore) -> None:
    """A cnpg source: its catalog is this warehouse's alone (409), and its role may be fenced
    (400, :func:`identity.tenant_role_message`; read on the store when it can be reached)."""
    shared = identity.shared_catalog_message(
        org_id=warehouse.org_id, database=warehouse.metadata_store_database, store=store
    )
    if shared:
        raise ServiceError(
            409,
            f"{shared}: a reshard would fence its sessions and drop it; give each warehouse its "
            "own catalog before resharding",
        )
    ctx = _maybe_connect(
        Endpoint(store.host, store.port, store.sslmode),
        dbname="postgres",
        user=store.provisioner_user,
        password_ref=store.provisioner_password_ref,
        purpose="provisioner",
    )
    with ctx as conn:
        message = identity.tenant_role_message(
            conn,
            org_id=warehouse.org_id,
            role=warehouse.metadata_store_user,
            database=warehouse.metadata_store_database,
            store=store,
        )
    if message:
        raise ServiceError(400, f"source {message}")


# --- steps 4-6: the target -----------------------------------------------------------------


@dataclass(frozen=True)
class CnpgTarget:
    """A structurally valid cnpg target (step 4 before the probe)."""

    store: MetadataStore
    user: str
    database: str
    ref: str


@dataclass(frozen=True)
class ExternalTarget:
    """A structurally valid external target (step 5 before the password and probe checks)."""

    host: str
    port: int
    sslmode: str
    user: str
    database: str
    ref: str

    @property
    def label(self) -> str:
        return hostport(self.host, self.port)


def validate_cnpg_target(
    warehouse: Warehouse, source_kind: str, target: TargetRequest, in_place_database: str = ""
) -> CnpgTarget:
    """Step 4 up to (not including) the reference resolution and the probe. ``in_place_database``
    (an in-place restore): the current store is the target, with that sibling database."""
    shard = target.cnpg_shard.strip()
    if not re.fullmatch(STORE_NAME_PATTERN, shard):
        raise ServiceError(
            400, f"target.cnpg_shard must match {STORE_NAME_PATTERN} (e.g. shard-002)"
        )
    if target.endpoint or target.sslmode or target.password:
        raise ServiceError(
            400,
            "target.endpoint, target.sslmode and target.password apply only to external targets",
        )
    store = MetadataStore.objects.filter(name=shard).first()
    if store is None:
        raise ServiceError(400, f"target store {shard} is not registered")
    if store.kind != StoreKind.CNPG:
        raise ServiceError(400, f"target store {shard} is not a cnpg store (kind {store.kind})")
    refusal = draining_refusal(shard)
    if refusal:
        raise ServiceError(409, f"target: {refusal}", code="store_draining")
    if source_kind == StoreKind.CNPG:
        same = shard == str(warehouse.metadata_store_id or "")
        if same and not in_place_database:
            raise ServiceError(400, f"target shard equals the org's current shard ({shard})")
        if in_place_database and not same:
            raise ServiceError(400, "an in-place restore's target is the warehouse's own store")
        if target.user or target.database or target.password_secret_ref:
            raise ServiceError(
                400,
                "the tenant identity is kept for cnpg→cnpg: target.user, target.database and "
                "target.password_secret_ref must not be set",
            )
        return CnpgTarget(
            store,
            warehouse.metadata_store_user,
            in_place_database or warehouse.metadata_store_database,
            warehouse.metadata_store_password_ref,
        )
    if not target.password_secret_ref:
        raise ServiceError(400, "target.password_secret_ref is required for external→cnpg")
    user = target.user or warehouse.database_name
    database = target.database or warehouse.database_name
    if not user or not database:
        raise ServiceError(
            400,
            "target.user and target.database default to the warehouse database_name, "
            "which is empty; set them",
        )
    return CnpgTarget(store, user, database, target.password_secret_ref)


def resolve_cnpg_target_ref(ref: str, scrubber: Scrubber) -> None:
    """external→cnpg: the tenant password reference must resolve (400 naming it)."""
    scrubber.add(resolve_ref(ref, "target.password_secret_ref"))


def open_cnpg_target(
    store: MetadataStore, scrubber: Scrubber, dbname: str = "postgres"
) -> identity.PgConnection:
    """The 8 s provisioner probe on the direct endpoint (503 ``destination_shard_unavailable``).

    Returns the open connection (the caller closes it) for the identity checks. A provisioner
    reference outside its allowlist and a denied host are 400: nothing is sent there."""
    endpoint = Endpoint(store.host, store.port, store.sslmode)
    unavailable = f"destination shard {store.name} is not accepting PostgreSQL connections"
    vet_store(store, f"target store {store.name}")
    try:
        provisioner_password = secretrefs.resolve(store.provisioner_password_ref)
    except Exception as exc:  # noqa: BLE001 - reported as unavailable, naming the reference
        raise ServiceError(
            503,
            f"{unavailable}: cannot resolve the provisioner password "
            f"{store.provisioner_password_ref}: {exc}",
            code="destination_shard_unavailable",
        ) from None
    scrubber.add(provisioner_password)
    try:
        conn = pgadmin.connect(
            endpoint,
            dbname=dbname,
            user=store.provisioner_user,
            password=provisioner_password,
            application_name="duckgres-admin-submit",
            connect_timeout=PROBE_TIMEOUT_SECONDS,
        )
    except Exception as exc:  # noqa: BLE001 - any failure is "not accepting connections"
        raise ServiceError(
            503, f"{unavailable}: {exc}", code="destination_shard_unavailable"
        ) from None
    try:
        conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001
        conn.close()
        raise ServiceError(
            503, f"{unavailable}: {exc}", code="destination_shard_unavailable"
        ) from None
    return conn


def same_database_check(
    warnings: list[str],
    warehouse: Warehouse,
    source_store: MetadataStore | None,
    target_conn: identity.PgConnection,
    target_endpoint: Endpoint,
    target_database: str,
) -> None:
    """§4.18 check 1 → 400 ``target is the same PostgreSQL database as the source``."""
    verdict = identity.compare_databases(
        _source_identity(warehouse, source_store),
        warehouse.metadata_store_database,
        identity.read_server_identity(target_conn, target_endpoint),
        target_database,
        source_configured=_source_configured(warehouse, source_store),
        target_configured=(target_endpoint.host, target_endpoint.port),
    )
    if verdict.warning:
        warnings.append(verdict.warning)
    if verdict.same:
        raise ServiceError(400, identity.SAME_DATABASE_MESSAGE)


def other_warehouse_check(warehouse: Warehouse, target: CnpgTarget | ExternalTarget) -> None:
    """§4.18 check 2 → 400 naming the other org."""
    if isinstance(target, CnpgTarget):
        message = identity.other_warehouse_message(
            org_id=warehouse.org_id,
            target_database=target.database,
            target_store=target.store.name,
            target_endpoints=identity.store_endpoints(target.store),
            target_label=target.store.name,
        )
    else:
        message = identity.other_warehouse_message(
            org_id=warehouse.org_id,
            target_database=target.database,
            target_store=None,
            target_endpoints={(target.host, target.port)},
            target_label=target.label,
        )
    if message:
        raise ServiceError(400, message)


def database_owner_check(conn: identity.PgConnection, target: CnpgTarget) -> None:
    """§4.18 check 3 (cnpg targets) → 400 refusing to adopt someone else's database."""
    message = identity.database_owner_message(
        conn, database=target.database, tenant_role=target.user, store_name=target.store.name
    )
    if message:
        raise ServiceError(400, message)


def target_role_check(conn: identity.PgConnection, warehouse: Warehouse, target: CnpgTarget) -> str:
    """The cnpg target's tenant role may be created or adopted (400 otherwise); returns what
    was observed."""
    in_place = target.database != warehouse.metadata_store_database and (
        target.store.name == warehouse.metadata_store_id
    )
    message = identity.tenant_role_message(
        conn,
        org_id=warehouse.org_id,
        role=target.user,
        database=target.database,
        store=target.store,
        also=warehouse.metadata_store_database if in_place else "",
    )
    if message:
        raise ServiceError(400, f"target {message}")
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [target.user]).fetchone()
    return f"role {target.user} " + ("exists and is adoptable" if exists else "will be created")


def validate_external_target(source_kind: str, target: TargetRequest) -> ExternalTarget:
    """Step 5 up to (not including) the password reference and the probe."""
    if source_kind == StoreKind.EXTERNAL:
        raise ServiceError(400, "external → external is not supported")
    if target.cnpg_shard:
        raise ServiceError(400, "target.cnpg_shard applies only to cnpg targets")
    if not (target.endpoint and target.user and target.database and target.password_secret_ref):
        raise ServiceError(
            400, "external target requires endpoint, user, database and password_secret_ref"
        )
    try:
        host, port = parse_endpoint(target.endpoint)
    except ValueError as exc:
        raise ServiceError(400, str(exc)) from None
    check_host("target.endpoint", host)
    sslmode = target.sslmode or pgadmin.DEFAULT_SSLMODE
    if sslmode not in EXTERNAL_SSLMODES:
        raise ServiceError(400, f"target.sslmode must be one of {', '.join(EXTERNAL_SSLMODES)}")
    store_tls.require_endpoint_opt_in("target.sslmode", host, port, sslmode)  # reshard-122
    if not target.password:
        raise ServiceError(400, "target.password is required for external targets")
    return ExternalTarget(
        host, port, sslmode, target.user, target.database, target.password_secret_ref
    )


def check_external_password(ref: str, password: str, scrubber: Scrubber) -> None:
    """The reference parses, resolves to a raw string and equals ``target.password``."""
    try:
        secretrefs.parse(ref)
    except secretrefs.SecretRefError as exc:
        raise ServiceError(400, f"target.password_secret_ref {exc}") from None
    stored = resolve_ref(ref, "target.password_secret_ref", "tenant")
    scrubber.add(stored)
    if not constant_time_equal(stored, password):
        raise ServiceError(400, f"the password stored in {ref} does not match target.password")


def open_external_target(target: ExternalTarget, password: str) -> identity.PgConnection:
    """The 8 s probe with the provided password and the parsed port (400 on failure)."""
    endpoint = Endpoint(target.host, target.port, target.sslmode)
    where = f"{target.label}/{target.database}"
    conn: identity.PgConnection | None = None
    check_host("target.endpoint", target.host)
    try:
        conn = pgadmin.connect(
            endpoint,
            dbname=target.database,
            user=target.user,
            password=password,
            application_name="duckgres-admin-submit",
            connect_timeout=PROBE_TIMEOUT_SECONDS,
        )
        with pgadmin.socket_deadline(conn, PROBE_TIMEOUT_SECONDS):  # reshard-127
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - reported without the password (scrubbed)
        if conn is not None:
            conn.close()
        raise ServiceError(
            400,
            f"cannot connect to the external target {where} as {target.user} with the provided "
            f"password: {exc}",
        ) from None
    return conn


# --- the source server: catalog facts and the pg_dump client (§6) --------------------------


@contextmanager
def source_connection(
    warehouse: Warehouse, store: MetadataStore | None
) -> Iterator[identity.PgConnection]:
    """A connection to the source tenant database: cnpg = the provisioner on the direct
    endpoint; external = the binding's tenant credentials. Raises on failure."""
    purpose: secretrefs.Purpose
    if store is not None:
        endpoint = Endpoint(store.host, store.port, store.sslmode)
        user, ref, purpose = store.provisioner_user, store.provisioner_password_ref, "provisioner"
    else:
        endpoint = Endpoint(
            warehouse.metadata_store_host,
            warehouse.metadata_store_port or 5432,
            warehouse.metadata_store_sslmode or pgadmin.DEFAULT_SSLMODE,
        )
        user, ref = warehouse.metadata_store_user, warehouse.metadata_store_password_ref
        purpose = "tenant"
    conn = _connect_checked(
        endpoint,
        what="source host",
        dbname=warehouse.metadata_store_database,
        user=user,
        password=resolve_allowed(ref, purpose),
    )
    try:
        yield conn
    finally:
        conn.close()


def read_server_major(conn: identity.PgConnection) -> int:
    row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    return clients.server_major(int(str(row[0]))) if row else 0


def pg_dump_client_check(major: int, *, require_auth: bool = False) -> clients.PgClient:
    """§6: a client for the source major, else 400 ``no pg_dump for PostgreSQL <major> …``.
    ``require_auth``: the source is exempt from channel binding (``reshard.engines.clients``)."""
    try:
        return clients.choose_client(major, require_auth=require_auth)
    except clients.NoPgClient as exc:
        raise ServiceError(400, str(exc)) from None


def _read_catalog(conn: identity.PgConnection) -> dict[str, int | None]:
    """``pg_database_size``, the ``ducklake_*`` table count and their ``reltuples`` sum."""
    out: dict[str, int | None] = {
        "database_size_bytes": None,
        "ducklake_tables": None,
        "rows_estimate": None,
    }
    try:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        out["database_size_bytes"] = int(str(row[0])) if row and row[0] is not None else None
    except Exception:  # noqa: BLE001,S110 - unreadable → null
        pass
    try:
        row = conn.execute(
            "SELECT count(*), sum(greatest(c.reltuples, 0))::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') "
            "AND c.relname LIKE 'ducklake\\_%'"
        ).fetchone()
        if row is not None:
            out["ducklake_tables"] = int(str(row[0]))
            out["rows_estimate"] = int(str(row[1])) if row[1] is not None else 0
    except Exception:  # noqa: BLE001,S110 - unreadable → null
        pass
    return out


# --- the walk -------------------------------------------------------------------------------


class NotRun(Exception):
    """A check whose inputs are missing (an earlier check failed)."""


class Observed(Exception):
    """A failed observation that is not a start refusal (the dry run's source catalog)."""


@dataclass
class Preflight:
    """One walk's inputs and what its checks established so far. A context manager: leaving it
    closes the target connection ``target_probe`` opened."""

    org_id: str
    request: StartRequest
    warehouse: Warehouse
    scrubber: Scrubber
    bound_store: MetadataStore | None = None  # the binding's store row, whatever its kind
    # The binding's cnpg store when it is registered as one (the dry run reports its sslmode
    # even when the source check fails); replaced by the source check's own result.
    source_store: MetadataStore | None = None
    source_fields: dict[str, Any] | None = None  # set once ``source_binding`` passed
    source_label: str = ""
    cnpg: CnpgTarget | None = None  # set once ``target_valid`` passed, for a cnpg target
    external: ExternalTarget | None = None  # ... for an external target
    target_conn: identity.PgConnection | None = None  # set once ``target_probe`` passed
    target_endpoint: Endpoint | None = None
    warnings: list[str] = field(default_factory=list)
    source_read: bool = False  # the source server was read (or could not be)
    major: int | None = None  # the source server's major, when it could be read
    catalog: dict[str, int | None] = field(
        default_factory=lambda: {
            "database_size_bytes": None,
            "ducklake_tables": None,
            "rows_estimate": None,
        }
    )
    _connections: ExitStack = field(default_factory=ExitStack, repr=False)

    @classmethod
    def begin(cls, org_id: str, request: StartRequest, scrubber: Scrubber) -> Preflight:
        """404 when the org has no warehouse (step 2's first refusal, for both walks)."""
        warehouse = Warehouse.objects.filter(org_id=org_id).first()
        if warehouse is None:
            raise ServiceError(404, "org has no managed warehouse")
        store: MetadataStore | None = None
        if warehouse.metadata_store_kind == StoreKind.CNPG and warehouse.metadata_store_id:
            store = MetadataStore.objects.filter(name=warehouse.metadata_store_id).first()
        cnpg_store = store if store is not None and store.kind == StoreKind.CNPG else None
        return cls(org_id, request, warehouse, scrubber, bound_store=store, source_store=cnpg_store)

    def __enter__(self) -> Preflight:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._connections.close()

    @property
    def target(self) -> TargetRequest:
        return self.request.target

    @property
    def source_kind(self) -> str:
        return self.warehouse.metadata_store_kind

    @property
    def source_ok(self) -> bool:
        return self.source_fields is not None

    def learn_source_secrets(self) -> None:
        """The source's resolved passwords join the scrubber (best effort: only references
        their purpose's allowlist covers are ever resolved; failures are the checks')."""
        refs: tuple[tuple[str, secretrefs.Purpose], ...] = (
            (self.bound_store.provisioner_password_ref if self.bound_store else "", "provisioner"),
            (self.warehouse.metadata_store_password_ref, "tenant"),
        )
        for ref, purpose in refs:
            if ref:
                with suppress(Exception):
                    self.scrubber.add(resolve_allowed(ref, purpose))

    def open_target(self, conn: identity.PgConnection, endpoint: Endpoint) -> None:
        self.target_conn = self._connections.enter_context(conn)
        self.target_endpoint = endpoint

    def read_source(self, *, catalog: bool = False) -> None:
        """Read the source server's major (and the catalog's size); raises when unreadable."""
        self.source_read = True
        with source_connection(self.warehouse, self.source_store) as conn:
            self.major = read_server_major(conn)
            if catalog:
                self.catalog.update(_read_catalog(conn))

    def source_major(self) -> int | None:
        """The source server's major: read now unless an earlier check read it (or could not);
        None when it cannot be read."""
        if not self.source_read and self.source_ok:
            with suppress(Exception):  # unreadable: not judged at submit
                self.read_source()
        return self.major

    def plan(self) -> Plan:
        """The op row's fields after a start walk that passed."""
        assert self.source_fields is not None
        if self.cnpg is not None:
            ct = self.cnpg
            plan = Plan(
                fields={
                    "target_kind": StoreKind.CNPG,
                    "to_shard": ct.store.name,
                    "target_user": ct.user,
                    "target_database": ct.database,
                    "target_password_secret_ref": ct.ref,
                },
                description=f"cnpg {ct.store.name}",
            )
        else:
            et = self.external
            assert et is not None
            plan = Plan(
                fields={
                    "target_kind": StoreKind.EXTERNAL,
                    "target_endpoint": et.host,
                    "target_port": et.port,
                    "target_sslmode": et.sslmode,
                    "target_user": et.user,
                    "target_database": et.database,
                    "target_password_secret_ref": et.ref,
                },
                description=f"external {et.label}",
                password=self.target.password,
            )
        plan.warnings = list(self.warnings)
        plan.fields.update(self.source_fields)
        plan.fields.update(
            org_id=self.org_id,
            drain_timeout_seconds=self.request.drain_timeout_seconds,
            cutover_timeout_seconds=self.request.cutover_timeout_seconds,
        )
        mode, reason = choose_copy_mode(self)
        plan.fields.update(
            copy_mode=mode,
            copy_mode_reason=reason,
            backup_after_unblock=mode == "online"
            and settings.DUCKGRES_RESHARD_ONLINE_BACKUP == "after_unblock",
        )
        plan.description = (
            f"org {self.org_id}: {self.source_fields['source_kind']} {self.source_label} → "
            f"{plan.description} ({mode} copy)"
        )
        return plan


ONLINE_MIN_MAJOR = 13  # the capture's pg_current_snapshot, pg_visible_in_snapshot and xid8


def choose_copy_mode(pf: Preflight) -> tuple[str, str]:
    """The copy's mode for this start and why (docs/copy.md "Online copy"): the request's, else
    DUCKGRES_RESHARD_COPY_MODE; online only where the stores allow it, else offline, saying
    why."""
    asked = pf.request.copy_mode or str(settings.DUCKGRES_RESHARD_COPY_MODE)
    source = "requested" if pf.request.copy_mode else "DUCKGRES_RESHARD_COPY_MODE"
    if asked != "online":
        return "offline", f"offline ({source})"
    target = pf.target.type
    if pf.source_kind != StoreKind.CNPG or target != StoreKind.CNPG:
        return "offline", (
            f"online was asked ({source}) but runs offline: the online mode moves cnpg → cnpg "
            f"only (this is {pf.source_kind} → {target}): the capture is installed through a "
            "cnpg store's provisioner, and the target must be rendered before the block"
        )
    major = pf.source_major()
    if major is not None and major < ONLINE_MIN_MAJOR:
        return "offline", (
            f"online was asked ({source}) but runs offline: the source server is PostgreSQL "
            f"{major}; the capture needs {ONLINE_MIN_MAJOR} or newer"
        )
    return "online", f"online ({source})"


# --- the checks, in the spec's order --------------------------------------------------------


def _warehouse_ready(pf: Preflight) -> str:
    warehouse_ready_check(pf.warehouse)
    return "warehouse is ready"


def _trino_disabled(pf: Preflight) -> str:
    trino_disabled_check(pf.org_id)
    return "Trino is not enabled for the org"


def _source_binding(pf: Preflight) -> str:
    pf.learn_source_secrets()
    fields, store, label = check_source(pf.warehouse)
    pf.source_fields, pf.source_store, pf.source_label = fields, store, label
    return (
        f"{fields['source_kind']} {label}, database {fields['source_database']}, "
        f"user {fields['source_user']}"
    )


def _target_valid(pf: Preflight) -> str:
    target = pf.target
    if target.type not in (StoreKind.CNPG, StoreKind.EXTERNAL):
        raise ServiceError(400, TARGET_TYPE_MESSAGE)
    if pf.source_kind not in (StoreKind.CNPG, StoreKind.EXTERNAL):
        raise NotRun("the source binding's kind is unknown")
    if target.type == StoreKind.CNPG:
        ct = pf.cnpg = validate_cnpg_target(
            pf.warehouse, pf.source_kind, target, pf.request.in_place_database
        )
        return f"cnpg store {ct.store.name}, database {ct.database}, user {ct.user}"
    et = pf.external = validate_external_target(pf.source_kind, target)
    return f"external {et.label}/{et.database} as {et.user}"


def _needs_target_password(pf: Preflight) -> bool:
    """External targets, and the tenant reference of external→cnpg."""
    return pf.target.type == StoreKind.EXTERNAL or (
        pf.target.type == StoreKind.CNPG and pf.source_kind == StoreKind.EXTERNAL
    )


def _target_password(pf: Preflight) -> str:
    target = pf.target
    ref = target.password_secret_ref
    if not ref:
        raise NotRun("no target.password_secret_ref given")
    if target.type == StoreKind.EXTERNAL:
        if not target.password:
            raise NotRun("no target.password given")
        check_external_password(ref, target.password, pf.scrubber)
        return f"{ref} resolves and matches target.password"
    resolve_cnpg_target_ref(ref, pf.scrubber)
    return f"{ref} resolves"


def _target_probe(pf: Preflight) -> str:
    if pf.cnpg is not None:
        store = pf.cnpg.store
        conn = open_cnpg_target(store, pf.scrubber)
        pf.open_target(conn, Endpoint(store.host, store.port, store.sslmode))
        return f"provisioner {store.provisioner_user} connected to {store.name}"
    if pf.external is not None:
        et = pf.external
        if not pf.target.password:
            raise NotRun("no target.password given")
        conn = open_external_target(et, pf.target.password)
        pf.open_target(conn, Endpoint(et.host, et.port, et.sslmode))
        return f"connected to {et.label}/{et.database} as {et.user}"
    raise NotRun("the target is not valid")


def _not_source_database(pf: Preflight) -> str:
    if not pf.source_ok:
        raise NotRun("the source binding is not valid")
    if pf.target_conn is None or pf.target_endpoint is None:
        raise NotRun("the target is not reachable")
    chosen = pf.cnpg or pf.external
    database = chosen.database if chosen is not None else ""
    warnings: list[str] = []
    same_database_check(
        warnings, pf.warehouse, pf.source_store, pf.target_conn, pf.target_endpoint, database
    )
    pf.warnings.extend(warnings)
    return "; ".join(["a different database than the source", *warnings])


def _not_other_warehouse(pf: Preflight) -> str:
    chosen = pf.cnpg or pf.external
    if chosen is None:
        raise NotRun("the target is not valid")
    other_warehouse_check(pf.warehouse, chosen)
    return "no other warehouse is bound to the target database"


def _cnpg_target(pf: Preflight) -> bool:
    return pf.target.type == StoreKind.CNPG


def _target_database_owner(pf: Preflight) -> str:
    ct = pf.cnpg
    if ct is None:
        raise NotRun("the target is not valid")
    if pf.target_conn is None:
        raise NotRun("the target is not reachable")
    database_owner_check(pf.target_conn, ct)
    role = target_role_check(pf.target_conn, pf.warehouse, ct)
    return f"database {ct.database} is absent or owned by {ct.user}; {role}"


def _target_database_empty(pf: Preflight) -> str:
    """Check 4 (``identity.database_contents``): an existing target database is adopted only
    when it holds nothing; read inside it (cnpg: as the provisioner; external: the probe's
    connection, which is already inside the target database)."""
    if pf.target_conn is None:
        raise NotRun("the target is not reachable")
    if pf.cnpg is not None:
        ct = pf.cnpg
        row = pf.target_conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [ct.database]
        ).fetchone()
        if row is None:
            return f"database {ct.database} is absent: the operation creates it"
        where = f"store {ct.store.name}"
        try:
            with open_cnpg_target(ct.store, pf.scrubber, dbname=ct.database) as conn:
                contents = identity.database_contents(conn)
        except ServiceError as exc:
            raise ServiceError(
                400,
                f"target database {ct.database} on {where} already exists and cannot be "
                f"inspected by the provisioner ({exc.message}): refusing to adopt it",
            ) from None
        database = ct.database
    elif pf.external is not None:
        where, database = pf.external.label, pf.external.database
        contents = identity.database_contents(pf.target_conn)
    else:
        raise NotRun("the target is not valid")
    message = identity.contents_message(contents, database=database, where=where)
    if message:
        raise ServiceError(400, message, code="target_database_not_empty")
    return f"database {database} exists and holds nothing: it is adopted empty"


def _no_active_operation(pf: Preflight) -> str:
    active = (
        ReshardOperation.objects.filter(org_id=pf.org_id, state__in=ACTIVE_STATES)
        .values_list("id", "state")
        .first()
    )
    if active is not None:
        raise ServiceError(409, f"{ACTIVE_OP_MESSAGE} (operation {active[0]}, {active[1]})")
    return "no pending or running operation for the org"


def _source_catalog(pf: Preflight) -> str:
    if not pf.source_ok:
        raise NotRun("the source binding is not valid")
    try:
        pf.read_source(catalog=True)
    except Exception as exc:  # noqa: BLE001 - reported as the observation
        raise Observed(f"source catalog not reachable: {exc}") from None
    tables = pf.catalog["ducklake_tables"]
    if not tables:
        raise Observed("the source database has no ducklake_* tables")
    return (
        f"PostgreSQL {pf.major}; {tables} ducklake_* tables, "
        f"{pf.catalog['database_size_bytes']} bytes, ~{pf.catalog['rows_estimate']} rows"
    )


def _pg_dump_client(pf: Preflight) -> str:
    major = pf.source_major()
    if major is None:
        raise NotRun("the source server version could not be read")
    source = _source_configured(pf.warehouse, pf.source_store)
    client = pg_dump_client_check(major, require_auth=clients.needs_require_auth(*source))
    return f"pg_dump {client.version} ({client.pg_dump}) for PostgreSQL {major}"


def _always(pf: Preflight) -> bool:
    return True


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Preflight], str]  # the observation, or raises
    applies: Callable[[Preflight], bool] = _always  # False: no entry, not run
    refuses_start: bool = True  # False: reported by the dry run only


CHECKS: tuple[Check, ...] = (
    Check("warehouse_ready", _warehouse_ready),
    Check("trino_disabled", _trino_disabled),
    Check("source_binding", _source_binding),
    Check("target_valid", _target_valid),
    Check("target_password", _target_password, applies=_needs_target_password),
    Check("target_probe", _target_probe),
    Check("not_source_database", _not_source_database),
    Check("not_other_warehouse", _not_other_warehouse),
    Check("target_database_owner", _target_database_owner, applies=_cnpg_target),
    Check("target_database_empty", _target_database_empty),
    Check("no_active_operation", _no_active_operation, refuses_start=False),
    Check("source_catalog", _source_catalog, refuses_start=False),
    Check("pg_dump_client", _pg_dump_client),
)


class KindStart(Protocol):
    """What an operation kind adds to a start (``reshard.kinds``: ``Kind.start``): its own
    rows, walked before the shared table (they may refine ``pf.request``, as an in-place
    restore names its sibling database), and the row fields it adds to the passed plan."""

    @property
    def checks(self) -> tuple[Check, ...]: ...

    def shape(self, plan: Plan) -> None: ...


@dataclass(frozen=True)
class SharedChecksOnly:
    """The reshard's start: the shared table, and the plan as it is."""

    checks: tuple[Check, ...] = ()

    def shape(self, plan: Plan) -> None:
        return None


SHARED_ONLY = SharedChecksOnly()


def validate_start(
    org_id: str, request: StartRequest, scrubber: Scrubber, start: KindStart = SHARED_ONLY
) -> Plan:
    """The start's walk: every check that refuses a start (the kind's, then the shared table),
    fail-fast; raises the first ``ServiceError`` (unscrubbed)."""
    with Preflight.begin(org_id, request, scrubber) as pf:
        for check in start.checks + CHECKS:
            if check.refuses_start and check.applies(pf):
                with suppress(NotRun):  # only an unreadable source server: not judged
                    check.run(pf)
        plan = pf.plan()
    start.shape(plan)
    return plan


def _outcome(check: Check, pf: Preflight) -> tuple[bool, str]:
    try:
        return True, check.run(pf)
    except NotRun as exc:
        return False, f"not run: {exc}"
    except Observed as exc:
        return False, str(exc)
    except ServiceError as exc:
        code = f" {exc.code}" if exc.code else ""
        return False, f"{exc.message} (start would answer {exc.status}{code})"
    except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
        return False, f"check failed: {type(exc).__name__}: {exc}"


def report(pf: Preflight, start: KindStart = SHARED_ONLY) -> list[dict[str, Any]]:
    """The dry run's walk: every check that applies (the kind's, then the shared table), each
    reported ``{"check", "ok", "detail"}`` in table order, the details scrubbed."""
    outcomes = [(c.name, *_outcome(c, pf)) for c in start.checks + CHECKS if c.applies(pf)]
    return [
        {"check": name, "ok": ok, "detail": pf.scrubber.scrub(detail)}
        for name, ok, detail in outcomes
    ]
