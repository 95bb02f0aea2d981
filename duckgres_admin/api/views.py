"""API views (spec reshard §5). Thin: parse, call one service, shape the answer."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import transaction
from django.http import HttpRequest
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from duckgres_admin.api import trino_views
from duckgres_admin.api import validation as v
from duckgres_admin.api.auth import AuthRefusal, Scope, describe_caller
from duckgres_admin.api.base import ApiView, BoundedJSONParser, HotPathView
from duckgres_admin.api.serializers import log_entry_json, op_json, store_json, warehouse_json
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    LIBPQ_SSLMODES,
    STORE_NAME_PATTERN,
    LeasePurpose,
    MetadataStore,
    ReshardLogEntry,
    ReshardOperation,
    StoreKind,
    Warehouse,
    WarehouseState,
)
from duckgres_admin.models.stores import TlsPolicy
from reshard import (
    backups,
    dryrun,
    leases,
    operations,
    restore_test_requests,
    restores,
    selectors,
    warehouses,
)
from reshard.backup import KEY_PREFIX
from reshard.binding_catalog import FORCE_FLAG
from reshard.kinds import RESHARD
from reshard.start_checks import StartRequest, TargetRequest
from trino_pools import config

OBJ = OpenApiTypes.OBJECT
ERRORS = {400: OBJ, 401: OBJ, 403: OBJ, 404: OBJ, 409: OBJ}
# Requests with a body: DRF's JSON parser answers 415 to any other Content-Type, and a body
# over DUCKGRES_API_MAX_BODY_BYTES is 413.
BODY_ERRORS = {**ERRORS, 413: OBJ, 415: OBJ}
# Reads: 400 for a NUL in a query parameter or a bad page cursor.
READ_ERRORS = {400: OBJ, 401: OBJ, 403: OBJ}
# Lists (docs/api.md "Pagination"): ?limit= (1..500, default 100) and a keyset cursor.
PAGE_DEFAULT = 100
PAGE_MAX = 500
LIMIT_PARAM = OpenApiParameter("limit", int, required=False)


def _limit(request: Request) -> int:
    return v.query_int(request.query_params.get("limit"), PAGE_DEFAULT, minimum=1, maximum=PAGE_MAX)


def _page(rows: list[Any], limit: int) -> tuple[list[Any], bool]:
    """The first ``limit`` of ``limit + 1`` rows read, and whether there are more."""
    return rows[:limit], len(rows) > limit


START_FIELDS = ("target", "drain_timeout_seconds", "cutover_timeout_seconds", "dry_run")
RESTORE_FIELDS = ("backup_key", *START_FIELDS)


def _parse_start(data: Any) -> StartRequest:
    body = v.as_object(data)
    v.reject_unknown(body, START_FIELDS)
    if "target" not in body:
        raise v.body_error("target", "required")
    target = v.as_object(body["target"], "target")
    keys = (
        "type",
        "cnpg_shard",
        "endpoint",
        "user",
        "database",
        "sslmode",
        "password_secret_ref",
        "password",
    )
    v.reject_unknown(target, keys, "target")
    parsed = {k: v.string(target, k, "target", max_length=1024) for k in keys}
    if not parsed["type"]:
        raise v.body_error("target.type", "required")
    drain = v.integer(body, "drain_timeout_seconds", default=1800, maximum=86400)
    cutover = v.integer(body, "cutover_timeout_seconds", default=0, maximum=86400)
    dry_run = v.boolean(body, "dry_run", default=False)
    return StartRequest(
        target=TargetRequest(**parsed),
        drain_timeout_seconds=drain if drain is not None and drain > 0 else 1800,
        cutover_timeout_seconds=max(cutover or 0, 0),
        dry_run=bool(dry_run),
    )


class _StartView(ApiView):
    """A start that takes ``"dry_run": true``: a dry run is audited as ``dry_run_action``
    (refused ones too, even before the view ran: a NUL or a size refusal of a body that asked
    for one)."""

    accepts_dry_run = True
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]
    dry_run = False
    dry_run_action: ClassVar[str] = ""

    def audit_action_for(self, request: HttpRequest) -> str:
        body = self.parsed_body
        asked = isinstance(body, dict) and body.get("dry_run") is True
        return self.dry_run_action if self.dry_run or asked else self.audit_action

    def note_dry_run(self, data: Any) -> None:
        if isinstance(data, dict) and data.get("dry_run") is True:
            self.dry_run = True  # audited as a dry run, even when refused


class ReshardStartView(_StartView):
    audit_action = "reshard.create"
    dry_run_action = "reshard.dry_run"

    @extend_schema(
        operation_id="reshard_start",
        request=OBJ,
        responses={200: OBJ, 202: OBJ, 500: OBJ, 502: OBJ, 503: OBJ, **BODY_ERRORS},
        description=(
            "Start a reshard (spec §5.1). Internal secret or staff admin. With "
            '`"dry_run": true` the answer is 200 with the plan and every preflight result, '
            "and nothing is created."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        from reshard import stash

        data = request.data
        self.note_dry_run(data)
        try:
            start = _parse_start(data)
        except ServiceError:
            stash.prune()
            raise
        if start.dry_run:
            # Creates nothing (spec §5.1) but is audited: it resolves secrets and contacts the
            # stores on the caller's behalf. 404 for a missing warehouse.
            self.dry_run = True
            plan = dryrun.dry_run(org, start)
            self.audit_detail = dryrun.describe(org, plan)
            return Response(plan, status=200)
        assert self.identity is not None
        outcome = operations.op_start(
            RESHARD.start(), org_id=org, request=start, actor=self.identity.actor
        )
        self.audit_detail = f"reshard {outcome.description}"
        return Response(op_json(outcome.op), status=202)


class RestoreStartView(_StartView):
    """``POST /warehouses/<org>/restores`` (docs/restore.md): a restore operation, or its dry
    run. The body is the reshard start's (``target`` a cnpg store) plus ``backup_key``."""

    audit_action = "restore.create"
    dry_run_action = "restore.dry_run"

    @extend_schema(
        operation_id="restore_start",
        request=OBJ,
        responses={200: OBJ, 202: OBJ, 500: OBJ, 502: OBJ, 503: OBJ, **BODY_ERRORS},
        description=(
            "Restore one of the org's own backups onto another cnpg store (docs/restore.md). "
            'Internal secret or staff admin. With `"dry_run": true` the answer is 200 with the '
            "plan and every preflight result, and nothing is created."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        data = request.data
        self.note_dry_run(data)
        body = dict(v.as_object(data))
        # Unknown fields first, as a reshard start answers them: a misspelt ``backup_kee`` is
        # named, not reported as a missing ``backup_key``.
        v.reject_unknown(body, RESTORE_FIELDS)
        key = v.string(body, "backup_key", required=True, max_length=1024) or ""
        body.pop("backup_key", None)
        start = _parse_start(body)
        if start.dry_run:
            plan = restores.restore_dry_run(org, key, start)
            self.audit_detail = f"restore of {key}: {dryrun.describe(org, plan)}"
            return Response(plan, status=200)
        assert self.identity is not None
        outcome = restores.restore_start(
            org_id=org, key=key, request=start, actor=self.identity.actor
        )
        self.audit_detail = outcome.description
        return Response(op_json(outcome.op), status=202)


class ReshardListView(ApiView):
    @extend_schema(
        operation_id="reshard_list",
        parameters=[
            OpenApiParameter("org", str, required=False),
            OpenApiParameter("state", str, required=False),
            LIMIT_PARAM,
            OpenApiParameter("before", int, required=False),
        ],
        responses={200: OBJ, **READ_ERRORS},
        description=(
            "Newest first, one page: `{operations, next_before}`; pass `before=next_before` for "
            "the next page (`next_before` is null on the last one)."
        ),
    )
    def get(self, request: Request) -> Response:
        limit = _limit(request)
        qs = ReshardOperation.objects.order_by("-id")
        if org := request.query_params.get("org"):
            qs = qs.filter(org_id=org)
        if state := request.query_params.get("state"):
            qs = qs.filter(state=state)
        before = v.query_cursor_id(request.query_params.get("before"), "before")
        if before is not None:
            qs = qs.filter(id__lt=before)
        ops, more = _page(list(qs[: limit + 1]), limit)
        return Response(
            {
                "operations": [op_json(op) for op in ops],
                "next_before": ops[-1].id if more else None,
            }
        )


class ReshardTargetsView(ApiView):
    @extend_schema(operation_id="reshard_targets", responses={200: OBJ, **READ_ERRORS})
    def get(self, request: Request) -> Response:
        return Response(selectors.reshard_targets())


def _op_or_404(op_id: int) -> ReshardOperation:
    op = ReshardOperation.objects.filter(pk=op_id).first()
    if op is None:
        raise ServiceError(404, "no such reshard operation")
    return op


class ReshardDetailView(ApiView):
    @extend_schema(operation_id="reshard_get", responses={200: OBJ, 404: OBJ, **READ_ERRORS})
    def get(self, request: Request, op_id: int) -> Response:
        return Response(op_json(_op_or_404(op_id)))


class ReshardLogView(ApiView):
    @extend_schema(
        operation_id="reshard_log",
        parameters=[
            OpenApiParameter("after", int, required=False),
            OpenApiParameter("limit", int, required=False),
        ],
        responses={200: OBJ, 404: OBJ, **READ_ERRORS},
    )
    def get(self, request: Request, op_id: int) -> Response:
        _op_or_404(op_id)
        after = v.query_int(request.query_params.get("after"), 0, minimum=0, maximum=2**63 - 1)
        limit = v.query_int(request.query_params.get("limit"), 500, minimum=1, maximum=2000)
        entries = list(
            ReshardLogEntry.objects.filter(operation_id=op_id, id__gt=after).order_by("id")[:limit]
        )
        return Response(
            {
                "entries": [log_entry_json(e) for e in entries],
                "next_after": entries[-1].id if entries else after,
            }
        )


class ReshardCancelView(ApiView):
    audit_action = "reshard.cancel"

    @extend_schema(
        operation_id="reshard_cancel", request=None, responses={200: OBJ, 202: OBJ, **BODY_ERRORS}
    )
    def post(self, request: Request, op_id: int) -> Response:
        assert self.identity is not None
        op = ReshardOperation.objects.filter(pk=op_id).only("org_id").first()
        self.audit_org = op.org_id if op else ""
        outcome = operations.reshard_op_cancel(op_id=op_id, actor=self.identity.actor)
        self.audit_detail = (
            "cancelled before start" if outcome.status == 200 else "cancel requested"
        )
        return Response(outcome.body, status=outcome.status)


class ReshardPasswordView(ApiView):
    """The one-shot password pull (safeguard reshard-79; docs/api.md). The runner secret is
    the route's identity (defence in depth, not sufficient): the bearer credential must prove
    the op's current runner, and the first 200 removes the entry."""

    scope = Scope.RUNNER

    @extend_schema(
        operation_id="reshard_password",
        parameters=[
            OpenApiParameter("X-Duckgres-Op-Epoch", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("X-Duckgres-Runner-Id", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("Authorization", str, OpenApiParameter.HEADER, required=True),
        ],
        responses={200: OBJ, 404: OBJ, 503: OBJ, **READ_ERRORS},
        description=(
            "Runner secret, the op's current epoch and runner id, and `Authorization: Bearer` "
            "with the runner's own credential (pod: its projected ServiceAccount token; local: "
            "its one-time credential). Served only on DUCKGRES_PASSWORD_PULL_PORT when set; "
            "answers 200 once (spec §5.3, safeguard reshard-79)."
        ),
    )
    def get(self, request: Request, op_id: int) -> Response:
        password = operations.reshard_password_fetch(
            op_id=op_id,
            epoch_header=request.headers.get("X-Duckgres-Op-Epoch", ""),
            runner_id_header=request.headers.get("X-Duckgres-Runner-Id", ""),
            credential=bearer_credential(request.headers.get("Authorization", "")),
        )
        return Response({"password": password}, headers={"Cache-Control": "no-store"})

    def handle_exception(self, exc: Exception) -> Response:
        # A refusal of a caller that proved who it is is logged on the op; an unauthenticated
        # one (a foreign header with a wrong value) writes nothing. The service logs its own
        # refusals (credential, epoch, stash) itself.
        if isinstance(exc, AuthRefusal) and exc.status == 403 and not self.unauthenticated:
            operations.reshard_password_refused(
                op_id=int(self.kwargs["op_id"]),
                caller=describe_caller(self.request._request),
                status=403,
            )
        response = super().handle_exception(exc)
        response["Cache-Control"] = "no-store"
        return response


def bearer_credential(header: str) -> str:
    """The credential of ``Authorization: Bearer <credential>`` ('' for anything else)."""
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


# --- connection leases (§5.4) ---------------------------------------------------------------


def _lease_response(outcome: leases.LeaseOutcome) -> Response:
    return Response(outcome.body, status=outcome.status, headers=outcome.headers or None)


class LeaseCreateView(HotPathView):
    scope = Scope.DATAPLANE
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="lease_request",
        request=OBJ,
        responses={201: OBJ, 202: OBJ, 410: OBJ, 429: OBJ, 503: OBJ, **BODY_ERRORS},
    )
    def post(self, request: Request, org: str) -> Response:
        body = v.as_object(request.data)
        v.reject_unknown(body, ("holder", "purpose", "ttl_seconds", "wait_seconds"))
        req = leases.LeaseRequest(
            holder=v.string(body, "holder", required=True, max_length=200),
            purpose=v.string(body, "purpose", required=True, choices=LeasePurpose.values),
            ttl_seconds=v.integer(body, "ttl_seconds", default=60, minimum=15, maximum=600) or 60,
            wait_seconds=v.integer(body, "wait_seconds", default=0, minimum=0, maximum=60) or 0,
        )
        return _lease_response(leases.lease_request(org_id=org, request=req))


class LeaseDetailView(HotPathView):
    scope = Scope.DATAPLANE

    @extend_schema(
        operation_id="lease_get",
        responses={200: OBJ, 201: OBJ, 202: OBJ, 410: OBJ, 503: OBJ, **ERRORS},
    )
    def get(self, request: Request, org: str, lease_id: int) -> Response:
        return _lease_response(leases.lease_get(org_id=org, lease_id=lease_id))

    @extend_schema(operation_id="lease_release", responses={204: None, **ERRORS})
    def delete(self, request: Request, org: str, lease_id: int) -> Response:
        leases.lease_release(org_id=org, lease_id=lease_id)
        return Response(status=204)


class LeaseRenewView(HotPathView):
    scope = Scope.DATAPLANE
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="lease_renew", request=OBJ, responses={200: OBJ, 410: OBJ, **BODY_ERRORS}
    )
    def post(self, request: Request, org: str, lease_id: int) -> Response:
        body = v.as_object(request.data or {})
        v.reject_unknown(body, ("ttl_seconds",))
        ttl = v.integer(body, "ttl_seconds", default=60, minimum=15, maximum=600) or 60
        return _lease_response(leases.lease_renew(org_id=org, lease_id=lease_id, ttl_seconds=ttl))


# --- warehouses and metadata stores (§5.5) -------------------------------------------------------

_WAREHOUSE_STRINGS = (
    "database_name",
    "metadata_store_host",
    "metadata_store_sslmode",
    "metadata_store_database",
    "metadata_store_user",
    "metadata_store_password_ref",
    "data_bucket",
    "data_region",
    "data_role_arn",
)
_WAREHOUSE_KEYS = (
    "org_id",
    "state",
    "metadata_store_kind",
    "metadata_store_name",
    "metadata_store_port",
    "compaction_enabled",
    "max_connection_leases",
    *_WAREHOUSE_STRINGS,
)


_TRINO_NOT_WIRED = "Trino is not configured on this control plane"


def _parse_trino(data: Any) -> tuple[bool, str | None] | None:
    """The warehouse body's optional ``"trino": {"enabled", "tier"}`` (trino-pools §4.2)."""
    body = v.as_object(data)
    if "trino" not in body:
        return None
    parsed = trino_views.parse_trino_key(body["trino"], "trino")
    if not config.current().wired:
        raise v.body_error("trino", _TRINO_NOT_WIRED)
    return parsed


def _apply_trino(org_id: str, trino: tuple[bool, str | None] | None) -> str:
    """Enable/disable inside the request's transaction; returns the audit detail part."""
    if trino is None:
        return ""
    enabled, tier = trino
    result = trino_views.apply_trino(org_id, enabled, tier, config.current())
    return "; " + trino_views.describe_trino_change(enabled, result)


def _parse_force(data: Any) -> bool:
    """The PATCH's ``force_empty_binding`` (a JSON boolean; never stored): repoint the binding
    without the catalog check (safeguard reshard-72)."""
    body = v.as_object(data)
    if FORCE_FLAG not in body:
        return False
    value = body[FORCE_FLAG]
    if not isinstance(value, bool):
        raise v.body_error(
            FORCE_FLAG,
            "must be a JSON boolean (true: repoint the binding without checking that it holds a "
            "DuckLake catalog; false or absent: check it)",
        )
    return value


def _parse_warehouse(data: Any, *, partial: bool) -> dict[str, Any]:
    body = v.as_object(data)
    if not partial and FORCE_FLAG in body:
        raise v.body_error(
            FORCE_FLAG,
            "accepted only on PATCH /api/v1/warehouses/<org> (a create's binding is not checked "
            "for a catalog); remove it",
        )
    v.reject_unknown(body, (*_WAREHOUSE_KEYS, "trino", *((FORCE_FLAG,) if partial else ())))
    out: dict[str, Any] = {}
    if partial and "org_id" in body:
        raise v.body_error("org_id", "immutable")
    if not partial:
        out["org_id"] = v.string(body, "org_id", required=True, max_length=200, strip=True)
    for key in _WAREHOUSE_STRINGS:
        if key in body:
            out[key] = v.string(body, key, max_length=1024)
    if "state" in body:
        state = v.string(body, "state", required=True)
        if state == WarehouseState.RESHARDING:
            raise ServiceError(400, "state resharding is set only by a reshard")
        out["state"] = v.string(
            body,
            "state",
            choices=[s for s in WarehouseState.values if s != WarehouseState.RESHARDING],
        )
    if "metadata_store_kind" in body:
        out["metadata_store_kind"] = v.string(
            body, "metadata_store_kind", choices=("", "cnpg", "external")
        )
    if "metadata_store_name" in body:
        name = v.string(body, "metadata_store_name", max_length=63)
        out["metadata_store"] = name or None
    if "metadata_store_port" in body:
        out["metadata_store_port"] = v.integer(
            body, "metadata_store_port", minimum=1, maximum=65535, nullable=True
        )
    if "compaction_enabled" in body:
        out["compaction_enabled"] = v.boolean(body, "compaction_enabled", nullable=True)
    if "max_connection_leases" in body:
        out["max_connection_leases"] = v.integer(
            body, "max_connection_leases", minimum=0, nullable=True
        )
    return out


class WarehouseListView(ApiView):
    audit_action = "warehouse.create"
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="warehouse_list",
        parameters=[LIMIT_PARAM, OpenApiParameter("after", str, required=False)],
        responses={200: OBJ, **READ_ERRORS},
        description=(
            "Sorted by org, one page: `{warehouses, next_after}`; pass `after=next_after` for the "
            "next page (`next_after` is null on the last one)."
        ),
    )
    def get(self, request: Request) -> Response:
        limit = _limit(request)
        qs = Warehouse.objects.order_by("org_id")
        if after := request.query_params.get("after"):
            qs = qs.filter(org_id__gt=after)
        rows, more = _page(list(qs[: limit + 1]), limit)
        return Response(
            {
                "warehouses": [warehouse_json(w) for w in rows],
                "next_after": rows[-1].org_id if more else None,
            }
        )

    @extend_schema(
        operation_id="warehouse_create",
        request=OBJ,
        responses={201: OBJ, 500: OBJ, **BODY_ERRORS},
        description=(
            'Create a warehouse. With `"trino": {"enabled", "tier"}` Trino is provisioned in the '
            "same transaction (enablement gate of trino-pools §4.2: the warehouse must be "
            "created `ready`); any refusal creates nothing."
        ),
    )
    def post(self, request: Request) -> Response:
        values = _parse_warehouse(request.data, partial=False)
        self.audit_org = str(values["org_id"])
        trino = _parse_trino(request.data)
        # One transaction: a later failure of this request rolls back the warehouse, the
        # Trino enable and its default placement together (trino-pools §4.2).
        with transaction.atomic():
            written = warehouses.warehouse_create(values=values)
            warehouse = written.warehouse
            detail = _apply_trino(warehouse.org_id, trino)
            body = warehouse_json(warehouse)
        binding = f" with {', '.join(written.changes)}" if written.changes else ""
        self.audit_detail = f"warehouse {warehouse.org_id} created{binding}{detail}"
        return Response(body, status=201)


class WarehouseDetailView(ApiView):
    audit_action = "warehouse.update"
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(operation_id="warehouse_get", responses={200: OBJ, 404: OBJ, **READ_ERRORS})
    def get(self, request: Request, org: str) -> Response:
        warehouse = Warehouse.objects.filter(org_id=org).first()
        if warehouse is None:
            raise ServiceError(404, "org has no managed warehouse")
        return Response(warehouse_json(warehouse))

    @extend_schema(
        operation_id="warehouse_update",
        request=OBJ,
        responses={200: OBJ, 500: OBJ, 503: OBJ, **BODY_ERRORS},
        description=(
            'Partial update. With `"trino": {"enabled", "tier"}` Trino is enabled or disabled in '
            "the same transaction, after the other changes (the warehouse must be `ready` as "
            "the request leaves it); any refusal changes nothing. A change of where the binding "
            "points (`metadata_store_kind`, `metadata_store_name`, `metadata_store_host`, "
            "`metadata_store_port`, `metadata_store_database`) is applied only when the new "
            "binding holds a DuckLake catalog: 409 `binding_without_catalog` when it does not, "
            "503 `catalog_check_unavailable` when the store cannot be reached; "
            '`"force_empty_binding": true` (a JSON boolean, never stored) skips the check and is '
            "audited with the old and the new binding."
        ),
    )
    def patch(self, request: Request, org: str) -> Response:
        changes = _parse_warehouse(request.data, partial=True)
        force = _parse_force(request.data)
        trino = _parse_trino(request.data)
        with transaction.atomic():
            written = warehouses.warehouse_update(
                org_id=org, changes=changes, force_empty_binding=force
            )
            detail = _apply_trino(org, trino)
            body = warehouse_json(written.warehouse)
        summary = "updated " + ", ".join(sorted(changes)) if changes else "no change"
        binding = f" ({', '.join(written.changes)})" if written.changes else ""
        override = f"; {written.catalog_override}" if written.catalog_override else ""
        self.audit_detail = summary + binding + override + detail
        return Response(body)


def _parse_store(data: Any, *, partial: bool) -> dict[str, Any]:
    body = v.as_object(data)
    v.reject_unknown(body, warehouses.STORE_FIELDS)
    out: dict[str, Any] = {}
    if partial:
        for key in ("name", "kind"):
            if key in body:
                raise v.body_error(key, "immutable")
    else:
        name = v.string(body, "name", required=True, max_length=63)
        import re

        if not re.fullmatch(STORE_NAME_PATTERN, name):
            raise v.body_error("name", f"must match {STORE_NAME_PATTERN}")
        out["name"] = name
        out["kind"] = v.string(body, "kind", required=True, choices=StoreKind.values)
        out["host"] = v.string(body, "host", required=True, max_length=1024)
    if partial and "host" in body:
        out["host"] = v.string(body, "host", required=True, max_length=1024)
    if "port" in body:
        out["port"] = v.integer(body, "port", minimum=1, maximum=65535)
    if "sslmode" in body:
        out["sslmode"] = v.string(body, "sslmode", choices=LIBPQ_SSLMODES)
    if "pooler_host" in body:
        out["pooler_host"] = v.string(body, "pooler_host", max_length=1024)
    if "pooler_port" in body:
        out["pooler_port"] = v.integer(body, "pooler_port", minimum=1, maximum=65535, nullable=True)
    if "pooler_sslmode" in body:
        out["pooler_sslmode"] = v.string(body, "pooler_sslmode", choices=("", *LIBPQ_SSLMODES))
    if "tls_policy" in body:
        out["tls_policy"] = v.string(body, "tls_policy", choices=TlsPolicy.values)
    if "tls_policy_reason" in body:
        out["tls_policy_reason"] = v.string(body, "tls_policy_reason", max_length=1024).strip()
    for key in ("provisioner_user", "provisioner_password_ref"):
        if key in body:
            out[key] = v.string(body, key, max_length=1024)
    return out


class WarehouseBackupsView(ApiView):
    @extend_schema(
        operation_id="warehouse_backups",
        parameters=[OpenApiParameter("retention", str, required=False, enum=["plan"])],
        responses={200: OBJ, 404: OBJ, 502: OBJ, 503: OBJ, **READ_ERRORS},
        description=(
            "The warehouse's pre-flip catalog backups in its data bucket, newest first "
            '(docs/api.md "Backups"): only objects of this org\'s reshard operations; a bounded '
            "listing (`truncated`). `?retention=plan`: the retention dry run, keep or delete "
            "with the reason per key; nothing is deleted. 502/503: S3 refused or unreachable."
        ),
    )
    def get(self, request: Request, org: str) -> Response:
        retention = request.query_params.get("retention")
        if retention not in (None, "plan"):
            raise ServiceError(400, "invalid query: retention: must be plan")
        return Response(backups.backups_for_org(org, with_plan=retention == "plan"))


class RestoreTestView(ApiView):
    """``POST /warehouses/<org>/backups/restore-test`` (docs/api.md "Restore tests on
    demand"): queue the restore test of one backup; the default worker runs it."""

    audit_action = "backup.restore_test"
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="backup_restore_test",
        request=OBJ,
        responses={202: OBJ, 500: OBJ, 502: OBJ, 503: OBJ, **BODY_ERRORS},
        description=(
            'Queue the restore test of one of the org\'s backups (docs/backup.md "On demand"): '
            '`{"backup_key": "<key>"}`, or an empty body for the newest backup of an ended '
            "operation. Internal secret or staff admin. 202 with the backup, the store and the "
            "task id; the default worker restores it into a scratch database and records the "
            "result (replacing an earlier one). 409 `restore_test_disabled` when "
            "DUCKGRES_RESTORE_TEST_STORE is empty (nothing queued), 404 for a key that is not "
            "this warehouse's backup, 409 when its operation is still active."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        body = v.as_object(request.data or {})
        v.reject_unknown(body, ("backup_key",))
        key = v.string(body, "backup_key", max_length=1024, strip=True)
        if key and not key.startswith(KEY_PREFIX):
            raise v.body_error(
                "backup_key",
                f"must be a key under {KEY_PREFIX} (GET /api/v1/warehouses/<org>/backups lists "
                "them), or absent for the newest backup",
            )
        assert self.identity is not None
        queued = restore_test_requests.queue_restore_test(
            org_id=org, key=key, actor=self.identity.actor
        )
        self.audit_detail = queued.description
        return Response(queued.body(), status=202)


class MetadataStoreListView(ApiView):
    audit_action = "metadata_store.create"
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="metadata_store_list",
        parameters=[LIMIT_PARAM, OpenApiParameter("after", str, required=False)],
        responses={200: OBJ, **READ_ERRORS},
        description=(
            "Sorted by name, one page: `{metadata_stores, next_after}`; pass `after=next_after` "
            "for the next page (`next_after` is null on the last one)."
        ),
    )
    def get(self, request: Request) -> Response:
        limit = _limit(request)
        qs = MetadataStore.objects.order_by("name")
        if after := request.query_params.get("after"):
            qs = qs.filter(name__gt=after)
        rows, more = _page(list(qs[: limit + 1]), limit)
        return Response(
            {
                "metadata_stores": [store_json(s) for s in rows],
                "next_after": rows[-1].name if more else None,
            }
        )

    @extend_schema(
        operation_id="metadata_store_create", request=OBJ, responses={201: OBJ, **BODY_ERRORS}
    )
    def post(self, request: Request) -> Response:
        values = _parse_store(request.data, partial=False)
        written = warehouses.metadata_store_create(values=values)
        store = written.store
        self.audit_detail = f"metadata store {store.name} ({store.kind}) created with " + ", ".join(
            written.changes
        )
        return Response(store_json(store), status=201)


class MetadataStoreDetailView(ApiView):
    audit_action = "metadata_store.update"
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(operation_id="metadata_store_get", responses={200: OBJ, 404: OBJ, **READ_ERRORS})
    def get(self, request: Request, name: str) -> Response:
        store = MetadataStore.objects.filter(name=name).first()
        if store is None:
            raise ServiceError(404, "no such metadata store")
        return Response(store_json(store))

    @extend_schema(
        operation_id="metadata_store_update", request=OBJ, responses={200: OBJ, **BODY_ERRORS}
    )
    def patch(self, request: Request, name: str) -> Response:
        changes = _parse_store(request.data, partial=True)
        written = warehouses.metadata_store_update(name=name, changes=changes)
        self.audit_detail = f"metadata store {name} updated: " + (
            ", ".join(written.changes) or "no change"
        )
        return Response(store_json(written.store))
