"""Reshard services called by the API: start (spec reshard §5.1), cancel (§5.2), and the
warehouse and metadata-store writes that must respect a running reshard (§5.5).

Start validates in the spec's order, first failure wins, and every rejection before the insert
creates nothing (no op row, no stash entry, no Celery message). After the insert, failures mark
the op ``failed`` by a CAS on ``pending``. The runner launch is enqueued on commit with the op
id as its only argument; the password never leaves this process except through the stash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models import (
    EXTERNAL_SSLMODES,
    STORE_NAME_PATTERN,
    TERMINAL_STATES,
    MetadataStore,
    OpState,
    ReshardOperation,
    StoreKind,
    Warehouse,
    WarehouseState,
    WarehouseTrino,
)
from duckgres_admin.orglock import lock_org
from reshard import identity, oplog, pgclients, stash
from reshard.scrub import Scrubber, process_scrubber

PROBE_TIMEOUT_SECONDS = 8
MAX_TIMEOUT_SECONDS = 86400
DEFAULT_DRAIN_SECONDS = 1800
LAUNCH_TASK = "reshard.launch_runner"
LAUNCH_QUEUE = "duckgres.default"


class ServiceError(Exception):
    """A refusal with its HTTP status, message and optional machine-readable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}

    def scrubbed(self, scrubber: Scrubber) -> ServiceError:
        return ServiceError(
            self.status, scrubber.scrub(self.message), code=self.code, headers=self.headers
        )


def api_scrubber(*extra: str) -> Scrubber:
    """Shared secrets, every password stashed in this process, plus ``extra`` values."""
    return process_scrubber(*stash.known_values(), *extra)


# --- start (§5.1) ---------------------------------------------------------------------------


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


@dataclass
class _Plan:
    """Everything resolved by validation; becomes the op row."""

    fields: dict[str, Any]
    description: str
    password: str = field(default="", repr=False)
    warnings: list[str] = field(default_factory=list)


def parse_endpoint(raw: str) -> tuple[str, int]:
    """``host[:port]`` (IPv6 as ``[addr]:port``); port defaults to 5432."""
    text = raw.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?", text) or re.fullmatch(
        r"([A-Za-z0-9._-]+)(?::(\d{1,5}))?", text
    )
    if not m:
        raise ValueError("target.endpoint must be host[:port]")
    port = int(m.group(2)) if m.group(2) else 5432
    if not 1 <= port <= 65535:
        raise ValueError("target.endpoint port must be 1..65535")
    return m.group(1), port


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _allowed(ref: str, purpose: secretrefs.Purpose, what: str) -> None:
    """400 naming ``what`` unless ``ref`` is inside the ``purpose`` allowlist (and not one of
    the control plane's own secrets): a reference is resolved for a caller only then."""
    try:
        secretrefs.check_allowed(ref, purpose)
    except secretrefs.SecretRefError as exc:
        raise ServiceError(400, f"{what}: {exc}") from None


def _resolve(ref: str, what: str, purpose: secretrefs.Purpose = "tenant") -> str:
    _allowed(ref, purpose, what)
    try:
        return secretrefs.resolve(ref)
    except Exception as exc:  # noqa: BLE001 - resolution errors name the reference and cause
        raise ServiceError(400, f"cannot resolve {what} {ref}: {exc}") from None


def resolve_allowed(ref: str, purpose: secretrefs.Purpose) -> str:
    """Resolve ``ref`` for the API only when its purpose's allowlist covers it (raises)."""
    secretrefs.check_allowed(ref, purpose)
    return secretrefs.resolve(ref)


def check_host(field_name: str, host: str) -> None:
    """400 when ``host`` is (or resolves to) a denied address (``DUCKGRES_STORE_HOST_DENYLIST``);
    run right before every connection the API opens, and where a host is written."""
    refusal = identity.host_refusal(field_name, host)
    if refusal:
        raise ServiceError(400, refusal)


