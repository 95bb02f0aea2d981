"""Identities and roles of the API (spec reshard §5).

Three shared secrets, each with its own header and each accepted only on its routes; a secret
presented on another route is 403 and never falls through to another identity. Staff users
authenticate with a Django session; their role comes from ``duckgres_operators`` (no row →
viewer, disabled → 403). Every secret comparison uses ``hmac.compare_digest``.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest
from rest_framework.authentication import CSRFCheck

from duckgres_admin.models import Operator, OperatorRole
from reshard.services import ServiceError

INTERNAL_HEADER = "X-Duckgres-Internal-Secret"
RUNNER_HEADER = "X-Duckgres-Runner-Secret"
DATAPLANE_HEADER = "X-Duckgres-Dataplane-Secret"
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Scope(enum.Enum):
    """Which identities a route accepts."""

    OPERATOR = "operator"  # staff users and the internal secret
    RUNNER = "runner"  # the runner secret only (password route)
    DATAPLANE = "dataplane"  # the data-plane secret only (lease routes)


class Kind(enum.Enum):
    STAFF = "staff"
    INTERNAL = "internal"
    RUNNER = "runner"
    DATAPLANE = "dataplane"


@dataclass(frozen=True)
class Identity:
    kind: Kind
    actor: str  # email, or the identity's label
    role: str  # viewer | admin ('' for runner and data plane)
    source: str  # audit source: django | internal-secret | runner-secret | dataplane-secret

    @property
    def label(self) -> str:
        return self.actor


INTERNAL_ACTOR = "internal-secret"
_SCOPE_REFUSAL = {
    Scope.RUNNER: "runner secret required",
    Scope.DATAPLANE: "data-plane secret required",
    Scope.OPERATOR: "this secret is not accepted on this route",
}


def _header(request: HttpRequest, name: str) -> str | None:
    value = request.headers.get(name)
    return value if value else None


def _matches(presented: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())


def _staff_identity(request: HttpRequest) -> Identity | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    email = (getattr(user, "email", "") or user.get_username()).strip().lower()
    if not user.is_staff:
        raise ServiceError(403, "staff user required")
    operator = Operator.objects.filter(email=email).first()
    if operator is not None and operator.disabled:
        raise ServiceError(403, "operator disabled")
    role = operator.role if operator is not None else OperatorRole.VIEWER.value
    return Identity(Kind.STAFF, email, str(role), "django")


def describe_caller(request: HttpRequest) -> str:
    """Who is calling, for op-log lines of refused password requests (never a secret)."""
    if _header(request, INTERNAL_HEADER):
        return "the internal secret"
    if _header(request, DATAPLANE_HEADER):
        return "the data-plane secret"
    if _header(request, RUNNER_HEADER):
        return "a runner secret"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"staff user {(getattr(user, 'email', '') or user.get_username())}"
    return "an unauthenticated caller"


def authenticate(request: HttpRequest, scope: Scope) -> Identity:
    """The caller's identity on a route of ``scope``; raises ``ServiceError`` 401/403."""
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
    # A secret that this route does not accept is refused outright, even with a valid session.
    for kind, value in presented.items():
        if value is not None and kind is not accepted:
            raise ServiceError(403, refusal)
    value = presented[accepted]
    if value is not None:
        expected = {
            Kind.INTERNAL: settings.DUCKGRES_INTERNAL_SECRET,
            Kind.RUNNER: settings.DUCKGRES_RUNNER_SECRET,
            Kind.DATAPLANE: settings.DUCKGRES_DATAPLANE_SECRET,
        }[accepted]
        if not _matches(value, str(expected)):
            raise ServiceError(401, "invalid credentials")
        if accepted is Kind.INTERNAL:
            return Identity(Kind.INTERNAL, INTERNAL_ACTOR, OperatorRole.ADMIN.value, INTERNAL_ACTOR)
        label = "runner-secret" if accepted is Kind.RUNNER else "dataplane-secret"
        return Identity(accepted, label, "", label)
    staff = _staff_identity(request)
    if staff is None:
        raise ServiceError(401, "authentication required")
    if scope is not Scope.OPERATOR:
        raise ServiceError(403, refusal)
    return staff


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
