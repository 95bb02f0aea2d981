"""The base view: identity per route, admin for mutations, scrubbed error bodies, audit.

Views stay thin: parse, authorise (here), call one service, shape JSON.

Hostile input is refused here, before any view code or database access: a NUL character in a
path segment (404), in a query parameter or anywhere in a body value (400; PostgreSQL text
cannot hold one), and a body larger than ``DUCKGRES_API_MAX_BODY_BYTES`` (413; DRF's parsers
bypass Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``, so :class:`BoundedJSONParser` reads at most
that much). A request that proves no identity writes nothing (no audit row).
"""

from __future__ import annotations

import io
import logging
import traceback
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import JSONParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from duckgres_admin.api.auth import (
    MUTATING_METHODS,
    AuthRefusal,
    Identity,
    Kind,
    Scope,
    authenticate,
    enforce_csrf,
    record_unauthenticated,
    require_admin,
)
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import AuditRecord

_log = logging.getLogger("duckgres.api")
DRY_RUN_ONLY_ON_START = (
    "invalid body: dry_run: accepted only on POST /api/v1/warehouses/<org>/reshards"
)


def error_response(exc: ServiceError) -> Response:
    """``{"error", "code"?}`` plus the refusal's extras (a Trino placement refusal's
    ``"assigned": true``, spec trino-pools §5), the message scrubbed."""
    body = exc.body()
    body["error"] = process_scrubber().scrub(exc.message)
    return Response(body, status=exc.status, headers=exc.headers or None)


def _text(value: str) -> str:
    """PostgreSQL text cannot hold NUL: a NUL that reached the request (a body key, a
    percent-encoded path) is written as the two characters ``\\0`` so the audit row still lands."""
    return value.replace("\x00", "\\0")


def body_too_large() -> ServiceError:
    limit = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
    return ServiceError(
        413,
        f"invalid body: body: larger than {limit} bytes (DUCKGRES_API_MAX_BODY_BYTES); send a "
        "smaller JSON document",
    )


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser reading at most ``DUCKGRES_API_MAX_BODY_BYTES`` (413 beyond)."""

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
        try:
            raw = stream.read(limit + 1) if stream is not None else b""
        except OSError:
            raise ServiceError(
                400, "invalid body: body: not received completely (client too slow or gone)"
            ) from None
        if len(raw) > limit:
            raise body_too_large()
        return super().parse(io.BytesIO(raw), media_type, parser_context)


def nul_path(value: Any, path: str = "") -> str | None:
    """The path of the first body value holding a NUL (keys are refused as unknown fields)."""
    if isinstance(value, str):
        return (path or "body") if "\x00" in value else None
    children: list[tuple[str, Any]]
    if isinstance(value, Mapping):
        children = [(f"{path}.{key}" if path else str(key), item) for key, item in value.items()]
    elif isinstance(value, list):
        children = [(f"{path or 'body'}[{i}]", item) for i, item in enumerate(value)]
    else:
        return None
    for child, item in children:
        found = nul_path(item, _text(child[:200]))
        if found:
            return found
    return None


class ApiView(APIView):
    scope: ClassVar[Scope] = Scope.OPERATOR
    audit_action: ClassVar[str] = ""
    authentication_classes: ClassVar[list[Any]] = []  # type: ignore[misc]
    permission_classes: ClassVar[list[Any]] = []  # type: ignore[misc]
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    identity: Identity | None = None
    unauthenticated: bool = False
    parsed_body: Any = None  # the request's JSON body once parsed (None before or without one)
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
        try:
            self.identity = authenticate(django_request, self.scope)
        except AuthRefusal as exc:
            self.identity = exc.proven
            if exc.reason:
                # Proved nothing: answered, counted, logged (rate-limited), never written.
                self.unauthenticated = True
                record_unauthenticated(django_request, self.scope, exc.reason)
            raise
        if any(isinstance(value, str) and "\x00" in value for value in kwargs.values()):
            # No name in the config store can hold a NUL (PostgreSQL text cannot): nothing by
            # that name exists, and the query must not reach the driver (it would be a 500).
            raise ServiceError(404, "not found: the path contains a NUL character")
        for key, values in request.query_params.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                raise ServiceError(
                    400,
                    f"invalid query: {_text(key[:64])}: must not contain a NUL character",
                )
        method = (request.method or "").upper()
        if self.identity.kind is Kind.STAFF and method in MUTATING_METHODS:
            enforce_csrf(django_request)
        if self.scope is Scope.OPERATOR:
            require_admin(self.identity, method)
        if method in MUTATING_METHODS:
            self._check_body(request)
            if not self.accepts_dry_run:
                self._refuse_dry_run(request)

    def _check_body(self, request: Request) -> None:
        """413 above the size limit (announced or read), 400 for a NUL in any body value."""
        try:
            announced = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            announced = 0
        if announced > int(settings.DUCKGRES_API_MAX_BODY_BYTES):
            raise body_too_large()
        # A malformed body raises ParseError here, answered exactly as the view would.
        self.parsed_body = request.data
        found = nul_path(self.parsed_body)
        if found:
            raise ServiceError(
                400,
                f"invalid body: {found}: must not contain a NUL character (PostgreSQL text "
                "cannot hold one)",
            )

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
        _log.error("unhandled API error: %s", process_scrubber().scrub(trace))
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
        if action and not self.skip_audit and not self.unauthenticated:
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
            detail=_text(process_scrubber().scrub(self.audit_detail))[:4000],
        )

    def request_body(self, request: Request) -> Any:
        return request.data


class JsonOnlyNegotiation(DefaultContentNegotiation):
    """The renderer is the view's one renderer, chosen without parsing ``Accept``."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, str(renderer.media_type)


class HotPathView(ApiView):
    """The data plane's lease routes, its per-session hot path (docs/performance.md "Lease
    path"): JSON only, with no ``Accept`` negotiation and no browsable API (their scope refuses
    staff sessions, so a browser only ever saw an error page there). Everything else — identity,
    hostile-input checks, error bodies — is :class:`ApiView`'s."""

    renderer_classes: ClassVar[list[Any]] = [JSONRenderer]  # type: ignore[misc]
    content_negotiation_class = JsonOnlyNegotiation
