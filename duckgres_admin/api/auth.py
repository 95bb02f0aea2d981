"""Identities and roles of the API (spec reshard §5).

Three shared secrets, each with its own header and each accepted only on its routes; a secret
presented on another route is 403 and never falls through to another identity. During a
rotation each secret's ``<NAME>_PREVIOUS`` setting is accepted as well (both values are always
compared; a request proved by the previous value is counted, so an operator sees when it is no
longer used). Every secret comparison uses ``hmac.compare_digest``.

Staff users authenticate with a Django session or with a personal token (django-rest-knox rows,
``Authorization: Token <token>``, operator routes only). Either way the person's role comes from
``duckgres_operators`` (no row → viewer, disabled → 403), their audit name is their email (their
username without one), and a token needs no CSRF token (a browser never sends it by itself). A
token is checked against its stored SHA-512 digest, its expiry and its user's ``is_active`` and
``is_staff`` on every request: deleting the row (revoking it) or deactivating the user refuses
the next request. Checking a token writes nothing (an expired row stays until an admin deletes
it). Precedence on an operator route: the internal secret header, then a token (a wrong token is
401 and never falls through to the session), then the session.

A request that proves no identity at all (no credential, a wrong value for the route's secret,
or only a foreign secret header whose value is wrong) is **unauthenticated**: it is answered as
before, but writes nothing to the config store (no audit row, no op-log line). It is counted in
``duckgres_api_unauthenticated_requests_total{scope, reason}`` and logged at most once a minute
per scope and reason, with the count of the ones not logged.
"""

from __future__ import annotations

import enum
import hmac
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest
from django.utils import timezone
from knox.crypto import hash_token
from knox.models import AuthToken
from knox.settings import CONSTANTS as KNOX_CONSTANTS
from prometheus_client import Counter
from rest_framework import exceptions
from rest_framework.authentication import CSRFCheck
from rest_framework.permissions import BasePermission

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import Operator, OperatorRole

INTERNAL_HEADER = "X-Duckgres-Internal-Secret"
RUNNER_HEADER = "X-Duckgres-Runner-Secret"
DATAPLANE_HEADER = "X-Duckgres-Dataplane-Secret"
TOKEN_SCHEME = "Token"  # Authorization: Token <token> (a Bearer credential is the runner's)
TOKEN_SOURCE = "personal-token"
# knox tokens are "dgadm_" + 64 hex characters; anything else (a NUL, a space, a huge value) is
# refused before it reaches a query.
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
MAX_TOKEN_LENGTH = 128
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Scope(enum.Enum):
    """Which identities a route accepts."""

    OPERATOR = "operator"  # staff users and the internal secret
    RUNNER = "runner"  # the runner secret only (password route)
    DATAPLANE = "dataplane"  # the data-plane secret only (lease routes)


class Kind(enum.Enum):
    STAFF = "staff"
    TOKEN = "token"  # a staff user through a personal token
    INTERNAL = "internal"
    RUNNER = "runner"
    DATAPLANE = "dataplane"


@dataclass(frozen=True)
class Identity:
    kind: Kind
    actor: str  # email (username without one), or the identity's label
    role: str  # viewer | admin ('' for runner and data plane)
    # audit source: django | personal-token | internal-secret | runner-secret | dataplane-secret
    source: str

    @property
    def label(self) -> str:
        return self.actor


INTERNAL_ACTOR = "internal-secret"
_SCOPE_REFUSAL = {
    Scope.RUNNER: "runner secret required",
    Scope.DATAPLANE: "data-plane secret required",
    Scope.OPERATOR: "this secret is not accepted on this route",
}


UNAUTHENTICATED = Counter(
    "duckgres_api_unauthenticated_requests_total",
    "API requests refused without any proven identity (nothing is written for them), by route "
    "scope and reason (no_credentials, invalid_secret, invalid_token, "
    "unverified_foreign_secret).",
    ["scope", "reason"],
)
REASONS = ("no_credentials", "invalid_secret", "invalid_token", "unverified_foreign_secret")
PREVIOUS_SECRET_ACCEPTED = Counter(
    "duckgres_api_previous_secret_accepted_total",
    "API requests whose shared secret matched only its <NAME>_PREVIOUS value (a rotation's "
    "overlap window), by secret variable: remove the _PREVIOUS value once this stops growing.",
    ["secret"],
)
for _scope in Scope:
    for _reason in REASONS:
        UNAUTHENTICATED.labels(scope=_scope.value, reason=_reason)
LOG_INTERVAL_SECONDS = 60.0
_log = logging.getLogger("duckgres.api.auth")
_log_lock = threading.Lock()
_log_window: dict[tuple[str, str], tuple[float, int]] = {}


