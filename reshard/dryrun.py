"""The start API's dry run (spec reshard §5.1 "Dry run", §6 ``pg_dump_client``).

Runs every check of start steps 2-6 (the target identity checks included), the pg_dump client
choice and a read of the source catalog's size, then stops. Unlike the start, a failed check
does not stop the others: each runs when its inputs exist and is otherwise reported
``not run: <reason>``. Nothing is created: no op row, no stash entry, no op-log line, no audit
record (the view skips it) and no Celery message. The checks are the very functions the start
calls (``reshard.services``), so an entry is ``ok`` exactly when the start would pass it.

A failed entry's ``detail`` is the start's message followed by ``(start would answer <status>
[<code>])``; details pass through the scrubber (no password ever appears).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from duckgres_admin.lib import secretrefs
from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models import (
    ACTIVE_STATES,
    MetadataStore,
    ReshardOperation,
    StoreKind,
    Warehouse,
)
from reshard import backup, identity, services, steps
from reshard.scrub import Scrubber
from reshard.services import ServiceError, StartRequest

CHECK_ORDER = (
    "warehouse_ready",
    "trino_disabled",
    "source_binding",
    "target_valid",
    "target_password",
    "target_probe",
    "not_source_database",
    "not_other_warehouse",
    "target_database_owner",
    "no_active_operation",
    "source_catalog",
    "pg_dump_client",
)


class _NotRun(Exception):
    """A check whose inputs are missing."""


class _Failed(Exception):
    """A failed observation that is not a start refusal (the source checks)."""


@dataclass
class _Preflight:
    scrubber: Scrubber
    entries: list[dict[str, Any]] = field(default_factory=list)

    def run(self, check: str, fn: Callable[[], str]) -> bool:
        """Run ``fn`` (returns the observation); record ok/detail. True when ok."""
        try:
            detail, ok = fn(), True
        except _NotRun as exc:
            detail, ok = f"not run: {exc}", False
        except _Failed as exc:
            detail, ok = str(exc), False
        except ServiceError as exc:
            code = f" {exc.code}" if exc.code else ""
            detail, ok = f"{exc.message} (start would answer {exc.status}{code})", False
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
            detail, ok = f"check failed: {type(exc).__name__}: {exc}", False
        self.entries.append({"check": check, "ok": ok, "detail": self.scrubber.scrub(detail)})
        return ok


def _source_json(warehouse: Warehouse, store: MetadataStore | None) -> dict[str, Any]:
    kind = warehouse.metadata_store_kind
    out: dict[str, Any] = {"kind": kind}
    if kind == StoreKind.CNPG:
        out["store"] = str(warehouse.metadata_store_id or "")
        out["sslmode"] = store.sslmode if store is not None else None
    else:
        port = warehouse.metadata_store_port or 5432
        out["endpoint"] = (
            services._hostport(warehouse.metadata_store_host, port)
            if warehouse.metadata_store_host
            else ""
        )
        out["sslmode"] = warehouse.metadata_store_sslmode or "require"
    out.update(
        database=warehouse.metadata_store_database,
        user=warehouse.metadata_store_user,
        password_secret_ref=warehouse.metadata_store_password_ref,
    )
    return out


def _target_json(
    request: StartRequest,
    cnpg: services.CnpgTarget | None,
    external: services.ExternalTarget | None,
) -> dict[str, Any]:
    t = request.target
    if cnpg is not None:
        return {
            "kind": StoreKind.CNPG.value,
            "store": cnpg.store.name,
            "database": cnpg.database,
            "user": cnpg.user,
            "sslmode": cnpg.store.sslmode,
            "password_secret_ref": cnpg.ref,
        }
    if external is not None:
        return {
            "kind": StoreKind.EXTERNAL.value,
            "endpoint": external.label,
            "database": external.database,
            "user": external.user,
            "sslmode": external.sslmode,
            "password_secret_ref": external.ref,
        }
    # Invalid target: echo the structure of what was asked, never the password.
    out: dict[str, Any] = {"kind": t.type}
    if t.type == StoreKind.CNPG:
        out["store"] = t.cnpg_shard.strip()
    else:
        out["endpoint"] = t.endpoint
    out.update(
        database=t.database,
        user=t.user,
        sslmode=t.sslmode,
        password_secret_ref=t.password_secret_ref,
    )
    return out


def _direction(source_kind: str, target_type: str) -> str | None:
    try:
        steps.sequence(source_kind, target_type)
    except ValueError:
        return None
    return f"{source_kind}_to_{target_type}"


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


def dry_run(org_id: str, request: StartRequest) -> dict[str, Any]:
    """The §5.1 dry-run answer (200 body). 404 when the org has no warehouse."""
    warehouse = Warehouse.objects.filter(org_id=org_id).first()
    if warehouse is None:
        raise ServiceError(404, "org has no managed warehouse")
    target = request.target
    scrubber = services.api_scrubber(target.password)
    pf = _Preflight(scrubber)
    source_kind = warehouse.metadata_store_kind
    source_store: MetadataStore | None = None
    if source_kind == StoreKind.CNPG and warehouse.metadata_store_id:
        source_store = MetadataStore.objects.filter(name=warehouse.metadata_store_id).first()
    # Resolved secrets join the scrubber (best effort, as in the start; only references their
    # purpose's allowlist covers are ever resolved).
    refs: tuple[tuple[str, secretrefs.Purpose], ...] = (
        (source_store.provisioner_password_ref if source_store is not None else "", "provisioner"),
        (warehouse.metadata_store_password_ref, "tenant"),
    )
    for ref, purpose in refs:
        if ref:
            with suppress(Exception):  # reported by the checks that need it
                scrubber.add(services.resolve_allowed(ref, purpose))

    pf.run("warehouse_ready", lambda: _ready(warehouse))
    pf.run("trino_disabled", lambda: _trino(org_id))
    source_ok = pf.run("source_binding", lambda: _source(warehouse))
    if not source_ok:
        source_store = source_store if source_store and source_store.kind == "cnpg" else None

    cnpg: services.CnpgTarget | None = None
    external: services.ExternalTarget | None = None
    source_known = source_kind in (StoreKind.CNPG, StoreKind.EXTERNAL)

    def target_valid() -> str:
        nonlocal cnpg, external
        if target.type not in (StoreKind.CNPG, StoreKind.EXTERNAL):
            raise ServiceError(400, services.TARGET_TYPE_MESSAGE)
        if not source_known:
            raise _NotRun("the source binding's kind is unknown")
        if target.type == StoreKind.CNPG:
            cnpg = services.validate_cnpg_target(warehouse, source_kind, target)
            return f"cnpg store {cnpg.store.name}, database {cnpg.database}, user {cnpg.user}"
        external = services.validate_external_target(source_kind, target)
        return f"external {external.label}/{external.database} as {external.user}"

    pf.run("target_valid", target_valid)

    # target_password: external targets, and the tenant reference of external→cnpg.
    if target.type == StoreKind.EXTERNAL or (
        target.type == StoreKind.CNPG and source_kind == StoreKind.EXTERNAL
    ):

        def target_password() -> str:
            ref = target.password_secret_ref
            if not ref:
                raise _NotRun("no target.password_secret_ref given")
            if target.type == StoreKind.EXTERNAL:
                if not target.password:
                    raise _NotRun("no target.password given")
                services.check_external_password(ref, target.password, scrubber)
                return f"{ref} resolves and matches target.password"
            services.resolve_cnpg_target_ref(ref, scrubber)
            return f"{ref} resolves"

        pf.run("target_password", target_password)

    with ExitStack() as stack:
        target_conn: identity.PgConnection | None = None
        target_endpoint: Endpoint | None = None

        def target_probe() -> str:
            nonlocal target_conn, target_endpoint
            if cnpg is not None:
                target_conn = stack.enter_context(services.open_cnpg_target(cnpg.store, scrubber))
                target_endpoint = Endpoint(cnpg.store.host, cnpg.store.port, cnpg.store.sslmode)
                return f"provisioner {cnpg.store.provisioner_user} connected to {cnpg.store.name}"
            if external is not None:
                if not target.password:
                    raise _NotRun("no target.password given")
                target_conn = stack.enter_context(
                    services.open_external_target(external, target.password)
                )
                target_endpoint = Endpoint(external.host, external.port, external.sslmode)
                return f"connected to {external.label}/{external.database} as {external.user}"
            raise _NotRun("the target is not valid")

        pf.run("target_probe", target_probe)

        def not_source_database() -> str:
            if not source_ok:
                raise _NotRun("the source binding is not valid")
            if target_conn is None or target_endpoint is None:
                raise _NotRun("the target is not reachable")
            database = cnpg.database if cnpg is not None else external.database if external else ""
            warnings: list[str] = []
            services.same_database_check(
                warnings, warehouse, source_store, target_conn, target_endpoint, database
            )
            return "; ".join(["a different database than the source", *warnings])

        pf.run("not_source_database", not_source_database)

        def not_other_warehouse() -> str:
            chosen = cnpg or external
            if chosen is None:
                raise _NotRun("the target is not valid")
            services.other_warehouse_check(warehouse, chosen)
            return "no other warehouse is bound to the target database"

        pf.run("not_other_warehouse", not_other_warehouse)

        if target.type == StoreKind.CNPG:

            def database_owner() -> str:
                if cnpg is None:
                    raise _NotRun("the target is not valid")
                if target_conn is None:
                    raise _NotRun("the target is not reachable")
                services.database_owner_check(target_conn, cnpg)
                role = services.target_role_check(target_conn, warehouse, cnpg)
                return f"database {cnpg.database} is absent or owned by {cnpg.user}; {role}"

            pf.run("target_database_owner", database_owner)

    pf.run("no_active_operation", lambda: _no_active(org_id))

    catalog: dict[str, int | None] = {
        "database_size_bytes": None,
        "ducklake_tables": None,
        "rows_estimate": None,
    }
    major: list[int] = []

    def source_catalog() -> str:
        if not source_ok:
            raise _NotRun("the source binding is not valid")
        try:
            with services.source_connection(warehouse, source_store) as conn:
                major.append(services.read_server_major(conn))
                catalog.update(_read_catalog(conn))
        except Exception as exc:  # noqa: BLE001 - reported as the observation
            raise _Failed(f"source catalog not reachable: {exc}") from None
        tables = catalog["ducklake_tables"]
        if not tables:
            raise _Failed("the source database has no ducklake_* tables")
        return (
            f"PostgreSQL {major[0]}; {tables} ducklake_* tables, "
            f"{catalog['database_size_bytes']} bytes, ~{catalog['rows_estimate']} rows"
        )

    pf.run("source_catalog", source_catalog)

    def pg_dump_client() -> str:
        if not major:
            raise _NotRun("the source server version could not be read")
        client = services.pg_dump_client_check(major[0])
        return f"pg_dump {client.version} ({client.pg_dump}) for PostgreSQL {major[0]}"

    pf.run("pg_dump_client", pg_dump_client)

    direction = _direction(source_kind, target.type)
    size = catalog["database_size_bytes"]
    return {
        "dry_run": True,
        "direction": direction,
        "steps": list(steps.sequence(source_kind, target.type)) if direction else [],
        "source": _source_json(warehouse, source_store),
        "target": _target_json(request, cnpg, external),
        "catalog": catalog,
        "backup": {
            "part_size_bytes": (
                backup.part_size_for(size, int(settings.DUCKGRES_RESHARD_MAX_PARTS))
                if size is not None
                else None
            ),
            "mandatory": direction == "cnpg_to_external",
        },
        "preflight": pf.entries,
    }


def _ready(warehouse: Warehouse) -> str:
    services.warehouse_ready_check(warehouse)
    return "warehouse is ready"


def _trino(org_id: str) -> str:
    services.trino_disabled_check(org_id)
    return "Trino is not enabled for the org"


def _source(warehouse: Warehouse) -> str:
    fields, _, label = services.check_source(warehouse)
    return (
        f"{fields['source_kind']} {label}, database {fields['source_database']}, "
        f"user {fields['source_user']}"
    )


def _no_active(org_id: str) -> str:
    active = (
        ReshardOperation.objects.filter(org_id=org_id, state__in=ACTIVE_STATES)
        .values_list("id", "state")
        .first()
    )
    if active is not None:
        raise ServiceError(
            409, f"{services.ACTIVE_OP_MESSAGE} (operation {active[0]}, {active[1]})"
        )
    return "no pending or running operation for the org"


def _side_label(side: dict[str, Any]) -> str:
    kind = str(side.get("kind") or "<none>")
    if kind == StoreKind.CNPG:
        return f"cnpg {side.get('store') or '<none>'}"
    if kind == StoreKind.EXTERNAL:
        return f"external {side.get('endpoint') or '<none>'}"
    return kind


def describe(org_id: str, plan: dict[str, Any]) -> str:
    """The audit detail of a dry run: the move asked for and which checks failed (names only;
    the details may carry addresses the caller chose, never a password)."""
    entries = plan["preflight"]
    failed = [str(e["check"]) for e in entries if not e["ok"]]
    verdict = f"{len(entries) - len(failed)}/{len(entries)} checks ok"
    if failed:
        verdict += f", failed: {', '.join(failed)}"
    return (
        f"dry run org {org_id}: {_side_label(plan['source'])} → {_side_label(plan['target'])}: "
        f"{verdict}"
    )
