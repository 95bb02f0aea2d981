"""The metadata-store routes: list and register, read, update and delete a store."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

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
from duckgres_admin.api.serializers import store_json
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    LIBPQ_SSLMODES,
    STORE_NAME_PATTERN,
    MetadataStore,
    StoreKind,
)
from duckgres_admin.models.stores import TlsPolicy
from reshard.warehouses import writes


def _parse_store(data: Any, *, partial: bool) -> dict[str, Any]:
    body = v.as_object(data)
    v.reject_unknown(body, writes.STORE_FIELDS)
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
        limit = page_limit(request)
        qs = MetadataStore.objects.order_by("name")
        if after := request.query_params.get("after"):
            qs = qs.filter(name__gt=after)
        rows, more = page_of(list(qs[: limit + 1]), limit)
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
        written = writes.metadata_store_create(values=values)
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
        written = writes.metadata_store_update(name=name, changes=changes)
        self.audit_detail = f"metadata store {name} updated: " + (
            ", ".join(written.changes) or "no change"
        )
        return Response(store_json(written.store))
