"""Django admin: the operator screens (issue 6 item 1; docs/admin.md).

Everything is read-only through the admin's own forms: the control-plane rows are written by
the API services, the runner and the janitor (guarded CAS updates), never by a model form.
Operators act through the three reshard screens here — start (dry-run plan first), cancel and
the ``reshard_recover`` dry run — and a store drain's pause / resume / cancel buttons, which call
the same services as the API and are refused on the server unless the user may act
(``adminui.roles``). Secrets exist only as references
(``*_ref`` columns); no password column exists, so none can be rendered.
"""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any, TypeVar

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import models
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, re_path, reverse
from django.utils import timezone
from django.utils.html import format_html
from knox import admin as knox_admin
from knox.models import AuthToken

from duckgres_admin.adminui import roles, trino_actions
from duckgres_admin.adminui.progress import display_ts, status_json, summary_rows
from duckgres_admin.adminui.roles import audit as _audit
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import (
    ACTIVE_DRAIN_STATES,
    EXTERNAL_SSLMODES,
    TERMINAL_STATES,
    AuditRecord,
    ConnectionLease,
    Lease,
    MetadataStore,
    Operator,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
    StoreDrain,
    StoreDrainItem,
    TrinoPool,
    TrinoPoolInstance,
    Warehouse,
    WarehouseTrino,
)
from reshard import (
    backups,
    drains,
    dryrun,
    operations,
    restore_test_requests,
    restores,
    selectors,
)
from reshard.kinds import RESHARD
from reshard.start_checks import StartRequest, TargetRequest

_ts = display_ts

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


# --- reshard operations -------------------------------------------------------------------------


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


class StartForm(forms.Form):
    """The start body of spec §5.1 as a form; the services validate everything past the shape."""

    org_id = forms.CharField(max_length=200, label="Org")
    target_type = forms.ChoiceField(
        choices=[("cnpg", "cnpg (a registered shard)"), ("external", "external PostgreSQL")],
        label="Target type",
    )
    cnpg_shard = forms.CharField(max_length=63, required=False, label="Target cnpg shard")
    endpoint = forms.CharField(
        max_length=1024, required=False, label="External endpoint (host[:port])"
    )
    user = forms.CharField(max_length=1024, required=False)
    database = forms.CharField(max_length=1024, required=False)
    sslmode = forms.ChoiceField(
        choices=[("", "default (verify-full)"), *((m, m) for m in EXTERNAL_SSLMODES)],
        required=False,
    )
    password_secret_ref = forms.CharField(
        max_length=1024,
        required=False,
        label="Password secret reference",
        help_text="k8s:<namespace>/<secret>#<key> or env:<VARIABLE> — a reference, never a value",
    )
    password = forms.CharField(
        max_length=1024,
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="external targets only; checked against the reference and never stored",
    )
    drain_timeout_seconds = forms.IntegerField(initial=1800, max_value=86400)
    cutover_timeout_seconds = forms.IntegerField(initial=0, max_value=86400)

    def start_request(self, *, dry_run: bool) -> StartRequest:
        data = self.cleaned_data
        drain = data["drain_timeout_seconds"]
        return StartRequest(
            target=TargetRequest(
                type=data["target_type"],
                cnpg_shard=data["cnpg_shard"].strip(),
                endpoint=data["endpoint"].strip(),
                user=data["user"].strip(),
                database=data["database"].strip(),
                sslmode=data["sslmode"],
                password_secret_ref=data["password_secret_ref"].strip(),
                password=data["password"],
            ),
            drain_timeout_seconds=drain if drain and drain > 0 else 1800,
            cutover_timeout_seconds=max(data["cutover_timeout_seconds"] or 0, 0),
            dry_run=dry_run,
        )


