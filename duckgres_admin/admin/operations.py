"""The reshard operation screens: the start (dry-run plan first, then the start), the operation's
detail with its progress, cancel and the reshard_recover dry run; its log lines and step
timings.
"""

from __future__ import annotations

import io
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from duckgres_admin.admin.base import ReadOnlyAdmin, readable_or_404
from duckgres_admin.adminui import roles
from duckgres_admin.adminui.progress import status_json, summary_rows
from duckgres_admin.adminui.roles import audit as _audit
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import (
    EXTERNAL_SSLMODES,
    TERMINAL_STATES,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
    Warehouse,
)
from reshard.kinds import RESHARD
from reshard.kinds.checks import StartRequest, TargetRequest
from reshard.start import dryrun, operations
from reshard.warehouses import selectors


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