class AuthRefusal(ServiceError):
    """A 401/403 of :func:`authenticate`. ``reason`` is set when the caller proved no identity
    (unauthenticated: nothing may be written for it); ``proven`` is the identity the caller did
    prove when it is refused anyway (a valid secret or session on a route that does not take
    it), for the audit row."""

    def __init__(
        self, status: int, message: str, *, reason: str = "", proven: Identity | None = None
    ) -> None:
        super().__init__(status, message)
        self.reason = reason
        self.proven = proven


def record_unauthenticated(request: HttpRequest, scope: Scope, reason: str) -> None:
    """Count an unauthenticated request; log it, rate-limited (one line per minute per scope
    and reason, carrying how many were not logged)."""
    UNAUTHENTICATED.labels(scope=scope.value, reason=reason).inc()
    key = (scope.value, reason)
    now = time.monotonic()
    with _log_lock:
        last, skipped = _log_window.get(key, (None, 0))
        if last is not None and now - last < LOG_INTERVAL_SECONDS:
            _log_window[key] = (last, skipped + 1)
            return
        _log_window[key] = (now, 0)
    _log.warning(
        "unauthenticated API request refused (%s route, %s): %s %r from %s; %d more refused "
        "since the last such line",
        scope.value,
        reason,
        request.method,
        request.path[:200],
        request.META.get("REMOTE_ADDR", ""),
        skipped,
    )


def _header(request: HttpRequest, name: str) -> str | None:
    value = request.headers.get(name)
    return value if value else None


def _matches(presented: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())


def _person_identity(user: Any, kind: Kind, source: str) -> Identity:
    """A staff user's identity (session or token): role from ``duckgres_operators``."""
    email = (getattr(user, "email", "") or user.get_username()).strip().lower()
    person = Identity(kind, email, "", source)
    if not user.is_staff:
        raise AuthRefusal(403, "staff user required", proven=person)
    operator = Operator.objects.filter(email=email).first()
    if operator is not None and operator.disabled:
        raise AuthRefusal(403, "operator disabled", proven=person)
    role = operator.role if operator is not None else OperatorRole.VIEWER.value
    return Identity(kind, email, str(role), source)


def _staff_identity(request: HttpRequest) -> Identity | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return _person_identity(user, Kind.STAFF, "django")


