"""Trino routes of the API (spec trino-pools §5, §4.2; identities and audit: spec reshard §5).

Thin: parse, authorise (``ApiView``), call one ``trino_pools`` service, shape JSON. Placement
refusals are ``PlacementError`` (a ``ServiceError`` with its code and extras), answered like
every refusal by ``ApiView.handle_exception``.

- Reads (``GET``) take any staff role or the internal secret; ``GET /trino/instances`` also
  needs the admin role and a staff identity with a non-empty email (spec §5).
- Mutations need admin (or the internal secret) and are audited: ``trino.cell_select``,
  ``trino.cell_move``, ``trino.enable`` / ``trino.disable``. Never a body in the audit row.
- Trino not wired in this process (neither cells file nor default cell, spec §6.1): every
  Trino route answers 404 ``Trino is not configured``, as if the routes did not exist, and the
  warehouse ``trino`` key is refused (400).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from django.db import DatabaseError, transaction
from django.http import HttpRequest
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from duckgres_admin.api import validation as v
from duckgres_admin.api.auth import Kind
from duckgres_admin.api.base import ApiView
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import OperatorRole, TrinoTier, Warehouse, WarehouseTrino
from trino_pools import config, placement, selectors
from trino_pools.config import TrinoSettings
from trino_pools.placement import PlacementError, TrinoPlacement

OBJ = OpenApiTypes.OBJECT
ERRORS = {400: OBJ, 401: OBJ, 403: OBJ, 404: OBJ, 409: OBJ}
BODY_ERRORS = {**ERRORS, 415: OBJ}  # JSON bodies: any other Content-Type is 415
NOT_WIRED = "Trino is not configured"
TIER_RULE = 'must be one of "", free, growth, scale'
INSTANCES_IDENTITY = "an admin identity with an email is required"
CELL_PARAM = OpenApiParameter(
    "cell", str, required=True, description="the pool's public id (no default: required)"
)


def wired_settings() -> TrinoSettings:
    """This process's Trino settings; 404 when Trino is not wired (no Trino routes)."""
    settings = config.current()
    if not settings.wired:
        raise ServiceError(404, NOT_WIRED)
    return settings


def _require_warehouse(org_id: str) -> None:
    if not Warehouse.objects.filter(org_id=org_id).exists():
        raise PlacementError(404, placement.WAREHOUSE_NOT_FOUND)


def placement_json(result: TrinoPlacement | None, org_id: str, settings: TrinoSettings) -> Any:
    """The row after a mutation. ``cell`` is the owner's public id ('' when unassigned or not
    configured); ``trino_cell_id`` is the stored owner as persisted."""
    if result is None:
        return {
            "org_id": org_id,
            "enabled": False,
            "tier": "",
            "state": "pending",
            "cell": "",
            "trino_cell_id": "",
            "assigned": False,
        }
    cell = settings.cell_by_stored_id(result.owner) if result.owner else None
    return {
        "org_id": result.org_id,
        "enabled": result.enabled,
        "tier": result.tier,
        "state": result.state,
        "cell": cell.id if cell is not None else "",
        "trino_cell_id": result.owner,
        "assigned": bool(result.owner),
    }


def parse_trino_key(data: Any, path: str = "") -> tuple[bool, str | None]:
    """``{"enabled": bool (required), "tier": ''|free|growth|scale}``; unknown keys rejected.

    ``tier`` omitted → ``None`` (the stored tier is kept). A tier with ``"enabled": false`` is
    refused: disabling keeps the row's tier, so a tier there would silently do nothing.
    """
    body = v.as_object(data, path or "body")
    v.reject_unknown(body, ("enabled", "tier"), path)
    if "enabled" not in body:
        raise v.body_error(v.join(path, "enabled"), "required")
    enabled = bool(v.boolean(body, "enabled", path))
    tier: str | None = None
    if "tier" in body:
        tier = v.string(body, "tier", path)
        if tier not in TrinoTier.values:
            raise v.body_error(v.join(path, "tier"), TIER_RULE)
        if not enabled:
            raise v.body_error(v.join(path, "tier"), "accepted only with enabled true")
    return enabled, tier


def apply_trino(
    org_id: str, enabled: bool, tier: str | None, settings: TrinoSettings
) -> TrinoPlacement | None:
    """Enable (gate of §4.2, default placement in the same statement) or disable, inside the
    caller's ``transaction.atomic()`` so a later failure of the request rolls everything back.

    With ``tier`` omitted the stored tier is kept: it is read under the per-org advisory lock,
    which every enable (the only tier writer) takes first, so it cannot change underneath.
    """
    if not enabled:
        return placement.disable_trino(org_id)
    if tier is None:
        placement.lock_org(org_id)
        stored = (
            WarehouseTrino.objects.filter(warehouse_id=org_id)
            .values_list("tier", flat=True)
            .first()
        )
        tier = stored or ""
    return placement.enable_trino(org_id, settings, tier=tier)


def describe_trino_change(enabled: bool, result: TrinoPlacement | None) -> str:
    if not enabled:
        kept = f" (owner {result.owner} kept)" if result is not None and result.owner else ""
        return f"trino disabled{kept}"
    assert result is not None
    return f"trino enabled on {result.owner} (tier {result.tier or 'none'})"


# --- fleet-wide reads: /trino/… --------------------------------------------------------------


class TrinoCellsView(ApiView):
    @extend_schema(
        operation_id="trino_cells",
        responses={200: OBJ, 401: OBJ, 403: OBJ, 404: OBJ},
        description="Every configured Trino pool, sorted by public id (spec trino-pools §5).",
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.list_cells(wired_settings()))


