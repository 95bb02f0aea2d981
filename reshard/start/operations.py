"""Reshard operations called by the API and the admin: start (spec reshard §5.1), cancel
(§5.2) and the password handoff (§5.3).

Start runs the preflight fail-fast (``reshard.kinds.checks``: first failure wins, and every
rejection before the insert creates nothing: no op row, no stash entry, no Celery message).
After the insert, failures mark the op ``failed`` by a CAS on ``pending``. The runner launch is
enqueued on commit with the op id as its only argument; the password never leaves this process
except through the stash, whose values every process scrubber masks.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.base.scrub import Scrubber, process_scrubber, register_held_secrets
from duckgres_admin.models import TERMINAL_STATES, OpState, ReshardOperation, StoreKind
from duckgres_admin.platform.queues import QueueName, TaskName
from reshard.kinds import checks, kind_of
from reshard.kinds.checks import ACTIVE_OP_MESSAGE, StartRequest
from reshard.operation import oplog, sequences
from reshard.start import stash

LAUNCH_TASK = TaskName.LAUNCH_RUNNER
LAUNCH_QUEUE = QueueName.DEFAULT

# The external target passwords this API process holds until their runner pulls them.
register_held_secrets(stash.known_values)


# --- start (§5.1) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartOutcome:
    op: ReshardOperation
    description: str


def _fail_pending(op_id: int, message: str, scrubber: Scrubber) -> None:
    text = scrubber.scrub(message)
    ReshardOperation.objects.filter(pk=op_id, state=OpState.PENDING).update(
        state=OpState.FAILED, error=text, finished_at=Now()
    )
    oplog.append(op_id, text, level="error", scrubber=scrubber)


def _send_launch(op_id: int) -> None:
    from celery import current_app

    current_app.send_task(LAUNCH_TASK, args=[op_id], queue=LAUNCH_QUEUE)


DRAIN_ITEM_LAUNCHED = "drain_item_launched"


def _insert_pending(
    fields: dict[str, object],
    launcher: str,
    actor: str,
    drain_item_id: int | None,
    scrubber: Scrubber,
) -> ReshardOperation:
    """The ``pending`` row; the two unique rules (one active op per org, one op per drain
    item) become 409s."""
    try:
        with transaction.atomic():
            return ReshardOperation.objects.create(
                state=OpState.PENDING,
                launcher=launcher,
                created_by=actor,
                drain_item_id=drain_item_id,
                **fields,
            )
    except IntegrityError as exc:
        if "reshard_one_active_op_per_org" in str(exc):
            raise ServiceError(409, ACTIVE_OP_MESSAGE) from None
        if "drain_item" in str(exc):
            raise ServiceError(
                409, "this drain item was already launched", code=DRAIN_ITEM_LAUNCHED
            ) from None
        raise ServiceError(500, scrubber.scrub(f"could not create the operation: {exc}")) from None


def op_start(
    start: checks.KindStart,
    *,
    org_id: str,
    request: StartRequest,
    actor: str,
    drain_item_id: int | None = None,
) -> StartOutcome:
    """§5.1 steps 2-12 for an operation of the kind whose start is ``start`` (``Kind.start``:
    its own rows before the shared table, and its fields on the plan; the reshard's adds
    nothing). The body was parsed by the caller. Raises ``ServiceError``.

    ``drain_item_id``: the store-drain item this operation moves (the janitor's drain advance,
    ``reshard.control.drains``); the column is unique, so a second start for the item is refused
    with code ``drain_item_launched``."""
    stash.prune()
    scrubber = process_scrubber(request.target.password)
    try:
        plan = checks.validate_start(org_id, request, scrubber, start)
    except ServiceError as exc:
        raise exc.scrubbed(scrubber) from None
    launcher = str(settings.DUCKGRES_RESHARD_LAUNCHER)

    # 7. Insert pending.
    op = _insert_pending(plan.fields, launcher, actor, drain_item_id, scrubber)
    for warning in plan.warnings:
        oplog.append(op.id, f"target identity check: {warning}", level="warn", scrubber=scrubber)

    # 8. External target: password URL, then the stash.
    if plan.fields["target_kind"] == StoreKind.EXTERNAL:
        try:
            url = stash.password_url(op.id, launcher)
        except stash.NoAddressError as exc:
            _fail_pending(op.id, str(exc), scrubber)
            raise ServiceError(500, str(exc)) from None
        if (
            ReshardOperation.objects.filter(pk=op.id, state=OpState.PENDING).update(
                password_url=url
            )
            != 1
        ):
            message = "could not record the password URL: the operation is no longer pending"
            _fail_pending(op.id, message, scrubber)
            raise ServiceError(500, message)
        stash.put(op.id, plan.password)

    # 9. Pod launcher: pin the control-plane image.
    if launcher == "pod":
        try:
            from reshard.launchers.pod import resolve_control_plane_image

            image = resolve_control_plane_image()
            if not image:
                raise RuntimeError("the control-plane image is empty")
            if (
                ReshardOperation.objects.filter(pk=op.id, state=OpState.PENDING).update(
                    runner_image=image
                )
                != 1
            ):
                raise RuntimeError("the operation is no longer pending")
        except Exception as exc:  # noqa: BLE001 - any failure fails the op
            stash.delete(op.id)
            message = f"could not record the runner image: {exc}"
            _fail_pending(op.id, message, scrubber)
            raise ServiceError(500, scrubber.scrub(message)) from None

    # 10. Enqueue on commit; the op id is the only argument.
    enqueue_errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            _send_launch(op.id)
        except Exception as exc:  # noqa: BLE001 - mapped to 502 below
            enqueue_errors.append(exc)

    with transaction.atomic():
        transaction.on_commit(enqueue)
    if enqueue_errors:
        stash.delete(op.id)
        message = f"could not enqueue the runner launch: {enqueue_errors[0]}"
        _fail_pending(op.id, message, scrubber)
        raise ServiceError(502, scrubber.scrub(message))

    # 11. Log.
    oplog.append(
        op.id,
        f"operation created by {actor}: {plan.description}; runner launch queued for "
        f"{op.runner_name}",
        scrubber=scrubber,
    )
    op.refresh_from_db()
    return StartOutcome(op=op, description=scrubber.scrub(plan.description))


# --- cancel (§5.2) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelOutcome:
    status: int
    body: dict[str, Any]


PAST_CUTOFF_CODE = "past_point_of_no_return"


def past_cutoff(op: ReshardOperation) -> str:
    """'' while a cancel of ``op`` is still honoured (its kind's cutoff, ``Kind.cancel_cutoff``);
    else why not. Read from the row as it is now: a runner passing the cutoff right after this
    answer logs the late cancel and completes (docs/runner.md "Cancel cutoffs")."""
    cutoff = kind_of(op).cancel_cutoff(op.target_kind)
    ready = op.target_login_ready_at is not None
    if sequences.before_cutoff(cutoff, op.step, op.target_kind, ready, op.copy_variant):
        return ""
    where = "the target login was ready" if ready and cutoff.login_ready_ends_it else op.step
    return (
        f"operation {op.id} is past its point of no return ({where}): {cutoff.description}; "
        "the cancel cannot be honoured and the operation will complete"
    )


def reshard_op_cancel(*, op_id: int, actor: str) -> CancelOutcome:
    op = ReshardOperation.objects.filter(pk=op_id).first()
    if op is None:
        raise ServiceError(404, "no such reshard operation")
    if op.state in TERMINAL_STATES:
        raise ServiceError(409, f"operation already {op.state}")
    if op.state == OpState.PENDING and ReshardOperation.objects.filter(
        pk=op_id, state=OpState.PENDING
    ).update(state=OpState.CANCELLED, error="cancelled before start", finished_at=Now()):
        stash.delete(op_id)
        oplog.append(op_id, f"cancelled by {actor} before the runner claimed it", level="warn")
        return CancelOutcome(200, {"state": OpState.CANCELLED.value})
    refusal = past_cutoff(op)
    if refusal:
        oplog.append(op_id, f"cancel by {actor} refused: {refusal}", level="warn")
        raise ServiceError(
            409,
            refusal,
            code=PAST_CUTOFF_CODE,
            extra={"cancel_requested": False, "step": op.step},
        )
    if not ReshardOperation.objects.filter(pk=op_id, state__in=["pending", "running"]).update(
        cancel_requested=True
    ):
        state = ReshardOperation.objects.filter(pk=op_id).values_list("state", flat=True).first()
        raise ServiceError(409, f"operation already {state}")
    oplog.append(op_id, f"cancel requested by {actor}")
    return CancelOutcome(202, {"cancel_requested": True})


# --- password handoff (§5.3) -----------------------------------------------------------------

PASSWORD_NOT_AVAILABLE = "password not available"


RUNNER_NOT_PROVEN = "runner identity not proven for this operation"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


def pull_credential_digest(credential: str) -> str:
    """The verifier of a local runner's one-time pull credential (SHA-256, hex)."""
    return hashlib.sha256(credential.encode("utf-8")).hexdigest()


def _pod_binding_refusal(op: ReshardOperation, token: str) -> str:
    """'' when ``token`` is a projected ServiceAccount token of the runner ServiceAccount with
    the pull audience, bound to this op's runner pod and the pod uid its claim recorded."""
    from duckgres_admin.lib import k8s
    from reshard.launchers.base import runner_name, runner_namespace

    namespace = runner_namespace()
    if not namespace:
        return (
            "neither DUCKGRES_RESHARD_RUNNER_NAMESPACE nor POD_NAMESPACE is set on the API: "
            "cannot check the runner's ServiceAccount"
        )
    audience = str(settings.DUCKGRES_PASSWORD_PULL_AUDIENCE)
    account = str(settings.DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT) or "default"
    try:
        review = k8s.review_token(token, audience)
    except k8s.KubeError as exc:
        raise _PullUnverifiable(f"TokenReview failed: {exc}") from None
    if not review.authenticated:
        return f"the API server refused the token ({review.error[:300] or 'not authenticated'})"
    if audience not in review.audiences:
        return f"the token is not for audience {audience}"
    expected_user = f"system:serviceaccount:{namespace}:{account}"
    if review.username != expected_user:
        return f"the token belongs to {review.username[:200]!r}, not {expected_user!r}"
    pod_name = review.extra_value(POD_NAME_EXTRA)
    if pod_name != runner_name(op.id):
        return f"the token is bound to pod {pod_name[:200] or '(none)'!r}, not {runner_name(op.id)}"
    pod_uid = review.extra_value(POD_UID_EXTRA)
    if not op.runner_pod_uid or pod_uid != op.runner_pod_uid:
        return (
            f"the token is bound to pod uid {pod_uid[:80] or '(none)'!r}, not the uid the "
            f"current runner claimed with ({op.runner_pod_uid or 'none recorded'!r})"
        )
    return ""


def _local_binding_refusal(op: ReshardOperation, credential: str) -> str:
    """'' when ``credential`` matches the one-time credential the local launcher handed the
    current runner (its digest is on the row until the first successful pull consumes it)."""
    if not op.password_pull_digest:
        return "no one-time pull credential is outstanding (consumed, or never issued)"
    if not hmac.compare_digest(
        pull_credential_digest(credential).encode(), op.password_pull_digest.encode()
    ):
        return "the one-time pull credential does not match"
    return ""


class _PullUnverifiable(Exception):
    """The runner's credential could not be checked (the TokenReview call failed)."""


def reshard_password_fetch(
    *, op_id: int, epoch_header: str, runner_id_header: str, credential: str
) -> str:
    """The stashed password for the op's current runner, once; else ``ServiceError``.

    404: no such op, not running, not the current epoch and runner id, or no entry (already
    pulled, API restarted). 403: the credential does not prove the op's current runner (pod:
    TokenReview; local: the one-time credential). 503: the TokenReview call failed. Only a 200
    removes the entry (and a local runner's credential digest). Every access to an existing op
    is logged on the op (outcome and caller, never the value or the credential).
    """
    stash.prune()
    op = (
        ReshardOperation.objects.filter(pk=op_id)
        .only(
            "id",
            "state",
            "launcher",
            "runner_epoch",
            "runner_id",
            "runner_pod_uid",
            "password_pull_digest",
        )
        .first()
    )
    if op is None:
        raise ServiceError(404, PASSWORD_NOT_AVAILABLE)
    caller = f"runner {runner_id_header[:200]!r} epoch {epoch_header[:40]!r}"

    def refuse(status: int, message: str, reason: str) -> ServiceError:
        oplog.append(
            op_id,
            f"password request by {caller} refused ({status} {message}): {reason}",
            level="warn",
            scrubber=process_scrubber(*([credential] if credential else [])),
        )
        return ServiceError(status, message)

    if op.state != OpState.RUNNING:
        if op.state in TERMINAL_STATES:
            stash.delete(op_id)
        raise refuse(404, PASSWORD_NOT_AVAILABLE, f"operation is {op.state}")
    if epoch_header.strip() != str(op.runner_epoch) or runner_id_header != op.runner_id:
        raise refuse(404, PASSWORD_NOT_AVAILABLE, "not the current runner epoch and id")
    if not credential:
        reason = "no pull credential presented (Authorization: Bearer)"
    elif op.launcher == "pod":
        try:
            reason = _pod_binding_refusal(op, credential)
        except _PullUnverifiable as exc:
            raise refuse(503, "runner identity could not be verified", str(exc)) from None
    elif op.launcher == "local":
        reason = _local_binding_refusal(op, credential)
    else:
        reason = f"launcher {op.launcher!r} has no pull binding"
    if reason:
        raise refuse(403, RUNNER_NOT_PROVEN, reason)
    password = stash.take(op_id)
    if password is None:
        raise refuse(
            404,
            PASSWORD_NOT_AVAILABLE,
            "this control-plane process holds no password for the operation (already pulled "
            "once, or this API process restarted)",
        )
    if op.launcher == "local":
        ReshardOperation.objects.filter(
            pk=op_id, password_pull_digest=op.password_pull_digest
        ).update(password_pull_digest="")
    oplog.append(
        op_id,
        f"runner fetched the ephemeral external target password ({caller}); the entry is "
        "removed: it cannot be pulled again",
        scrubber=process_scrubber(password, *([credential] if credential else [])),
    )
    return password


def reshard_password_refused(*, op_id: int, caller: str, status: int) -> None:
    """Log a refused password access (403) on an existing op."""
    if ReshardOperation.objects.filter(pk=op_id).exists():
        oplog.append(
            op_id,
            f"password request by {caller} refused ({status} runner secret required)",
            level="warn",
            scrubber=process_scrubber(),
        )
