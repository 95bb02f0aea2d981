"""The metadata stores and their drains: the store list and detail, a drain's plan, progress and
its pause, resume and cancel buttons.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, re_path, reverse
from django.utils.html import format_html

from duckgres_admin.admin.base import ReadOnlyAdmin, readable_or_404
from duckgres_admin.adminui import roles
from duckgres_admin.adminui.progress import display_ts
from duckgres_admin.adminui.roles import audit as _audit
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    ACTIVE_DRAIN_STATES,
    MetadataStore,
    StoreDrain,
    StoreDrainItem,
    Warehouse,
)
from reshard.control import drains


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


# The progress column: the service's counts (``reshard.control.drains.progress``) under operator
# labels; any other non-zero count (``cancelled``) follows, so the parts always add up to the items.
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
    """Drains (reshard/control/drains.py): read-only rows; pause, resume and cancel on the drain's
    page call ``reshard.control.drains.change_drain`` (admins only, audited)."""

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
            ("created at", display_ts(drain.created_at)),
            ("updated at", display_ts(drain.updated_at)),
            ("finished at", display_ts(drain.finished_at) if drain.finished_at else "—"),
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
