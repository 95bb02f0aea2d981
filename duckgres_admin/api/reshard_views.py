"""The operation routes: the reshard start and the restore start (each with its dry run), the
operation list, targets, detail, log, cancel and the one-time password pull.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from duckgres_admin.api import validation as v
from duckgres_admin.api.auth import AuthRefusal, Scope, describe_caller
from duckgres_admin.api.base import ApiView, BoundedJSONParser
from duckgres_admin.api.common import (
    BODY_ERRORS,
    LIMIT_PARAM,
    OBJ,
    READ_ERRORS,
    bearer_credential,
    page_limit,
    page_of,
)
from duckgres_admin.api.serializers import log_entry_json, op_json
from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    ReshardLogEntry,
    ReshardOperation,
)
from reshard.kinds import RESHARD
from reshard.kinds.checks import StartRequest, TargetRequest
from reshard.start import dryrun, operations, restores
from reshard.warehouses import selectors

START_FIELDS = ("target", "drain_timeout_seconds", "cutover_timeout_seconds", "dry_run")
RESHARD_FIELDS = (*START_FIELDS, "copy_mode")  # a restore has no online mode
RESTORE_FIELDS = ("backup_key", *START_FIELDS)


def _parse_start(data: Any, fields: tuple[str, ...] = RESHARD_FIELDS) -> StartRequest:
    body = v.as_object(data)
    v.reject_unknown(body, fields)
    if "target" not in body:
        raise v.body_error("target", "required")
    target = v.as_object(body["target"], "target")
    keys = (
        "type",
        "cnpg_shard",
        "endpoint",
        "user",
        "database",
        "sslmode",
        "password_secret_ref",
        "password",
    )
    v.reject_unknown(target, keys, "target")
    parsed = {k: v.string(target, k, "target", max_length=1024) for k in keys}
    if not parsed["type"]:
        raise v.body_error("target.type", "required")
    drain = v.integer(body, "drain_timeout_seconds", default=1800, maximum=86400)
    cutover = v.integer(body, "cutover_timeout_seconds", default=0, maximum=86400)
    dry_run = v.boolean(body, "dry_run", default=False)
    copy_mode = v.string(body, "copy_mode", max_length=16)
    if copy_mode not in ("", "online", "offline"):
        raise v.body_error("copy_mode", 'must be "online" or "offline" (or left out)')
    return StartRequest(
        target=TargetRequest(**parsed),
        drain_timeout_seconds=drain if drain is not None and drain > 0 else 1800,
        cutover_timeout_seconds=max(cutover or 0, 0),
        dry_run=bool(dry_run),
        copy_mode=copy_mode,
    )


class _StartView(ApiView):
    """A start that takes ``"dry_run": true``: a dry run is audited as ``dry_run_action``
    (refused ones too, even before the view ran: a NUL or a size refusal of a body that asked
    for one)."""

    accepts_dry_run = True
    parser_classes: ClassVar[list[Any]] = [BoundedJSONParser]  # type: ignore[misc]
    dry_run = False
    dry_run_action: ClassVar[str] = ""

    def audit_action_for(self, request: HttpRequest) -> str:
        body = self.parsed_body
        asked = isinstance(body, dict) and body.get("dry_run") is True
        return self.dry_run_action if self.dry_run or asked else self.audit_action

    def note_dry_run(self, data: Any) -> None:
        if isinstance(data, dict) and data.get("dry_run") is True:
            self.dry_run = True  # audited as a dry run, even when refused


class ReshardStartView(_StartView):
    audit_action = "reshard.create"
    dry_run_action = "reshard.dry_run"

    @extend_schema(
        operation_id="reshard_start",
        request=OBJ,
        responses={200: OBJ, 202: OBJ, 500: OBJ, 502: OBJ, 503: OBJ, **BODY_ERRORS},
        description=(
            "Start a reshard (spec §5.1). Internal secret or staff admin. With "
            '`"dry_run": true` the answer is 200 with the plan and every preflight result, '
            "and nothing is created."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        from reshard.start import stash

        data = request.data
        self.note_dry_run(data)
        try:
            start = _parse_start(data)
        except ServiceError:
            stash.prune()
            raise
        if start.dry_run:
            # Creates nothing (spec §5.1) but is audited: it resolves secrets and contacts the
            # stores on the caller's behalf. 404 for a missing warehouse.
            self.dry_run = True
            plan = dryrun.dry_run(org, start)
            self.audit_detail = dryrun.describe(org, plan)
            return Response(plan, status=200)
        assert self.identity is not None
        outcome = operations.op_start(
            RESHARD.start(), org_id=org, request=start, actor=self.identity.actor
        )
        self.audit_detail = f"reshard {outcome.description}"
        return Response(op_json(outcome.op), status=202)


class RestoreStartView(_StartView):
    """``POST /warehouses/<org>/restores`` (docs/restore.md): a restore operation, or its dry
    run. The body is the reshard start's (``target`` a cnpg store) plus ``backup_key``."""

    audit_action = "restore.create"
    dry_run_action = "restore.dry_run"

    @extend_schema(
        operation_id="restore_start",
        request=OBJ,
        responses={200: OBJ, 202: OBJ, 500: OBJ, 502: OBJ, 503: OBJ, **BODY_ERRORS},
        description=(
            "Restore one of the org's own backups onto another cnpg store (docs/restore.md). "
            'Internal secret or staff admin. With `"dry_run": true` the answer is 200 with the '
            "plan and every preflight result, and nothing is created."
        ),
    )
    def post(self, request: Request, org: str) -> Response:
        data = request.data
        self.note_dry_run(data)
        body = dict(v.as_object(data))
        # Unknown fields first, as a reshard start answers them: a misspelt ``backup_kee`` is
        # named, not reported as a missing ``backup_key``.
        v.reject_unknown(body, RESTORE_FIELDS)
        key = v.string(body, "backup_key", required=True, max_length=1024) or ""
        body.pop("backup_key", None)
        start = _parse_start(body, START_FIELDS)
        if start.dry_run:
            plan = restores.restore_dry_run(org, key, start)
            self.audit_detail = f"restore of {key}: {dryrun.describe(org, plan)}"
            return Response(plan, status=200)
        assert self.identity is not None
        outcome = restores.restore_start(
            org_id=org, key=key, request=start, actor=self.identity.actor
        )
        self.audit_detail = outcome.description
        return Response(op_json(outcome.op), status=202)


