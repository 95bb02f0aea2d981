"""The base view: identity per route, admin for mutations, scrubbed error bodies, audit.

Views stay thin: parse, authorise (here), call one service, shape JSON.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, ClassVar

from django.db import DatabaseError
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from duckgres_admin.api.auth import (
    MUTATING_METHODS,
    Identity,
    Kind,
    Scope,
    authenticate,
    enforce_csrf,
    require_admin,
)
from duckgres_admin.models import AuditRecord
from reshard.services import ServiceError, api_scrubber
from trino_pools.placement import PlacementError

_log = logging.getLogger("duckgres.api")
DRY_RUN_ONLY_ON_START = (
    "invalid body: dry_run: accepted only on POST /api/v1/warehouses/<org>/reshards"
)


def error_response(exc: ServiceError) -> Response:
    body: dict[str, Any] = {"error": api_scrubber().scrub(exc.message)}
    if exc.code:
        body["code"] = exc.code
    return Response(body, status=exc.status, headers=exc.headers or None)


def placement_error_response(exc: PlacementError) -> Response:
    """A Trino placement refusal: ``{"error", "code"?}`` plus its listed extras (spec
    trino-pools §5, e.g. ``"assigned": true``), the message scrubbed like every error."""
    body = exc.body()
    body["error"] = api_scrubber().scrub(exc.message)
    return Response(body, status=exc.status)


def _text(value: str) -> str:
    """PostgreSQL text cannot hold NUL: a NUL that reached the request (a body key, a
    percent-encoded path) is written as the two characters ``\\0`` so the audit row still lands."""
    return value.replace("\x00", "\\0")


class ApiView(APIView):
    scope: ClassVar[Scope] = Scope.OPERATOR
    audit_action: ClassVar[str] = ""
    authentication_classes: ClassVar[list[Any]] = []  # type: ignore[misc]
    permission_classes: ClassVar[list[Any]] = []  # type: ignore[misc]

    identity: Identity | None = None
    audit_org: str = ""
    audit_detail: str = ""
    skip_audit: bool = False
    accepts_dry_run: ClassVar[bool] = False

    def perform_authentication(self, request: Request) -> None:
        # DRF's own authentication would overwrite the session user with None; identities
        # are resolved in ``initial`` from the Django request instead.
        return None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        django_request: HttpRequest = request._request
        self.audit_org = str(kwargs.get("org", ""))
        self.identity = authenticate(django_request, self.scope)
        if any(isinstance(value, str) and "\x00" in value for value in kwargs.values()):
            # No name in the config store can hold a NUL (PostgreSQL text cannot): nothing by
            # that name exists, and the query must not reach the driver (it would be a 500).
            raise ServiceError(404, "not found: the path contains a NUL character")
        method = (request.method or "").upper()
        if self.identity.kind is Kind.STAFF and method in MUTATING_METHODS:
            enforce_csrf(django_request)
        if self.scope is Scope.OPERATOR:
            require_admin(self.identity, method)
        if method in MUTATING_METHODS and not self.accepts_dry_run:
            self._refuse_dry_run(request)

    def _refuse_dry_run(self, request: Request) -> None:
        """``dry_run`` exists only on the start route (spec §5.1); anywhere else a clear 400
        instead of being ignored (cancel) or reported as a generic unknown field."""
        # A malformed body raises ParseError here, answered exactly as the view would (DRF
        # keeps an empty body after a parse error, so it must not be swallowed).
        data = request.data
        in_body = isinstance(data, dict) and "dry_run" in data
        if in_body or "dry_run" in request.query_params:
            raise ServiceError(400, DRY_RUN_ONLY_ON_START)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, ServiceError):
            self.audit_detail = self.audit_detail or exc.message
            return error_response(exc)
        if isinstance(exc, PlacementError):
            self.audit_detail = self.audit_detail or exc.message
            return placement_error_response(exc)
        if isinstance(exc, exceptions.ParseError):
            return error_response(ServiceError(400, "invalid body: body: malformed JSON"))
        if isinstance(exc, exceptions.UnsupportedMediaType):
            return error_response(
                ServiceError(415, "invalid body: body: use Content-Type application/json")
            )
        if isinstance(exc, exceptions.MethodNotAllowed):
            return error_response(ServiceError(405, "method not allowed"))
        if isinstance(exc, exceptions.APIException):
            return super().handle_exception(exc)
        # Anything else is a bug or an outage: a JSON 500 (scrubbed, audited), and the
        # traceback in the process log.
        trace = "".join(traceback.format_exception(exc))
        _log.error("unhandled API error: %s", api_scrubber().scrub(trace))
        if isinstance(exc, DatabaseError):
            return error_response(ServiceError(500, f"config store error: {exc}"))
        return error_response(ServiceError(500, f"internal error ({type(exc).__name__})"))

    def finalize_response(
        self, request: Request, response: Any, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        assert isinstance(response, Response)
        method = (request.method or "").upper()
        action = self.audit_action_for(request._request) if method in MUTATING_METHODS else ""
        if action and not self.skip_audit:
            self._audit(request._request, method, response.status_code, action)
        return response

    def audit_action_for(self, request: HttpRequest) -> str:
        """The audit action of this request (a view whose action depends on the body overrides
        this; it must not touch ``request.data``, whose parse errors belong to the view)."""
        return self.audit_action

    def _audit(self, request: HttpRequest, method: str, status: int, action: str) -> None:
        ident = self.identity
        AuditRecord.objects.create(
            actor=_text(ident.actor if ident else ""),
            role=_text(ident.role if ident else ""),
            source=_text(ident.source if ident else ""),
            method=_text(method),
            path=_text(request.path)[:2000],
            org_id=_text(self.audit_org),
            status=status,
            client_ip=_text(str(request.META.get("REMOTE_ADDR", ""))),
            action=action,
            detail=_text(api_scrubber().scrub(self.audit_detail))[:4000],
        )

    def request_body(self, request: Request) -> Any:
        return request.data
