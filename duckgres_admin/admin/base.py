"""What every admin screen shares: the read-only base class (any active staff user reads;
nobody adds, edits or deletes through a model form) and the detail page's 403-or-404.

The admin (``duckgres_admin.admin``, docs/admin.md) is split by resource: ``operations``
(reshards and restores: start, detail, cancel, the recover dry run), ``warehouses`` (list, backups,
restore), ``stores`` (metadata stores and their drains), ``trino`` and ``access`` (leases,
operators, audit, personal tokens).
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import (
    HttpRequest,
)
from django.shortcuts import get_object_or_404

from duckgres_admin.adminui import roles

_Row = TypeVar("_Row", bound=models.Model)


def readable_or_404(request: HttpRequest, model: type[_Row], pk: int) -> _Row:
    """The row of a detail page: 403 unless the user may read, 404 when it does not exist."""
    if not roles.can_read(request):
        raise PermissionDenied
    return get_object_or_404(model, pk=pk)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Any active staff user reads; nobody adds, edits or deletes through a model form."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return roles.can_read(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return roles.can_read(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