@admin.register(ReshardOperation)
class ReshardOperationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "org_id",
        "state",
        "step",
        "kind",
        "direction_label",
        "source_label",
        "target_label",
        "cancel_requested",
        "recovery_required",
        "created_by",
        "created_at",
        "finished_at",
    )
    list_display_links = ("id", "org_id")
    list_filter = (
        "state",
        "kind",
        "source_kind",
        "target_kind",
        "recovery_required",
        "launcher",
    )
    search_fields = (
        "=id",
        "org_id",
        "from_shard",
        "to_shard",
        "target_endpoint",
        "source_endpoint",
        "created_by",
        "error",
    )
    ordering = ("-id",)
    list_per_page = 50
    change_list_template = "admin/duckgres_admin/reshardoperation/change_list.html"

    @admin.display(description="direction", ordering="target_kind")
    def direction_label(self, op: ReshardOperation) -> str:
        return f"{op.source_kind}→{op.target_kind}"

    @admin.display(description="source")
    def source_label(self, op: ReshardOperation) -> str:
        if op.source_kind == "cnpg":
            return op.from_shard
        return f"{op.source_endpoint}:{op.source_port}"

    @admin.display(description="target")
    def target_label(self, op: ReshardOperation) -> str:
        if op.target_kind == "cnpg":
            return op.to_shard
        return f"{op.target_endpoint}:{op.target_port}"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**(extra_context or {}), "can_act": roles.can_act(request)}
        return super().changelist_view(request, extra_context=context)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        own = [
            path("start/", wrap(self.start_view), name="duckgres_reshard_start"),
            path(
                "<int:op_id>/status.json",
                wrap(self.status_view),
                name="duckgres_reshard_status",
            ),
            path("<int:op_id>/cancel/", wrap(self.cancel_view), name="duckgres_reshard_cancel"),
            path("<int:op_id>/recover/", wrap(self.recover_view), name="duckgres_reshard_recover"),
        ]
        return own + super().get_urls()

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "can_act": roles.can_act(request),
            **extra,
        }

    def _op(self, request: HttpRequest, op_id: int) -> ReshardOperation:
        return readable_or_404(request, ReshardOperation, op_id)

    # The detail page: live log tail, progress and step timeline (polling, no reload).
    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not object_id.isdigit():
            return super().change_view(request, object_id, form_url, extra_context)
        op = self._op(request, int(object_id))
        rows = summary_rows(op)
        context = self._context(
            request,
            f"Reshard operation {op.id}",
            op=op,
            rows=rows,
            terminal=op.state in TERMINAL_STATES,
            status_url=reverse("admin:duckgres_reshard_status", args=[op.id]),
            log_url=reverse("reshard-log", args=[op.id]),
            cancel_url=reverse("admin:duckgres_reshard_cancel", args=[op.id]),
            recover_url=reverse("admin:duckgres_reshard_recover", args=[op.id]),
            original=op,
            **(extra_context or {}),
        )
        return TemplateResponse(
            request, "admin/duckgres_admin/reshardoperation/detail.html", context
        )

    def status_view(self, request: HttpRequest, op_id: int) -> JsonResponse:
        op = self._op(request, op_id)
        response = JsonResponse(status_json(op))
        response["Cache-Control"] = "no-store"
        return response

    def cancel_view(self, request: HttpRequest, op_id: int) -> HttpResponse:
        op = self._op(request, op_id)
        roles.require_act(request)
        detail_url = reverse("admin:duckgres_admin_reshardoperation_change", args=[op.id])
        if request.method == "POST":
            actor = roles.user_email(request.user)
            try:
                outcome = operations.reshard_op_cancel(op_id=op.id, actor=actor)
            except ServiceError as exc:
                _audit(request, "reshard.cancel", op.org_id, exc.status, exc.message)
                messages.error(request, f"cancel refused: {exc.message}")
                return HttpResponseRedirect(detail_url)
            detail = "cancelled before start" if outcome.status == 200 else "cancel requested"
            _audit(request, "reshard.cancel", op.org_id, outcome.status, detail)
            messages.success(request, f"operation {op.id}: {detail}")
            return HttpResponseRedirect(detail_url)
        return TemplateResponse(
            request,
            "admin/duckgres_admin/reshardoperation/confirm.html",
            self._context(
                request,
                f"Cancel reshard operation {op.id}?",
                op=op,
                question=(
                    f"Cancel operation {op.id} of org {op.org_id} (state {op.state}, step "
                    f"{op.step or '—'})? A pending operation is cancelled at once; a running "
                    "one rolls back at its next cancel check."
                ),
                confirm_label="Yes, cancel it",
                back_url=detail_url,
            ),
        )

    def recover_view(self, request: HttpRequest, op_id: int) -> HttpResponse:
        op = self._op(request, op_id)
        roles.require_act(request)
        detail_url = reverse("admin:duckgres_admin_reshardoperation_change", args=[op.id])
        if request.method != "POST":
            return TemplateResponse(
                request,
                "admin/duckgres_admin/reshardoperation/confirm.html",
                self._context(
                    request,
                    f"Recovery plan for operation {op.id}?",
                    op=op,
                    question=(
                        f"Run `manage.py reshard_recover {op.id}` without --execute? It reads "
                        "the durable progress and the live source fence and prints the plan; it "
                        "changes nothing."
                    ),
                    confirm_label="Show the recovery plan",
                    back_url=detail_url,
                ),
            )
        out = io.StringIO()
        error = ""
        try:
            call_command("reshard_recover", str(op.id), stdout=out)
        except CommandError as exc:
            error = process_scrubber().scrub(str(exc))
        return TemplateResponse(
            request,
            "admin/duckgres_admin/reshardoperation/recover.html",
            self._context(
                request,
                f"Recovery plan for operation {op.id} (dry run)",
                op=op,
                output=process_scrubber().scrub(out.getvalue()),
                error=error,
                back_url=detail_url,
            ),
        )

    def start_view(self, request: HttpRequest) -> HttpResponse:
        roles.require_act(request)
        stage = request.POST.get("stage", "") if request.method == "POST" else ""
        if request.method != "POST":
            form = StartForm(initial={"org_id": request.GET.get("org", "")})
            return self._start_page(request, form)
        form = StartForm(request.POST)
        if not form.is_valid():
            return self._start_page(request, form)
        org = form.cleaned_data["org_id"].strip()
        if stage == "start":
            actor = roles.user_email(request.user)
            try:
                outcome = operations.op_start(
                    RESHARD.start(), org_id=org, request=form.start_request(dry_run=False),
                    actor=actor,
                )  # fmt: skip
            except ServiceError as exc:
                _audit(request, "reshard.create", org, exc.status, exc.message)
                form.add_error(None, f"start refused ({exc.status}): {exc.message}")
                return self._start_page(request, form)
            _audit(request, "reshard.create", org, 202, f"reshard {outcome.description}")
            messages.success(request, f"reshard operation {outcome.op.id} started")
            return HttpResponseRedirect(
                reverse("admin:duckgres_admin_reshardoperation_change", args=[outcome.op.id])
            )
        # A dry run resolves references and connects to the stores it names: audited like the
        # API's (``reshard.dry_run``), refused or not.
        try:
            plan = dryrun.dry_run(org, form.start_request(dry_run=True))
        except ServiceError as exc:
            _audit(request, "reshard.dry_run", org, exc.status, exc.message)
            form.add_error(None, f"dry run refused ({exc.status}): {exc.message}")
            return self._start_page(request, form)
        passed = sum(1 for entry in plan.get("preflight", []) if entry.get("ok"))
        _audit(
            request, "reshard.dry_run", org, 200,
            f"dry run: {passed}/{len(plan.get('preflight', []))} preflight checks passed",
        )  # fmt: skip
        return self._start_page(request, form, plan=plan)

    def _start_page(
        self, request: HttpRequest, form: StartForm, plan: dict[str, Any] | None = None
    ) -> HttpResponse:
        try:
            targets = selectors.reshard_targets()
        except Exception:  # noqa: BLE001 - the datalist is a convenience only
            targets = {"shards": [], "external_stores": []}
        all_ok = (
            bool(plan) and all(entry.get("ok") for entry in plan["preflight"]) if plan else False
        )
        return TemplateResponse(
            request,
            "admin/duckgres_admin/reshardoperation/start.html",
            self._context(
                request,
                "Start a reshard",
                form=form,
                plan=plan,
                all_ok=all_ok,
                hidden_fields=[f for f in form if f.name != "password"],
                needs_password=bool(plan) and form.cleaned_data.get("target_type") == "external",
                shards=targets.get("shards", []),
                warehouses=list(
                    Warehouse.objects.order_by("org_id").values_list("org_id", flat=True)[:500]
                ),
            ),
        )


