"""The data plane's connection-lease routes (hot path): create, read and release, renew; the bearer
credential of the data-plane secret.
"""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from duckgres_admin.api import validation as v
from duckgres_admin.api.auth import Scope
from duckgres_admin.api.base import BoundedJSONParser, HotPathView
from duckgres_admin.api.common import BODY_ERRORS, ERRORS, OBJ
from duckgres_admin.dataplane import leases
from duckgres_admin.models import (
    LeasePurpose,
)


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
