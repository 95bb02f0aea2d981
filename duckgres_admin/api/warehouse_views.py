"""The warehouse routes: list and create, read, update and delete (with the Trino switch and the
binding's force flag), the warehouse's backups and a restore test on demand.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from duckgres_admin.api import trino_views
from duckgres_admin.api import validation as v
from duckgres_admin.api.base import ApiView, BoundedJSONParser
from duckgres_admin.api.common import (
    BODY_ERRORS,
    LIMIT_PARAM,
    OBJ,
    READ_ERRORS,
    page_limit,
    page_of,
)
from duckgres_admin.api.serializers import warehouse_json
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    Warehouse,
    WarehouseState,
)
from reshard.backups import inventory, requests
from reshard.engines.backup import KEY_PREFIX
from reshard.warehouses import writes
from reshard.warehouses.binding_catalog import FORCE_FLAG
from trino_pools import config

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
        limit = page_limit(request)
        qs = Warehouse.objects.order_by("org_id")
        if after := request.query_params.get("after"):
            qs = qs.filter(org_id__gt=after)
        rows, more = page_of(list(qs[: limit + 1]), limit)
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
            written = writes.warehouse_create(values=values)
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
            written = writes.warehouse_update(
                org_id=org, changes=changes, force_empty_binding=force
            )
            detail = _apply_trino(org, trino)
            body = warehouse_json(written.warehouse)
        summary = "updated " + ", ".join(sorted(changes)) if changes else "no change"
        binding = f" ({', '.join(written.changes)})" if written.changes else ""
        override = f"; {written.catalog_override}" if written.catalog_override else ""
        self.audit_detail = summary + binding + override + detail
        return Response(body)


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
        return Response(inventory.backups_for_org(org, with_plan=retention == "plan"))


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
        queued = requests.queue_restore_test(org_id=org, key=key, actor=self.identity.actor)
        self.audit_detail = queued.description
        return Response(queued.body(), status=202)
