"""Trino placement from the warehouses list (issue: Trino part 1, item 8).

The admin acts through the same domain services as the API (``trino_pools.placement``), so it
gets the same validation and the same messages: enabling needs a ready warehouse under the
per-org lock, an owner is never overwritten, a move is a compare-and-swap. Only operators with
the admin role act; each org acted on writes one audit row (source ``django``) with the API's
action names. Actions exist only when Trino is wired in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from duckgres_admin.adminui import roles
from duckgres_admin.models import Warehouse
from trino_pools import config, placement
from trino_pools.config import TrinoSettings
from trino_pools.placement import PlacementError

ActionFn = Callable[[Any, HttpRequest, QuerySet[Warehouse]], None]


def _apply(
    admin: Any,
    request: HttpRequest,
    queryset: QuerySet[Warehouse],
    action: str,
    describe: str,
    change: Callable[[str, TrinoSettings], object],
) -> None:
    roles.require_act(request)
    settings = config.current()
    done: list[str] = []
    for org_id in queryset.values_list("org_id", flat=True).order_by("org_id"):
        try:
            with transaction.atomic():
                change(org_id, settings)
        except PlacementError as exc:
            roles.audit(request, action, org_id, exc.status, f"{describe}: refused: {exc.message}")
            admin.message_user(request, f"{org_id}: {exc.message}", messages.ERROR)
            continue
        roles.audit(request, action, org_id, 200, describe)
        done.append(org_id)
    if done:
        admin.message_user(request, f"{describe}: {', '.join(done)}", messages.SUCCESS)


def _enable(admin: Any, request: HttpRequest, queryset: QuerySet[Warehouse]) -> None:
    _apply(
        admin,
        request,
        queryset,
        "trino.enable",
        "Trino enabled",
        lambda org, s: placement.enable_trino(org, s),
    )


def _disable(admin: Any, request: HttpRequest, queryset: QuerySet[Warehouse]) -> None:
    _apply(
        admin,
        request,
        queryset,
        "trino.disable",
        "Trino disabled (owner kept)",
        lambda org, s: placement.disable_trino(org),
    )


def _select(cell: str) -> ActionFn:
    def run(admin: Any, request: HttpRequest, queryset: QuerySet[Warehouse]) -> None:
        _apply(
            admin,
            request,
            queryset,
            "trino.cell_select",
            f"Trino cell {cell} selected",
            lambda org, s: placement.select_cell(org, cell, s),
        )

    return run


def _move(cell: str) -> ActionFn:
    def run(admin: Any, request: HttpRequest, queryset: QuerySet[Warehouse]) -> None:
        def change(org: str, s: TrinoSettings) -> object:
            current = placement.describe(org, s)["cell"].get("id", "")
            if not current:
                raise PlacementError(409, "the warehouse has no Trino cell: select one first")
            return placement.move_cell(org, str(current), cell, s)

        _apply(admin, request, queryset, "trino.cell_move", f"Trino moved to {cell}", change)

    return run


def actions(request: HttpRequest) -> dict[str, tuple[ActionFn, str, str]]:
    """The Trino actions for this request: none unless Trino is wired and the user can act."""
    settings = config.current()
    if not settings.wired or not roles.can_act(request):
        return {}
    found: dict[str, tuple[ActionFn, str, str]] = {
        "trino_enable": (_enable, "trino_enable", "Trino: enable (default placement)"),
        "trino_disable": (_disable, "trino_disable", "Trino: disable (keeps the owner)"),
    }
    for cell in settings.cells:
        found[f"trino_select_{cell.id}"] = (
            _select(cell.id),
            f"trino_select_{cell.id}",
            f"Trino: select cell {cell.id} (before first enable)",
        )
        found[f"trino_move_{cell.id}"] = (
            _move(cell.id),
            f"trino_move_{cell.id}",
            f"Trino: move to cell {cell.id} (maintenance)",
        )
    return found
