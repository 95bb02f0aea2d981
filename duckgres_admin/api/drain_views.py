"""Store drains (docs/drains.md, docs/api.md "Store drains"): thin views over
``reshard.control.drains``.

``POST /metadata-stores/<name>/drain`` creates the plan; nothing is launched by the request: the
janitor's leader launches the children. Viewers read; writes need the admin role (or the
internal secret) and are audited, as every operator write."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from duckgres_admin.api import validation as v
from duckgres_admin.api.base import ApiView, BoundedJSONParser
from duckgres_admin.api.common import BODY_ERRORS, OBJ, READ_ERRORS
from duckgres_admin.api.serializers import rfc3339
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import StoreDrain
from reshard.control import drains

DRAIN_FIELDS = ("target_stores", "max_concurrent", "drain_timeout_seconds")


def _targets(body: dict[str, Any]) -> list[str]:
    raw = body.get("target_stores")
    if not isinstance(raw, list) or not raw:
        raise v.body_error("target_stores", "must be a non-empty list of cnpg store names")
    if not all(isinstance(name, str) and name for name in raw):
        raise v.body_error("target_stores", "every entry must be a store name (a string)")
    return [str(name) for name in raw]


def drain_json(drain: StoreDrain, *, with_items: bool = True) -> dict[str, Any]:
    """``reshard.control.drains.drain_view`` with its times in RFC 3339 (``Z``), as every API
    time."""
    body = drains.drain_view(drain, with_items=with_items)
    return {
        **body,
        "created_at": rfc3339(drain.created_at),
        "finished_at": rfc3339(drain.finished_at),
    }


class StoreDrainsView(ApiView):
    """``GET /metadata-stores/<name>/drains``: the store's drains, newest first."""

    @extend_schema(operation_id="store_drain_list", responses={200: OBJ, 404: OBJ, **READ_ERRORS})
    def get(self, request: Request, name: str) -> Response:
        found = drains.drains_of_store(name)
        return Response({"drains": [drain_json(d, with_items=False) for d in found]})


class StoreDrainCreateView(ApiView):
    """``POST /metadata-stores/<name>/drain``: the plan (the janitor launches its children)."""

    audit_action = "metadata_store.drain"
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]

    @extend_schema(
        operation_id="store_drain_create",
        request=OBJ,
        responses={201: OBJ, **BODY_ERRORS},
        description=(
            "Drain a cnpg metadata store: one reshard per warehouse bound to it, launched by the "
            "janitor's leader at most `max_concurrent` (1-16, default 1) at a time, to "
            "`target_stores` (one store, or several: each child goes to the one with the fewest "
            "warehouses)."
        ),
    )
    def post(self, request: Request, name: str) -> Response:
        body = v.as_object(request.data)
        v.reject_unknown(body, DRAIN_FIELDS)
        targets = _targets(body)
        concurrent = v.integer(body, "max_concurrent", default=1, minimum=1, maximum=16) or 1
        timeout = (
            v.integer(body, "drain_timeout_seconds", default=1800, minimum=1, maximum=86400) or 1800
        )
        assert self.identity is not None
        drain = drains.create_drain(
            name,
            target_stores=targets,
            max_concurrent=concurrent,
            drain_timeout_seconds=timeout,
            actor=self.identity.actor,
        )
        self.audit_detail = (
            f"drain {drain.id} of store {name} to {', '.join(targets)}, at most {concurrent} "
            "at a time"
        )
        return Response(drain_json(drain), status=201)


class DrainDetailView(ApiView):
    @extend_schema(operation_id="store_drain_get", responses={200: OBJ, 404: OBJ, **READ_ERRORS})
    def get(self, request: Request, drain_id: int) -> Response:
        return Response(drain_json(drains.get_drain(drain_id)))


class DrainActionView(ApiView):
    """``POST /drains/<id>/{pause,resume,cancel}``."""

    action: ClassVar[str] = ""

    def audit_action_for(self, request: Any) -> str:
        return f"metadata_store.drain_{self.action}"

    @extend_schema(request=None, responses={200: OBJ, **BODY_ERRORS})
    def post(self, request: Request, drain_id: int) -> Response:
        assert self.identity is not None
        if not self.action:
            raise ServiceError(404, "not found")
        drain = drains.change_drain(drain_id, self.action, actor=self.identity.actor)
        self.audit_detail = f"drain {drain_id} of store {drain.store_id}: {self.action}"
        return Response(drain_json(drain))


class DrainPauseView(DrainActionView):
    action = "pause"


class DrainResumeView(DrainActionView):
    action = "resume"


class DrainCancelView(DrainActionView):
    """``POST /drains/<id>/cancel``: the drain (now ``cancelling``) and ``cancel``: what the
    cancel's own transaction did (``reshard.control.drains.cancel_drain``)."""

    action = "cancel"

    @extend_schema(request=None, responses={200: OBJ, **BODY_ERRORS})
    def post(self, request: Request, drain_id: int) -> Response:
        assert self.identity is not None
        done = drains.cancel_drain(drain_id, actor=self.identity.actor)
        asked = ", ".join(str(c.operation_id) for c in done.asked) or "none"
        late = ", ".join(str(c.operation_id) for c in done.past_point_of_no_return) or "none"
        self.audit_detail = (
            f"drain {drain_id} of store {done.drain.store_id}: cancel; asked op(s) {asked}; "
            f"past their point of no return: op(s) {late}"
        )
        return Response({**drain_json(done.drain), "cancel": done.as_json()})
