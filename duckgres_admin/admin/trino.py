"""The Trino shared pools, read only: pools, their instances and the warehouses' Trino rows."""

from __future__ import annotations

from django.contrib import admin

from duckgres_admin.admin.base import ReadOnlyAdmin
from duckgres_admin.models import (
    TrinoPool,
    TrinoPoolInstance,
    WarehouseTrino,
)


@admin.register(TrinoPool)
class TrinoPoolAdmin(ReadOnlyAdmin):
    list_display = ("pool_id", "public_id", "api_mode", "desired_instances", "min_serving",
                    "desired_generation", "authority_epoch", "authority_owner",
                    "publication_revision", "admitted_revision", "frozen",
                    "updated_at")  # fmt: skip
    list_filter = ("api_mode", "frozen")


@admin.register(TrinoPoolInstance)
class TrinoPoolInstanceAdmin(ReadOnlyAdmin):
    list_display = ("instance_id", "pool", "phase", "phase_changed_at", "release_id",
                    "owner_epoch", "repair", "endpoint_url", "gateway_state",
                    "last_error")  # fmt: skip
    list_filter = ("phase", "pool", "repair")
    search_fields = ("instance_id", "endpoint_url")


@admin.register(WarehouseTrino)
class WarehouseTrinoAdmin(ReadOnlyAdmin):
    list_display = ("warehouse", "enabled", "tier", "state", "trino_cell_id", "backend",
                    "status_message", "updated_at")  # fmt: skip
    list_filter = ("enabled", "state", "tier")
