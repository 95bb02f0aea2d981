"""The warehouse screens: the list and detail, its backups (with the restore test on demand) and
the restore of one of them (dry-run plan first).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from duckgres_admin.admin.base import ReadOnlyAdmin
from duckgres_admin.adminui import roles, trino_actions
from duckgres_admin.adminui.roles import audit as _audit
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    MetadataStore,
    Warehouse,
)
from reshard.backups import inventory, requests
from reshard.kinds.checks import StartRequest, TargetRequest
from reshard.start import restores


class RestoreForm(forms.Form):
    """A restore's start body (docs/restore.md): the backup key and the cnpg store to restore
    onto; the services check everything past the shape."""

    backup_key = forms.CharField(max_length=1024, label="Backup key")
    cnpg_shard = forms.CharField(max_length=63, label="Restore onto cnpg store")
    drain_timeout_seconds = forms.IntegerField(initial=1800, min_value=1, max_value=86400)

    def start_request(self) -> StartRequest:
        data = self.cleaned_data
        return StartRequest(
            target=TargetRequest(type="cnpg", cnpg_shard=data["cnpg_shard"].strip()),
            drain_timeout_seconds=data["drain_timeout_seconds"] or 1800,
        )


@admin.register(Warehouse)
class WarehouseAdmin(ReadOnlyAdmin):
    """Read-only: binding, compaction and state change through the API (its resharding guard)."""

    list_display = (
        "org_id",
        "state",
        "writable_flag",
        "binding",
        "password_reference",
        "compaction_enabled",
        "max_connection_leases",
        "status_message",
        "reshard_link",
        "backups_link",
    )
    list_filter = ("state", "metadata_store_kind", "compaction_enabled")
    search_fields = ("org_id", "database_name", "metadata_store_host")
    exclude = ()

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        """Trino placement actions (admins only, when Trino is wired): the API's services."""
        found: dict[str, Any] = dict(super().get_actions(request))
        found.update(trino_actions.actions(request))
        return found

    @admin.display(description="writable", boolean=True)
    def writable_flag(self, w: Warehouse) -> bool:
        return w.writable

    @admin.display(description="binding")
    def binding(self, w: Warehouse) -> str:
        if w.metadata_store_kind == "cnpg":
            where = f"cnpg {w.metadata_store_id}"
        elif w.metadata_store_kind == "external":
            where = f"external {w.metadata_store_host}:{w.metadata_store_port}"
        else:
            return "— (identity incomplete)"
        return f"{where} db {w.metadata_store_database} user {w.metadata_store_user}"

    @admin.display(description="password reference")
    def password_reference(self, w: Warehouse) -> str:
        return w.metadata_store_password_ref or "—"

    @admin.display(description="")
    def reshard_link(self, w: Warehouse) -> str:
        url = reverse("admin:duckgres_reshard_start") + f"?org={w.org_id}"
        return format_html('<a href="{}">reshard…</a>', url)

    @admin.display(description="")
    def backups_link(self, w: Warehouse) -> str:
        url = reverse("admin:duckgres_warehouse_backups", args=[w.org_id])
        return format_html('<a href="{}">backups</a>', url)

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<str:org>/backups/",
                self.admin_site.admin_view(self.backups_view),
                name="duckgres_warehouse_backups",
            ),
            path(
                "<str:org>/restore/",
                self.admin_site.admin_view(self.restore_view),
                name="duckgres_warehouse_restore",
            ),
            path(
                "<str:org>/backups/restore-test/",
                self.admin_site.admin_view(self.restore_test_view),
                name="duckgres_warehouse_restore_test",
            ),
        ]
        return own + super().get_urls()

    def backups_view(self, request: HttpRequest, org: str) -> HttpResponse:
        """The warehouse's backups with the retention plan: the API's listing, read-only."""
        if not roles.can_read(request):
            raise PermissionDenied
        listing: dict[str, Any] | None = None
        error = ""
        try:
            listing = inventory.backups_for_org(org, with_plan=True)
        except ServiceError as exc:
            error = exc.message
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Backups of {org}",
            "org": org,
            "listing": listing,
            "error": error,
            "can_act": roles.can_act(request),
        }
        return TemplateResponse(request, "admin/duckgres_admin/warehouse/backups.html", context)

    def restore_test_view(self, request: HttpRequest, org: str) -> HttpResponse:
        """Queue a restore test of one backup (``key``; empty: the newest) — the API's service
        (docs/backup.md "On demand"), audited ``backup.restore_test``; back to the backups."""
        roles.require_act(request)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        key = request.POST.get("key", "").strip()[:1024]
        try:
            queued = requests.queue_restore_test(
                org_id=org, key=key, actor=roles.user_email(request.user)
            )
        except ServiceError as exc:
            _audit(request, "backup.restore_test", org, exc.status, exc.message)
            messages.error(request, f"restore test not queued ({exc.status}): {exc.message}")
        else:
            _audit(request, "backup.restore_test", org, 202, queued.description)
            messages.success(
                request,
                f"{queued.description}; the result shows here (verified) once the default "
                "worker ran it",
            )
        return HttpResponseRedirect(reverse("admin:duckgres_warehouse_backups", args=[org]))

    def restore_view(self, request: HttpRequest, org: str) -> HttpResponse:
        """Restore one of the org's backups: plan (the dry run), then confirm (docs/restore.md)."""
        roles.require_act(request)
        if request.method != "POST":
            form = RestoreForm(initial={"backup_key": request.GET.get("key", "")})
            return self._restore_page(request, org, form)
        form = RestoreForm(request.POST)
        if not form.is_valid():
            return self._restore_page(request, org, form)
        key, start = form.cleaned_data["backup_key"].strip(), form.start_request()
        if request.POST.get("stage", "") == "start":
            try:
                outcome = restores.restore_start(
                    org_id=org, key=key, request=start, actor=roles.user_email(request.user)
                )
            except ServiceError as exc:
                _audit(request, "restore.create", org, exc.status, exc.message)
                form.add_error(None, f"restore refused ({exc.status}): {exc.message}")
                return self._restore_page(request, org, form)
            _audit(request, "restore.create", org, 202, outcome.description)
            messages.success(request, f"restore operation {outcome.op.id} started")
            return HttpResponseRedirect(
                reverse("admin:duckgres_admin_reshardoperation_change", args=[outcome.op.id])
            )
        try:
            plan = restores.restore_dry_run(org, key, start)
        except ServiceError as exc:
            _audit(request, "restore.dry_run", org, exc.status, exc.message)
            form.add_error(None, f"dry run refused ({exc.status}): {exc.message}")
            return self._restore_page(request, org, form)
        passed = sum(1 for entry in plan["preflight"] if entry.get("ok"))
        _audit(
            request, "restore.dry_run", org, 200,
            f"restore of {key}: {passed}/{len(plan['preflight'])} preflight checks passed",
        )  # fmt: skip
        return self._restore_page(request, org, form, plan=plan)

    def _restore_page(
        self, request: HttpRequest, org: str, form: RestoreForm, plan: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Restore a backup of {org}",
            "org": org,
            "form": form,
            "plan": plan,
            "all_ok": bool(plan) and all(e.get("ok") for e in plan["preflight"]) if plan else False,
            "stores": list(
                MetadataStore.objects.filter(kind="cnpg")
                .order_by("name")
                .values_list("name", flat=True)[:500]
            ),
        }
        return TemplateResponse(request, "admin/duckgres_admin/warehouse/restore.html", context)