class ReshardListView(ApiView):
    @extend_schema(
        operation_id="reshard_list",
        parameters=[
            OpenApiParameter("org", str, required=False),
            OpenApiParameter("state", str, required=False),
            LIMIT_PARAM,
            OpenApiParameter("before", int, required=False),
        ],
        responses={200: OBJ, **READ_ERRORS},
        description=(
            "Newest first, one page: `{operations, next_before}`; pass `before=next_before` for "
            "the next page (`next_before` is null on the last one)."
        ),
    )
    def get(self, request: Request) -> Response:
        limit = page_limit(request)
        qs = ReshardOperation.objects.order_by("-id")
        if org := request.query_params.get("org"):
            qs = qs.filter(org_id=org)
        if state := request.query_params.get("state"):
            qs = qs.filter(state=state)
        before = v.query_cursor_id(request.query_params.get("before"), "before")
        if before is not None:
            qs = qs.filter(id__lt=before)
        ops, more = page_of(list(qs[: limit + 1]), limit)
        return Response(
            {
                "operations": [op_json(op) for op in ops],
                "next_before": ops[-1].id if more else None,
            }
        )


class ReshardTargetsView(ApiView):
    @extend_schema(operation_id="reshard_targets", responses={200: OBJ, **READ_ERRORS})
    def get(self, request: Request) -> Response:
        return Response(selectors.reshard_targets())


def _op_or_404(op_id: int) -> ReshardOperation:
    op = ReshardOperation.objects.filter(pk=op_id).first()
    if op is None:
        raise ServiceError(404, "no such reshard operation")
    return op