@admin.register(ReshardLogEntry)
class ReshardLogEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "operation_id", "ts", "level", "source", "runner_epoch", "message")
    list_filter = ("level", "source")
    search_fields = ("=operation_id", "message")
    ordering = ("-id",)


@admin.register(ReshardStepTiming)
class ReshardStepTimingAdmin(ReadOnlyAdmin):
    list_display = ("id", "operation_id", "step", "runner_epoch", "started_at", "ended_at",
                    "outcome")  # fmt: skip
    list_filter = ("step", "outcome")
    search_fields = ("=operation_id",)
    ordering = ("-id",)


# --- warehouses, stores, leases -----------------------------------------------------------------


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
            listing = backups.backups_for_org(org, with_plan=True)
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
            queued = restore_test_requests.queue_restore_test(
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


@admin.register(MetadataStore)
class MetadataStoreAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "kind",
        "host",
        "port",
        "sslmode",
        "tls_label",
        "pooler_host",
        "pooler_port",
        "provisioner_user",
        "provisioner_password_ref",
        "tenants",
        "drain_label",
    )
    list_filter = ("kind", "tls_policy")
    search_fields = ("name", "host")

    def get_queryset(self, request: HttpRequest) -> QuerySet[MetadataStore]:
        """Each store with its active drain (at most one: ``store_drain_one_active_per_store``),
        read by subqueries of the page's own query."""
        active = StoreDrain.objects.filter(
            store=OuterRef("pk"), state__in=ACTIVE_DRAIN_STATES
        ).order_by("-id")
        stores: QuerySet[MetadataStore] = super().get_queryset(request)
        return stores.annotate(
            active_drain_id=Subquery(active.values("id")[:1]),
            active_drain_state=Subquery(active.values("state")[:1]),
        )

    @admin.display(description="tenants")
    def tenants(self, store: MetadataStore) -> int:
        return Warehouse.objects.filter(metadata_store=store).count()

    @admin.display(description="TLS policy", ordering="tls_policy")
    def tls_label(self, store: MetadataStore) -> str:
        """``verify-full only``, or the explicit opt-in with its reason (safeguard reshard-122)."""
        if not store.allows_weaker_tls:
            return "verify-full only"
        return f"allow-weaker: {store.tls_policy_reason}"

    @admin.display(description="drain")
    def drain_label(self, store: MetadataStore) -> str:
        drain_id = getattr(store, "active_drain_id", None)
        if drain_id is None:
            return "—"
        url = reverse("admin:duckgres_admin_storedrain_change", args=[drain_id])
        state = getattr(store, "active_drain_state", "")
        return format_html('<a href="{}">drained by drain {} ({})</a>', url, drain_id, state)