def _presented_token(request: HttpRequest) -> str | None:
    """The value of ``Authorization: Token <value>`` (None for no header or another scheme:
    a Bearer credential belongs to the runner's password pull)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != TOKEN_SCHEME.lower():
        return None
    return value.strip()


def _token_identity(token: str) -> Identity:
    """The person a personal token proves; 401 for anything that is not a live token of an
    active user (nothing is written either way)."""
    invalid = AuthRefusal(401, "invalid credentials", reason="invalid_token")
    if not token or len(token) > MAX_TOKEN_LENGTH or not set(token) <= _TOKEN_CHARS:
        raise invalid
    digest = hash_token(token)
    candidates = AuthToken.objects.filter(
        token_key=token[: KNOX_CONSTANTS.TOKEN_KEY_LENGTH]
    ).select_related("user")
    now = timezone.now()
    for row in candidates:
        if not hmac.compare_digest(digest, row.digest):
            continue
        if (row.expiry is not None and row.expiry <= now) or not row.user.is_active:
            raise invalid
        return _person_identity(row.user, Kind.TOKEN, TOKEN_SOURCE)
    raise invalid


_EXPECTED = {
    Kind.INTERNAL: "DUCKGRES_INTERNAL_SECRET",
    Kind.RUNNER: "DUCKGRES_RUNNER_SECRET",
    Kind.DATAPLANE: "DUCKGRES_DATAPLANE_SECRET",
}
for _variable in _EXPECTED.values():
    PREVIOUS_SECRET_ACCEPTED.labels(secret=_variable)


def _verify(kind: Kind, presented: str) -> bool:
    """``presented`` is the current value or, during a rotation, the ``_PREVIOUS`` one. Both
    comparisons always run (constant time whichever matches)."""
    variable = _EXPECTED[kind]
    current = _matches(presented, str(getattr(settings, variable)))
    previous = _matches(presented, str(getattr(settings, f"{variable}_PREVIOUS", "")))
    if previous and not current:
        PREVIOUS_SECRET_ACCEPTED.labels(secret=variable).inc()
    return current or previous


def _secret_identity(kind: Kind) -> Identity:
    if kind is Kind.INTERNAL:
        return Identity(Kind.INTERNAL, INTERNAL_ACTOR, OperatorRole.ADMIN.value, INTERNAL_ACTOR)
    label = "runner-secret" if kind is Kind.RUNNER else "dataplane-secret"
    return Identity(kind, label, "", label)


def describe_caller(request: HttpRequest) -> str:
    """Who is calling, for op-log lines of refused password requests (never a secret)."""
    if _header(request, INTERNAL_HEADER):
        return "the internal secret"
    if _header(request, DATAPLANE_HEADER):
        return "the data-plane secret"
    if _header(request, RUNNER_HEADER):
        return "a runner secret"
    if _presented_token(request) is not None:
        return "a personal token"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"staff user {(getattr(user, 'email', '') or user.get_username())}"
    return "an unauthenticated caller"


def _refuse_foreign_token(token: str, refusal: str) -> None:
    """A personal token on a runner or data-plane route: 403 whatever its value, which decides
    only whether the caller proved who it is."""
    try:
        proven = _token_identity(token)
    except AuthRefusal as exc:
        if exc.proven is None:
            raise AuthRefusal(403, refusal, reason="unverified_foreign_secret") from None
        proven = exc.proven
    raise AuthRefusal(403, refusal, proven=proven)


def authenticate(request: HttpRequest, scope: Scope) -> Identity:
    """The caller's identity on a route of ``scope``; raises :class:`AuthRefusal` 401/403."""
    presented = {
        Kind.INTERNAL: _header(request, INTERNAL_HEADER),
        Kind.RUNNER: _header(request, RUNNER_HEADER),
        Kind.DATAPLANE: _header(request, DATAPLANE_HEADER),
    }
    accepted = {
        Scope.OPERATOR: Kind.INTERNAL,
        Scope.RUNNER: Kind.RUNNER,
        Scope.DATAPLANE: Kind.DATAPLANE,
    }[scope]
    refusal = _SCOPE_REFUSAL[scope]
    # A secret that this route does not accept is refused outright, even with a valid session
    # (the answer never depends on its value). Its value decides only whether the caller proved
    # who it is (and may be audited) or nothing (and nothing is written).
    for kind, value in presented.items():
        if value is not None and kind is not accepted:
            if _verify(kind, value):
                raise AuthRefusal(403, refusal, proven=_secret_identity(kind))
            raise AuthRefusal(403, refusal, reason="unverified_foreign_secret")
    token = _presented_token(request)
    if token is not None and scope is not Scope.OPERATOR:
        _refuse_foreign_token(token, refusal)
    value = presented[accepted]
    if value is not None:
        if not _verify(accepted, value):
            raise AuthRefusal(401, "invalid credentials", reason="invalid_secret")
        return _secret_identity(accepted)
    if token is not None:
        return _token_identity(token)
    staff = _staff_identity(request)
    if staff is None:
        raise AuthRefusal(401, "authentication required", reason="no_credentials")
    if scope is not Scope.OPERATOR:
        raise AuthRefusal(403, refusal, proven=staff)
    return staff


class _SchemaRefused(exceptions.APIException):
    def __init__(self, refusal: ServiceError) -> None:
        super().__init__(detail={"error": refusal.message})
        self.status_code = refusal.status


class SchemaPermission(BasePermission):
    """``/api/schema/`` (drf-spectacular's ``SERVE_PERMISSIONS``): the operator identities,
    as every other operator read; answered ``{"error"}`` 401/403 like the API."""

    def has_permission(self, request: Any, view: Any) -> bool:
        django_request: HttpRequest = request._request
        # DRF's own (empty) authentication has replaced the session user with None by now;
        # read it from the session again, as AuthenticationMiddleware does.
        django_request.user = get_user(django_request)
        try:
            authenticate(django_request, Scope.OPERATOR)
        except AuthRefusal as exc:
            if exc.reason:
                record_unauthenticated(django_request, Scope.OPERATOR, exc.reason)
            raise _SchemaRefused(exc) from None
        return True


def require_admin(identity: Identity, method: str) -> None:
    if method in MUTATING_METHODS and identity.role != OperatorRole.ADMIN:
        raise ServiceError(403, "admin role required")


def enforce_csrf(request: HttpRequest) -> None:
    """Session-authenticated mutations carry the CSRF token (as DRF's SessionAuthentication)."""

    def dummy_get_response(_: HttpRequest) -> None:  # pragma: no cover - never called
        return None

    check = CSRFCheck(dummy_get_response)  # type: ignore[arg-type]
    check.process_request(request)
    reason = check.process_view(request, None, (), {})  # type: ignore[arg-type]
    if reason:
        raise ServiceError(403, "CSRF check failed")