def _vet_store(store: MetadataStore, what: str) -> None:
    """400 before anything is sent to ``store``: its provisioner reference outside the
    allowlist, or its host or pooler host denied (``what`` names it in the message)."""
    _allowed(store.provisioner_password_ref, "provisioner", f"{what}: provisioner_password_ref")
    check_host(f"{what}: host", store.host)
    if store.pooler_host:
        check_host(f"{what}: pooler_host", store.pooler_host)


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


def _check_source(warehouse: Warehouse) -> tuple[dict[str, Any], MetadataStore | None, str]:
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
        label = _hostport(warehouse.metadata_store_host, port)
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
    _allowed(
        warehouse.metadata_store_password_ref,
        "tenant",
        "the binding's metadata_store_password_ref",
    )
    if store is not None:
        _vet_store(store, f"metadata store {store.name}")
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


# --- target checks (§5.1 steps 4-6), split so the dry run can run each one on its own ------


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
        return _hostport(self.host, self.port)


def validate_cnpg_target(
    warehouse: Warehouse, source_kind: str, target: TargetRequest
) -> CnpgTarget:
    """Step 4 up to (not including) the reference resolution and the probe."""
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
    if source_kind == StoreKind.CNPG:
        if shard == str(warehouse.metadata_store_id or ""):
            raise ServiceError(400, f"target shard equals the org's current shard ({shard})")
        if target.user or target.database or target.password_secret_ref:
            raise ServiceError(
                400,
                "the tenant identity is kept for cnpg→cnpg: target.user, target.database and "
                "target.password_secret_ref must not be set",
            )
        return CnpgTarget(
            store,
            warehouse.metadata_store_user,
            warehouse.metadata_store_database,
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
    scrubber.add(_resolve(ref, "target.password_secret_ref"))


def open_cnpg_target(store: MetadataStore, scrubber: Scrubber) -> identity.PgConnection:
    """The 8 s provisioner probe on the direct endpoint (503 ``destination_shard_unavailable``).

    Returns the open connection (the caller closes it) for the identity checks. A provisioner
    reference outside its allowlist and a denied host are 400: nothing is sent there."""
    endpoint = Endpoint(store.host, store.port, store.sslmode)
    unavailable = f"destination shard {store.name} is not accepting PostgreSQL connections"
    _vet_store(store, f"target store {store.name}")
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
            dbname="postgres",
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
    message = identity.tenant_role_message(
        conn,
        org_id=warehouse.org_id,
        role=target.user,
        database=target.database,
        store=target.store,
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
    stored = _resolve(ref, "target.password_secret_ref", "tenant")
    scrubber.add(stored)
    if not _constant_time_equal(stored, password):
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


def _check_cnpg_target(
    warehouse: Warehouse,
    source_store: MetadataStore | None,
    target: TargetRequest,
    scrubber: Scrubber,
) -> _Plan:
    source_kind = StoreKind.CNPG if source_store is not None else StoreKind.EXTERNAL
    ct = validate_cnpg_target(warehouse, source_kind, target)
    if source_kind == StoreKind.EXTERNAL:
        resolve_cnpg_target_ref(ct.ref, scrubber)
    plan = _Plan(
        fields={
            "target_kind": StoreKind.CNPG,
            "to_shard": ct.store.name,
            "target_user": ct.user,
            "target_database": ct.database,
            "target_password_secret_ref": ct.ref,
        },
        description=f"cnpg {ct.store.name}",
    )
    with open_cnpg_target(ct.store, scrubber) as conn:
        endpoint = Endpoint(ct.store.host, ct.store.port, ct.store.sslmode)
        same_database_check(plan.warnings, warehouse, source_store, conn, endpoint, ct.database)
        other_warehouse_check(warehouse, ct)
        database_owner_check(conn, ct)
        target_role_check(conn, warehouse, ct)
    return plan


def _check_external_target(
    warehouse: Warehouse,
    source_store: MetadataStore | None,
    target: TargetRequest,
    scrubber: Scrubber,
) -> _Plan:
    source_kind = StoreKind.CNPG if source_store is not None else StoreKind.EXTERNAL
    et = validate_external_target(source_kind, target)
    check_external_password(et.ref, target.password, scrubber)
    plan = _Plan(
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
        password=target.password,
    )
    with open_external_target(et, target.password) as conn:
        endpoint = Endpoint(et.host, et.port, et.sslmode)
        same_database_check(plan.warnings, warehouse, source_store, conn, endpoint, et.database)
    other_warehouse_check(warehouse, et)
    return plan


def _constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


# --- the source server: catalog facts and the pg_dump client (§5.1 dry run, §6) ---------------


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
    return pgclients.server_major(int(str(row[0]))) if row else 0


def pg_dump_client_check(major: int) -> pgclients.PgClient:
    """§6: a client for the source major, else 400 ``no pg_dump for PostgreSQL <major> …``."""
    try:
        return pgclients.choose_client(major)
    except pgclients.NoPgClient as exc:
        raise ServiceError(400, str(exc)) from None


def _check_pg_dump_client(warehouse: Warehouse, store: MetadataStore | None) -> None:
    """At submit: refuse when the source server's major has no client. A source that cannot be
    read now is not refused here (the runner's own checks report it with context)."""
    try:
        with source_connection(warehouse, store) as conn:
            major = read_server_major(conn)
    except Exception:  # noqa: BLE001 - unreadable: not judged at submit
        return
    pg_dump_client_check(major)


def validate_start(org_id: str, request: StartRequest, scrubber: Scrubber) -> _Plan:
    """Steps 2-6 of §5.1 plus the pg_dump client (§6); raises ``ServiceError`` (unscrubbed)."""
    warehouse = Warehouse.objects.filter(org_id=org_id).first()
    if warehouse is None:
        raise ServiceError(404, "org has no managed warehouse")
    warehouse_ready_check(warehouse)
    trino_disabled_check(org_id)
    source_fields, source_store, source_label = _check_source(warehouse)
    with suppress(Exception):
        if source_store is not None:
            scrubber.add(resolve_allowed(source_store.provisioner_password_ref, "provisioner"))
        scrubber.add(resolve_allowed(warehouse.metadata_store_password_ref, "tenant"))
    target = request.target
    if target.type == StoreKind.CNPG:
        plan = _check_cnpg_target(warehouse, source_store, target, scrubber)
    elif target.type == StoreKind.EXTERNAL:
        plan = _check_external_target(warehouse, source_store, target, scrubber)
    else:
        raise ServiceError(400, TARGET_TYPE_MESSAGE)
    _check_pg_dump_client(warehouse, source_store)
    plan.fields.update(source_fields)
    plan.fields.update(
        org_id=org_id,
        drain_timeout_seconds=request.drain_timeout_seconds,
        cutover_timeout_seconds=request.cutover_timeout_seconds,
    )
    plan.description = (
        f"org {org_id}: {source_fields['source_kind']} {source_label} → {plan.description}"
    )
    return plan


TARGET_TYPE_MESSAGE = "target.type must be cnpg or external"


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


def check_source(warehouse: Warehouse) -> tuple[dict[str, Any], MetadataStore | None, str]:
    """Step 3 (public for the dry run)."""
    return _check_source(warehouse)


ACTIVE_OP_MESSAGE = "org already has an active reshard operation"


@dataclass(frozen=True)
class StartOutcome:
    op: ReshardOperation
    description: str


def _fail_pending(op_id: int, message: str, scrubber: Scrubber) -> None:
    text = scrubber.scrub(message)
    ReshardOperation.objects.filter(pk=op_id, state=OpState.PENDING).update(
        state=OpState.FAILED, error=text, finished_at=Now()
    )
    oplog.append(op_id, text, level="error", scrubber=scrubber)


def _send_launch(op_id: int) -> None:
    from celery import current_app

    current_app.send_task(LAUNCH_TASK, args=[op_id], queue=LAUNCH_QUEUE)


def reshard_op_start(*, org_id: str, request: StartRequest, actor: str) -> StartOutcome:
    """§5.1 steps 2-12 (the body was parsed by the caller). Raises ``ServiceError``."""
    stash.prune()
    scrubber = api_scrubber(request.target.password)
    try:
        plan = validate_start(org_id, request, scrubber)
    except ServiceError as exc:
        raise exc.scrubbed(scrubber) from None
    launcher = str(settings.DUCKGRES_RESHARD_LAUNCHER)

    # 7. Insert pending.
    try:
        with transaction.atomic():
            op = ReshardOperation.objects.create(
                state=OpState.PENDING, launcher=launcher, created_by=actor, **plan.fields
            )
    except IntegrityError as exc:
        if "reshard_one_active_op_per_org" in str(exc):
            raise ServiceError(409, ACTIVE_OP_MESSAGE) from None
        raise ServiceError(500, scrubber.scrub(f"could not create the operation: {exc}")) from None
    for warning in plan.warnings:
        oplog.append(op.id, f"target identity check: {warning}", level="warn", scrubber=scrubber)

    # 8. External target: password URL, then the stash.
    if plan.fields["target_kind"] == StoreKind.EXTERNAL:
        try:
            url = stash.password_url(op.id, launcher)
        except stash.NoAddressError as exc:
            _fail_pending(op.id, str(exc), scrubber)
            raise ServiceError(500, str(exc)) from None
        if (
            ReshardOperation.objects.filter(pk=op.id, state=OpState.PENDING).update(
                password_url=url
            )
            != 1
        ):
            message = "could not record the password URL: the operation is no longer pending"
            _fail_pending(op.id, message, scrubber)
            raise ServiceError(500, message)
        stash.put(op.id, plan.password)

    # 9. Pod launcher: pin the control-plane image.
    if launcher == "pod":
        try:
            from reshard.launchers.pod import resolve_control_plane_image

            image = resolve_control_plane_image()
            if not image:
                raise RuntimeError("the control-plane image is empty")
            if (
                ReshardOperation.objects.filter(pk=op.id, state=OpState.PENDING).update(
                    runner_image=image
                )
                != 1
            ):
                raise RuntimeError("the operation is no longer pending")
        except Exception as exc:  # noqa: BLE001 - any failure fails the op
            stash.delete(op.id)
            message = f"could not record the runner image: {exc}"
            _fail_pending(op.id, message, scrubber)
            raise ServiceError(500, scrubber.scrub(message)) from None

    # 10. Enqueue on commit; the op id is the only argument.
    enqueue_errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            _send_launch(op.id)
        except Exception as exc:  # noqa: BLE001 - mapped to 502 below
            enqueue_errors.append(exc)

    with transaction.atomic():
        transaction.on_commit(enqueue)
    if enqueue_errors:
        stash.delete(op.id)
        message = f"could not enqueue the runner launch: {enqueue_errors[0]}"
        _fail_pending(op.id, message, scrubber)
        raise ServiceError(502, scrubber.scrub(message))

    # 11. Log.
    oplog.append(
        op.id,
        f"operation created by {actor}: {plan.description}; runner launch queued for "
        f"{op.runner_name}",
        scrubber=scrubber,
    )
    op.refresh_from_db()
    return StartOutcome(op=op, description=scrubber.scrub(plan.description))


# --- cancel (§5.2) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelOutcome:
    status: int
    body: dict[str, Any]


def reshard_op_cancel(*, op_id: int, actor: str) -> CancelOutcome:
    op = ReshardOperation.objects.filter(pk=op_id).first()
    if op is None:
        raise ServiceError(404, "no such reshard operation")
    if op.state in TERMINAL_STATES:
        raise ServiceError(409, f"operation already {op.state}")
    if op.state == OpState.PENDING and ReshardOperation.objects.filter(
        pk=op_id, state=OpState.PENDING
    ).update(state=OpState.CANCELLED, error="cancelled before start", finished_at=Now()):
        stash.delete(op_id)
        oplog.append(op_id, f"cancelled by {actor} before the runner claimed it", level="warn")
        return CancelOutcome(200, {"state": OpState.CANCELLED.value})
    if not ReshardOperation.objects.filter(pk=op_id, state__in=["pending", "running"]).update(
        cancel_requested=True
    ):
        state = ReshardOperation.objects.filter(pk=op_id).values_list("state", flat=True).first()
        raise ServiceError(409, f"operation already {state}")
    oplog.append(op_id, f"cancel requested by {actor}")
    return CancelOutcome(202, {"cancel_requested": True})


# --- password handoff (§5.3) -----------------------------------------------------------------

PASSWORD_NOT_AVAILABLE = "password not available"


RUNNER_NOT_PROVEN = "runner identity not proven for this operation"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


def pull_credential_digest(credential: str) -> str:
    """The verifier of a local runner's one-time pull credential (SHA-256, hex)."""
    return hashlib.sha256(credential.encode("utf-8")).hexdigest()


def _pod_binding_refusal(op: ReshardOperation, token: str) -> str:
    """'' when ``token`` is a projected ServiceAccount token of the runner ServiceAccount with
    the pull audience, bound to this op's runner pod and the pod uid its claim recorded."""
    from duckgres_admin.lib import k8s
    from reshard.launchers.base import runner_name

    namespace = str(settings.POD_NAMESPACE)
    if not namespace:
        return "POD_NAMESPACE is not set on the API: cannot check the runner's ServiceAccount"
    audience = str(settings.DUCKGRES_PASSWORD_PULL_AUDIENCE)
    account = str(settings.DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT) or "default"
    try:
        review = k8s.review_token(token, audience)
    except k8s.KubeError as exc:
        raise _PullUnverifiable(f"TokenReview failed: {exc}") from None
    if not review.authenticated:
        return f"the API server refused the token ({review.error[:300] or 'not authenticated'})"
    if audience not in review.audiences:
        return f"the token is not for audience {audience}"
    expected_user = f"system:serviceaccount:{namespace}:{account}"
    if review.username != expected_user:
        return f"the token belongs to {review.username[:200]!r}, not {expected_user!r}"
    pod_name = review.extra_value(POD_NAME_EXTRA)
    if pod_name != runner_name(op.id):
        return f"the token is bound to pod {pod_name[:200] or '(none)'!r}, not {runner_name(op.id)}"
    pod_uid = review.extra_value(POD_UID_EXTRA)
    if not op.runner_pod_uid or pod_uid != op.runner_pod_uid:
        return (
            f"the token is bound to pod uid {pod_uid[:80] or '(none)'!r}, not the uid the "
            f"current runner claimed with ({op.runner_pod_uid or 'none recorded'!r})"
        )
    return ""


def _local_binding_refusal(op: ReshardOperation, credential: str) -> str:
    """'' when ``credential`` matches the one-time credential the local launcher handed the
    current runner (its digest is on the row until the first successful pull consumes it)."""
    if not op.password_pull_digest:
        return "no one-time pull credential is outstanding (consumed, or never issued)"
    if not hmac.compare_digest(
        pull_credential_digest(credential).encode(), op.password_pull_digest.encode()
    ):
        return "the one-time pull credential does not match"
    return ""


class _PullUnverifiable(Exception):
    """The runner's credential could not be checked (the TokenReview call failed)."""


def reshard_password_fetch(
    *, op_id: int, epoch_header: str, runner_id_header: str, credential: str
) -> str:
    """The stashed password for the op's current runner, once; else ``ServiceError``.

    404: no such op, not running, not the current epoch and runner id, or no entry (already
    pulled, API restarted). 403: the credential does not prove the op's current runner (pod:
    TokenReview; local: the one-time credential). 503: the TokenReview call failed. Only a 200
    removes the entry (and a local runner's credential digest). Every access to an existing op
    is logged on the op (outcome and caller, never the value or the credential).
    """
    stash.prune()
    op = (
        ReshardOperation.objects.filter(pk=op_id)
        .only(
            "id",
            "state",
            "launcher",
            "runner_epoch",
            "runner_id",
            "runner_pod_uid",
            "password_pull_digest",
        )
        .first()
    )
    if op is None:
        raise ServiceError(404, PASSWORD_NOT_AVAILABLE)
    caller = f"runner {runner_id_header[:200]!r} epoch {epoch_header[:40]!r}"

    def refuse(status: int, message: str, reason: str) -> ServiceError:
        oplog.append(
            op_id,
            f"password request by {caller} refused ({status} {message}): {reason}",
            level="warn",
            scrubber=api_scrubber(*([credential] if credential else [])),
        )
        return ServiceError(status, message)

    if op.state != OpState.RUNNING:
        if op.state in TERMINAL_STATES:
            stash.delete(op_id)
        raise refuse(404, PASSWORD_NOT_AVAILABLE, f"operation is {op.state}")
    if epoch_header.strip() != str(op.runner_epoch) or runner_id_header != op.runner_id:
        raise refuse(404, PASSWORD_NOT_AVAILABLE, "not the current runner epoch and id")
    if not credential:
        reason = "no pull credential presented (Authorization: Bearer)"
    elif op.launcher == "pod":
        try:
            reason = _pod_binding_refusal(op, credential)
        except _PullUnverifiable as exc:
            raise refuse(503, "runner identity could not be verified", str(exc)) from None
    elif op.launcher == "local":
        reason = _local_binding_refusal(op, credential)
    else:
        reason = f"launcher {op.launcher!r} has no pull binding"
    if reason:
        raise refuse(403, RUNNER_NOT_PROVEN, reason)
    password = stash.take(op_id)
    if password is None:
        raise refuse(
            404,
            PASSWORD_NOT_AVAILABLE,
            "this control-plane process holds no password for the operation (already pulled "
            "once, or this API process restarted)",
        )
    if op.launcher == "local":
        ReshardOperation.objects.filter(
            pk=op_id, password_pull_digest=op.password_pull_digest
        ).update(password_pull_digest="")
    oplog.append(
        op_id,
        f"runner fetched the ephemeral external target password ({caller}); the entry is "
        "removed: it cannot be pulled again",
        scrubber=api_scrubber(password, *([credential] if credential else [])),
    )
    return password


def reshard_password_refused(*, op_id: int, caller: str, status: int) -> None:
    """Log a refused password access (403) on an existing op."""
    if ReshardOperation.objects.filter(pk=op_id).exists():
        oplog.append(
            op_id,
            f"password request by {caller} refused ({status} runner secret required)",
            level="warn",
            scrubber=api_scrubber(),
        )


# --- warehouses and metadata stores (§5.5) -----------------------------------------------------

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
        return None, {(host, port)}, _hostport(host, port)
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


# --- selectors -------------------------------------------------------------------------------

LIVE_WAREHOUSE_EXCLUDED = (WarehouseState.DELETING, WarehouseState.DELETED)


def reshard_targets() -> dict[str, list[dict[str, Any]]]:
    """§5.2 ``GET /reshards/targets``: every cnpg store (empty ones too) and external bindings."""
    live = Warehouse.objects.exclude(state__in=LIVE_WAREHOUSE_EXCLUDED)
    counts: dict[str, int] = {}
    for name in live.filter(metadata_store_kind=StoreKind.CNPG).values_list(
        "metadata_store_id", flat=True
    ):
        if name:
            counts[str(name)] = counts.get(str(name), 0) + 1
    shards = [
        {"name": s.name, "tenants": counts.get(s.name, 0)}
        for s in MetadataStore.objects.filter(kind=StoreKind.CNPG).order_by("name")
    ]
    seen: set[tuple[Any, ...]] = set()
    externals: list[dict[str, Any]] = []

    def add(entry: dict[str, Any]) -> None:
        key = tuple(entry.values())
        if key not in seen:
            seen.add(key)
            externals.append(entry)

    for w in live.filter(metadata_store_kind=StoreKind.EXTERNAL).order_by("org_id"):
        add(
            {
                "host": w.metadata_store_host,
                "port": w.metadata_store_port,
                "sslmode": w.metadata_store_sslmode,
                "user": w.metadata_store_user,
                "database": w.metadata_store_database,
                "password_secret_ref": w.metadata_store_password_ref,
            }
        )
    for s in MetadataStore.objects.filter(kind=StoreKind.EXTERNAL).order_by("name"):
        add(
            {
                "host": s.host,
                "port": s.port,
                "sslmode": s.sslmode,
                "user": s.provisioner_user,
                "database": "",
                "password_secret_ref": s.provisioner_password_ref,
            }
        )
    externals.sort(key=lambda e: (str(e["host"]), int(e["port"] or 0)))
    return {"shards": shards, "external_stores": externals}