# --- store drains -------------------------------------------------------------------------------

# The progress column: the service's counts (``reshard.drains.progress``) under operator labels;
# any other non-zero count (``cancelled``) follows, so the parts always add up to the items.
PROGRESS_LABELS = (
    ("done", "succeeded"),
    ("running", "running"),
    ("failed", "failed"),
    ("skipped", "skipped"),
    ("waiting", "waiting"),
)
DRAIN_ACTIONS = drains.ACTIONS


def progress_label(counts: dict[str, int]) -> str:
    """``done N / running N / failed N / skipped N / waiting N`` (+ ``cancelled N`` if any)."""
    shown = {key for _, key in PROGRESS_LABELS}
    parts = [f"{label} {counts.get(key, 0)}" for label, key in PROGRESS_LABELS]
    parts += [f"{key} {n}" for key, n in counts.items() if n and key not in shown]
    return " / ".join(parts)


def drain_actions(drain: StoreDrain) -> list[str]:
    """The transitions the drain's state allows (the service's own table; it re-checks by
    compare-and-set, so this only chooses the buttons)."""
    return drains.actions_allowed(drain.state)


@admin.register(StoreDrain)
class StoreDrainAdmin(ReadOnlyAdmin):
    """Drains (reshard/drains.py): read-only rows; pause, resume and cancel on the drain's page
    call ``reshard.drains.change_drain`` (admins only, audited)."""

    list_display = (
        "id",
        "store_name",
        "targets",
        "state",
        "max_concurrent",
        "progress",
        "created_by",
        "created_at",
        "finished_at",
        "summary",
    )
    list_filter = ("state",)
    search_fields = ("store__name",)
    ordering = ("-id",)
    list_per_page = 50

    def get_queryset(self, request: HttpRequest) -> QuerySet[StoreDrain]:
        # The progress column needs every item and its child operation: one query per page.
        items = StoreDrainItem.objects.select_related("operation").order_by("id")
        return super().get_queryset(request).prefetch_related(Prefetch("items", queryset=items))

    @admin.display(description="store", ordering="store")
    def store_name(self, drain: StoreDrain) -> str:
        return str(drain.store_id)

    @admin.display(description="targets")
    def targets(self, drain: StoreDrain) -> str:
        return ", ".join(str(name) for name in drain.target_stores)

    @admin.display(description="progress")
    def progress(self, drain: StoreDrain) -> str:
        return progress_label(drains.progress(list(drain.items.all())))

    def get_urls(self) -> list[URLPattern]:
        own = [
            re_path(
                rf"^(?P<drain_id>\d+)/(?P<action>{'|'.join(DRAIN_ACTIONS)})/$",
                self.admin_site.admin_view(self.action_view),
                name="duckgres_drain_action",
            ),
        ]
        return own + super().get_urls()

    def _drain(self, request: HttpRequest, drain_id: int) -> StoreDrain:
        return readable_or_404(request, StoreDrain, drain_id)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not object_id.isdigit():
            return super().change_view(request, object_id, form_url, extra_context)
        drain = self._drain(request, int(object_id))
        view = drains.drain_view(drain)
        op_url = "admin:duckgres_admin_reshardoperation_change"
        items = [
            {**item, "operation_url": reverse(op_url, args=[item["operation_id"]])}
            if item["operation_id"]
            else item
            for item in view["items"]
        ]
        rows = [
            ("store", drain.store_id),
            ("target stores", ", ".join(str(name) for name in drain.target_stores)),
            ("rule", drain.rule),
            ("at most at a time", drain.max_concurrent),
            ("drain timeout (s)", drain.drain_timeout_seconds),
            ("progress", progress_label(view["progress"])),
            ("created by", drain.created_by or "—"),
            ("created at", _ts(drain.created_at)),
            ("updated at", _ts(drain.updated_at)),
            ("finished at", _ts(drain.finished_at) if drain.finished_at else "—"),
            ("summary", drain.summary or "—"),
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Store drain {drain.id}",
            "drain": drain,
            "rows": rows,
            "items": items,
            "can_act": roles.can_act(request),
            "actions": [
                (action, reverse("admin:duckgres_drain_action", args=[drain.id, action]))
                for action in drain_actions(drain)
            ],
            "original": drain,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/duckgres_admin/storedrain/detail.html", context)

    def action_view(self, request: HttpRequest, drain_id: int, action: str) -> HttpResponse:
        """Pause, resume or cancel: POST only (CSRF-checked by ``admin_view``), admins only,
        one audit row like the API's ``metadata_store.drain_<action>``."""
        drain = self._drain(request, int(drain_id))
        roles.require_act(request)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        detail_url = reverse("admin:duckgres_admin_storedrain_change", args=[drain.id])
        audit_action = f"metadata_store.drain_{action}"
        try:
            drain = drains.change_drain(drain.id, action, actor=roles.user_email(request.user))
        except ServiceError as exc:
            _audit(request, audit_action, "", exc.status, exc.message)
            messages.error(request, f"{action} refused: {exc.message}")
            return HttpResponseRedirect(detail_url)
        what = f"drain {drain.id} of store {drain.store_id}"
        _audit(request, audit_action, "", 200, f"{what}: {action}")  # the API's detail
        messages.success(request, f"{what}: {action} accepted, now {drain.state}")
        return HttpResponseRedirect(detail_url)


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
        return _ts(lease.acquired_at)

    @admin.display(description="renewed at")
    def renewed(self, lease: Lease) -> str:
        return _ts(lease.renewed_at)

    @admin.display(description="expires at")
    def expires(self, lease: Lease) -> str:
        return _ts(lease.expires_at)


# --- Trino pools ---------------------------------------------------------------------------------


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


# --- operators and audit -------------------------------------------------------------------------


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


# --- personal API tokens (docs/api.md "Personal tokens") -----------------------------------------


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