class TrinoOrgsView(ApiView):
    @extend_schema(
        operation_id="trino_orgs",
        parameters=[CELL_PARAM],
        responses={200: OBJ, **ERRORS},
        description="The per-org Trino rows owned by the pool `?cell=`, from the config store.",
    )
    def get(self, request: Request) -> Response:
        settings = wired_settings()
        return Response(selectors.org_rows(settings, request.query_params.get("cell")))


class TrinoInstancesView(ApiView):
    @extend_schema(
        operation_id="trino_instances",
        parameters=[CELL_PARAM],
        responses={200: OBJ, **ERRORS},
        description=(
            "Non-terminal instances of the shared pool `?cell=`, sorted by id. Staff admins "
            "with an email only (the internal secret and viewers get 403)."
        ),
    )
    def get(self, request: Request) -> Response:
        settings = wired_settings()
        ident = self.identity
        assert ident is not None
        if ident.role != OperatorRole.ADMIN:
            raise ServiceError(403, "admin role required")
        email = str(getattr(request._request.user, "email", "") or "").strip()
        if ident.kind is not Kind.STAFF or not email:
            raise ServiceError(403, INSTANCES_IDENTITY)
        return Response(selectors.instances(settings, request.query_params.get("cell")))


# --- per-warehouse: /warehouses/<org>/trino… -----------------------------------------------------


class WarehouseTrinoView(ApiView):
    """``GET`` the org's Trino placement; ``POST {"enabled", "tier"}`` enables or disables."""

    audit_action = "trino.enable"
    parser_classes: ClassVar[list[Any]] = [JSONParser]  # type: ignore[misc]

    intended_action: str = "trino.enable"

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # The audit action follows the request's intent, decided before anything can refuse
        # (so a refused disable is audited as trino.disable too). The raw body is read here,
        # before DRF consumes the stream; its parse errors stay the view's to answer.
        if (request.method or "").upper() == "POST":
            try:
                raw = json.loads(request._request.body or b"null")
            except Exception:  # noqa: BLE001 - unreadable or too big: the view answers it
                raw = None
            if isinstance(raw, dict) and raw.get("enabled") is False:
                self.intended_action = "trino.disable"
        super().initial(request, *args, **kwargs)

    def audit_action_for(self, request: HttpRequest) -> str:
        return self.intended_action

    @extend_schema(
        operation_id="warehouse_trino_get",
        responses={200: OBJ, 401: OBJ, 403: OBJ, 404: OBJ, 409: OBJ},
        description=(
            "Follows the persisted owner, never another pool: unassigned → "
            '`{"cell":{},"enabled","assigned":false,"available":false}`; an owner that is not '
            'configured → 409 `{"error":"the assigned Trino cell is not configured",'
            '"assigned":true}`.'
        ),
    )
    def get(self, request: Request, org: str) -> Response:
        settings = wired_settings()
        _require_warehouse(org)
        return Response(placement.describe(org, settings))

    @extend_schema(
        operation_id="warehouse_trino_set",
        request=OBJ,
        responses={202: OBJ, 500: OBJ, **BODY_ERRORS},
        description=(
            'Enable or disable Trino: `{"enabled": true|false, "tier": ""|"free"|"growth"|'
            '"scale"}`. Enabling needs a ready warehouse (409 `warehouse_not_ready`) and a '
            "configured owner or a default cell (§4.2). Disabling keeps the owner. 202."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        settings = wired_settings()
        enabled, tier = parse_trino_key(request.data)
        if enabled:
            try:
                with transaction.atomic():
                    result = apply_trino(org, True, tier, settings)
            except DatabaseError:
                raise PlacementError(500, placement.CANNOT_VERIFY) from None
        else:
            with transaction.atomic():
                _require_warehouse(org)
                result = apply_trino(org, False, None, settings)
        self.audit_detail = describe_trino_change(enabled, result)
        return Response(placement_json(result, org, settings), status=202)


class WarehouseTrinoCellView(ApiView):
    audit_action = "trino.cell_select"
    parser_classes: ClassVar[list[Any]] = [JSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="warehouse_trino_cell_select",
        request=OBJ,
        responses={200: OBJ, 500: OBJ, **BODY_ERRORS},
        description=(
            'Initial selection `{"cell": "<public id>"}` before first enablement (never '
            'enables); the same cell again succeeds. 200 `{"cell", "assigned": true}`.'
        ),
    )
    def put(self, request: Request, org: str) -> Response:
        settings = wired_settings()
        body = v.as_object(request.data)
        v.reject_unknown(body, ("cell",))
        cell = v.string(body, "cell", max_length=63, strip=True)
        try:
            result = placement.select_cell(org, cell, settings)
        except DatabaseError:
            raise PlacementError(500, placement.CANNOT_VERIFY) from None
        self.audit_detail = f"trino cell {result.owner} selected"
        return Response({"cell": cell, "assigned": True, "trino_cell_id": result.owner})


class WarehouseTrinoMoveView(ApiView):
    audit_action = "trino.cell_move"
    parser_classes: ClassVar[list[Any]] = [JSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="warehouse_trino_cell_move",
        request=OBJ,
        responses={200: OBJ, **BODY_ERRORS},
        description=(
            'Maintenance move `{"from", "to"}` (public ids, both configured) by compare-and-swap '
            "under the per-org lock; resets the row's state, status and catalog name. Repeating "
            "a finished move is a no-op."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        settings = wired_settings()
        body = v.as_object(request.data)
        v.reject_unknown(body, ("from", "to"))
        source = v.string(body, "from", required=True, max_length=63, strip=True)
        target = v.string(body, "to", required=True, max_length=63, strip=True)
        result = placement.move_cell(org, source, target, settings)
        self.audit_detail = f"trino cell moved {source} → {target}"
        return Response(placement_json(result, org, settings))
