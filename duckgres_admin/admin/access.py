"""Who may do what, and what they did: connection leases and leadership leases (read only),
operators and their roles, the audit records, and personal API tokens (knox's admin with the
product's form).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.widgets import AdminSplitDateTime
from django.http import (
    HttpRequest,
)
from django.utils import timezone
from knox import admin as knox_admin
from knox.models import AuthToken

from duckgres_admin.admin.base import ReadOnlyAdmin
from duckgres_admin.adminui import roles
from duckgres_admin.adminui.progress import display_ts
from duckgres_admin.models import (
    AuditRecord,
    ConnectionLease,
    Lease,
    Operator,
)


@admin.register(ConnectionLease)
class ConnectionLeaseAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "holder", "purpose", "state", "requested_at", "granted_at",
                    "expires_at", "released_at")  # fmt: skip
    list_filter = ("state", "purpose")
    search_fields = ("org_id", "holder")
    ordering = ("-id",)


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    """Leader leases (janitor, trino): written only by the lease protocol on the DB clock."""

    list_display = ("name", "holder", "epoch", "acquired", "renewed", "expires")

    @admin.display(description="acquired at")
    def acquired(self, lease: Lease) -> str:
        return display_ts(lease.acquired_at)

    @admin.display(description="renewed at")
    def renewed(self, lease: Lease) -> str:
        return display_ts(lease.renewed_at)

    @admin.display(description="expires at")
    def expires(self, lease: Lease) -> str:
        return display_ts(lease.expires_at)


@admin.register(Operator)
class OperatorAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Roles are managed by superusers (Django model permissions); staff viewers read them."""

    list_display = ("email", "role", "disabled", "created_at")
    list_filter = ("role", "disabled")
    search_fields = ("email",)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return roles.can_read(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return roles.can_read(request)


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnlyAdmin):
    list_display = ("id", "at", "actor", "role", "source", "method", "path", "org_id", "status",
                    "action", "detail")  # fmt: skip
    list_filter = ("action", "source", "status")
    search_fields = ("actor", "org_id", "path", "detail")
    ordering = ("-id",)


class PersonalTokenForm(knox_admin.AuthTokenCreateForm):  # type: ignore[misc]
    """knox's add form with a required expiry (a token that never expires is not offered)."""

    expiry = forms.SplitDateTimeField(
        required=True,
        widget=AdminSplitDateTime,
        help_text="UTC; the token is refused from then on (401).",
    )


class PersonalTokenAdmin(knox_admin.AuthTokenAdmin):  # type: ignore[misc]
    """Created here (the token is shown once, in the message after saving; only its digest is
    stored) and revoked by deleting the row. Django model permissions decide who may: by
    default superusers only, since a token acts as the user it is made for."""

    add_form = PersonalTokenForm
    list_display = ("token_key", "user", "created", "expiry")

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        days = int(settings.DUCKGRES_API_TOKEN_TTL_DAYS)
        return {"expiry": timezone.now() + timedelta(days=days)}


admin.site.unregister(AuthToken)
admin.site.register(AuthToken, PersonalTokenAdmin)