class ReshardDetailView(ApiView):
    @extend_schema(operation_id="reshard_get", responses={200: OBJ, 404: OBJ, **READ_ERRORS})
    def get(self, request: Request, op_id: int) -> Response:
        return Response(op_json(_op_or_404(op_id)))


class ReshardLogView(ApiView):
    @extend_schema(
        operation_id="reshard_log",
        parameters=[
            OpenApiParameter("after", int, required=False),
            OpenApiParameter("limit", int, required=False),
        ],
        responses={200: OBJ, 404: OBJ, **READ_ERRORS},
    )
    def get(self, request: Request, op_id: int) -> Response:
        _op_or_404(op_id)
        after = v.query_int(request.query_params.get("after"), 0, minimum=0, maximum=2**63 - 1)
        limit = v.query_int(request.query_params.get("limit"), 500, minimum=1, maximum=2000)
        entries = list(
            ReshardLogEntry.objects.filter(operation_id=op_id, id__gt=after).order_by("id")[:limit]
        )
        return Response(
            {
                "entries": [log_entry_json(e) for e in entries],
                "next_after": entries[-1].id if entries else after,
            }
        )


class ReshardCancelView(ApiView):
    audit_action = "reshard.cancel"

    @extend_schema(
        operation_id="reshard_cancel", request=None, responses={200: OBJ, 202: OBJ, **BODY_ERRORS}
    )
    def post(self, request: Request, op_id: int) -> Response:
        assert self.identity is not None
        op = ReshardOperation.objects.filter(pk=op_id).only("org_id").first()
        self.audit_org = op.org_id if op else ""
        outcome = operations.reshard_op_cancel(op_id=op_id, actor=self.identity.actor)
        self.audit_detail = (
            "cancelled before start" if outcome.status == 200 else "cancel requested"
        )
        return Response(outcome.body, status=outcome.status)


class ReshardPasswordView(ApiView):
    """The one-shot password pull (safeguard reshard-79; docs/api.md). The runner secret is
    the route's identity (defence in depth, not sufficient): the bearer credential must prove
    the op's current runner, and the first 200 removes the entry."""

    scope = Scope.RUNNER

    @extend_schema(
        operation_id="reshard_password",
        parameters=[
            OpenApiParameter("X-Duckgres-Op-Epoch", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("X-Duckgres-Runner-Id", str, OpenApiParameter.HEADER, required=True),
            OpenApiParameter("Authorization", str, OpenApiParameter.HEADER, required=True),
        ],
        responses={200: OBJ, 404: OBJ, 503: OBJ, **READ_ERRORS},
        description=(
            "Runner secret, the op's current epoch and runner id, and `Authorization: Bearer` "
            "with the runner's own credential (pod: its projected ServiceAccount token; local: "
            "its one-time credential). Served only on DUCKGRES_PASSWORD_PULL_PORT when set; "
            "answers 200 once (spec §5.3, safeguard reshard-79)."
        ),
    )
    def get(self, request: Request, op_id: int) -> Response:
        password = operations.reshard_password_fetch(
            op_id=op_id,
            epoch_header=request.headers.get("X-Duckgres-Op-Epoch", ""),
            runner_id_header=request.headers.get("X-Duckgres-Runner-Id", ""),
            credential=bearer_credential(request.headers.get("Authorization", "")),
        )
        return Response({"password": password}, headers={"Cache-Control": "no-store"})

    def handle_exception(self, exc: Exception) -> Response:
        # A refusal of a caller that proved who it is is logged on the op; an unauthenticated
        # one (a foreign header with a wrong value) writes nothing. The service logs its own
        # refusals (credential, epoch, stash) itself.
        if isinstance(exc, AuthRefusal) and exc.status == 403 and not self.unauthenticated:
            operations.reshard_password_refused(
                op_id=int(self.kwargs["op_id"]),
                caller=describe_caller(self.request._request),
                status=403,
            )
        response = super().handle_exception(exc)
        response["Cache-Control"] = "no-store"
        return response
