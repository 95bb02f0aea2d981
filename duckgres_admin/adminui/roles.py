"""Who may read and who may act in the admin (spec reshard §2.10, §5).

Any active staff user reads (a staff user without an operator row is a viewer). Acting — start,
cancel, the recovery dry run — needs the operator role ``admin`` or a Django superuser. A
``disabled`` operator row refuses both, as the API does. Every admin view and action checks
these functions on the server; hiding a button is only a convenience.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import AuditRecord, Operator, OperatorRole

ADMIN_REQUIRED = "admin role required"


def user_email(user: Any) -> str:
    return str(getattr(user, "email", "") or user.get_username()).strip().lower()


def _operator(user: Any) -> Operator | None:
    if hasattr(user, "_duckgres_operator"):
        cached: Operator | None = user._duckgres_operator
        return cached
    row = Operator.objects.filter(email=user_email(user)).first()
    user._duckgres_operator = row
    return row


def can_read(request: HttpRequest) -> bool:
    user = request.user
    if not (user.is_active and user.is_staff):
        return False
    row = _operator(user)
    return not (row is not None and row.disabled)


def can_act(request: HttpRequest) -> bool:
    if not can_read(request):
        return False
    user = request.user
    if user.is_superuser:
        return True
    row = _operator(user)
    return row is not None and row.role == OperatorRole.ADMIN


def role_label(request: HttpRequest) -> str:
    return "admin" if can_act(request) else "viewer"


def require_act(request: HttpRequest) -> None:
    if not can_act(request):
        raise PermissionDenied(ADMIN_REQUIRED)


def audit(request: HttpRequest, action: str, org_id: str, status: int, detail: str) -> None:
    """One audit row per admin action, as the API writes for its mutating requests (§2.11)."""
    AuditRecord.objects.create(
        actor=user_email(request.user),
        role=role_label(request),
        source="django",
        method="POST",
        path=request.path[:2000],
        org_id=org_id,
        status=status,
        client_ip=str(request.META.get("REMOTE_ADDR", "")),
        action=action,
        detail=process_scrubber().scrub(detail)[:4000],
    )
