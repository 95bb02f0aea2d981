"""The teardown of an instance: ``RETIRING``, ``LOST``, ``FAILED_PREPARING`` and the guarded
deletes (spec trino-pools §3.1, §4.6, §4.7, §4.8 registry).

Invariants:

1. **Deletes are guarded.** Kubernetes objects are deleted only in ``RETIRING`` (after the
   Gateway's irreversible retire claim), ``LOST`` (after the Gateway's loss record, its failure
   receipt, is stored on the row) and ``FAILED_PREPARING`` (never admitted), always by recorded
   name and UID (the worker ConfigMap included, safeguard 23), in one journalled ``k8s.delete``
   step with the lease re-checked before every DELETE. An unsettled delete is settled by
   reading every recorded object back (GET by name; gone, or the name now holds another UID →
   absent), else the same UID-preconditioned deletes are re-sent. ``RETIRED`` needs every
   object and pod verifiably absent (a terminating pod counts as present).
2. **A failed candidate fails closed.** Its objects are deleted only when the Gateway has no
   member and its ``register`` step is settled refused or was never journalled (an unsettled one
   is resolved first: read-back, else the stored registration re-sent byte for byte, and a
   member it creates is walked out — no orphan), or when its member is ``LOST`` (or already
   ``RETIRED``); a registered member is walked ``PREPARING → SUSPECT → LOST`` one call a tick
   (safeguard 21). Any other member state is an error naming it; nothing is deleted.
3. **No backend record outlives its instance.** The inactive backend ``<routing group>-<id>``
   is deleted (durable step ``backend.delete``) after ``MemberRetired`` (member ``RETIRED``)
   or, for a never-registered candidate, after its objects are gone — always before the
   terminal CAS, so a ``RETIRED``/``FAILURE_RETIRED`` row never leaves a record behind. An
   active record, or one naming another target or routing group, is never deleted (fail
   closed, error on the row).
4. **One step per tick.** A tick that issued DELETEs did its instance's one step, also while
   the objects are still going away; a tick that only finds them present waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from duckgres_admin.lib import k8s
from duckgres_admin.lib.gateway import (
    Backend,
    GatewayClient,
    parse_backends,
    parse_failure_receipt,
    parse_member,
)
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance
from trino_pools import effects, instantiate, phases
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import InstanceError, LeadershipLost
from trino_pools.operator.instances import base, evidence

P = InstancePhase


DELETE_STEP = "k8s.delete"
SENT, ABSENT, PRESENT = "sent", "absent", "present"


def _classify_delete(exc: BaseException) -> effects.Verdict:
    """A refused DELETE (UID precondition, validation, permission) is a refusal: the step is
    re-attempted fresh on a later tick (deletes are idempotent); anything else is unknown."""
    status = getattr(exc, "status", None)
    if isinstance(exc, k8s.KubeError) and status in (400, 403, 409, 422):
        return "failed"
    return "unknown"


def delete_resources(ctx: PoolContext, row: TrinoPoolInstance) -> str:
    """The journalled, UID-preconditioned deletes of the recorded objects (spec §4.6, §4.7).

    Step ``k8s.delete`` of ``instance:<id>`` (kind ``retire``); its body is the recorded
    inventory (kind, name, UID; an unrecorded UID is ``""`` and is pinned at call time only
    for an object labelled as this instance's). The intent commits before the first DELETE;
    the lease is re-checked before every DELETE. An unsettled step is resolved by read-back
    (GET by name and UID: every recorded object absent → ok), else by re-sending the stored
    inventory. Returns ``SENT`` when DELETEs went out this tick (the tick's one instance step),
    ``ABSENT`` when the step is settled and all objects and pods are verifiably absent (a
    terminating pod counts as present), ``PRESENT`` otherwise (a wait).
    """
    lost_with_receipt = row.phase == P.LOST and isinstance(row.retirement_receipt, dict)
    if not phases.deletion_permitted(row.phase) and not lost_with_receipt:
        raise InstanceError(f"refusing to delete the objects of {row.instance_id} in {row.phase}")
    namespace = base.namespace(row)
    plan = instantiate.delete_plan(base.inventory(row), instance_id=row.instance_id)
    body = {
        "namespace": namespace,
        "instanceId": row.instance_id,
        "objects": [[kind, name, uid] for kind, name, uid in plan],
    }
    sent: list[bool] = []
    leadership: list[BaseException] = []

    def stored_plan(payload: str) -> tuple[str, str, instantiate.DeletePlan]:
        stored = effects.business_body(payload)
        objects = [(str(k), str(n), str(u)) for k, n, u in stored["objects"]]
        return str(stored["namespace"]), str(stored["instanceId"]), objects

    def before_each() -> None:
        try:
            ctx.ensure_leading()
        except LeadershipLost as exc:
            leadership.append(exc)
            raise

    def call(payload: str) -> dict[str, Any]:
        ns, instance_id, objects = stored_plan(payload)
        sent.append(True)
        return {
            "deleted": instantiate.issue_deletes(ns, objects, instance_id, before_each=before_each)
        }

    def read_back(state: effects.StepState) -> effects.Settled | None:
        ns, _, objects = stored_plan(state.payload)
        if instantiate.recorded_absent(ns, objects):
            return effects.Settled("ok", {"deleted": [], "readBack": "absent"})
        return None  # some recorded object remains: re-send the stored deletes

    ctx.ensure_leading()
    try:
        state = effects.run_step(
            ctx.auth,
            operation_id=base.operation_id(row.instance_id),
            kind="retire",
            step_id=DELETE_STEP,
            body=body,
            call=call,
            read_back=read_back,
            classify=_classify_delete,
        )
    except effects.EffectUnknown:
        if leadership:
            raise leadership[0] from None
        raise
    if state.outcome == "failed":
        message = state.result.get("message", "") if isinstance(state.result, dict) else ""
        raise InstanceError(f"Kubernetes refused a delete of {row.instance_id}: {message}")
    if sent:
        return SENT
    if instantiate.objects_absent(namespace, plan, row.instance_id):
        return ABSENT
    return PRESENT


def _delete_then(ctx: PoolContext, row: TrinoPoolInstance, finish: Callable[[], bool]) -> bool:
    """Delete step, wait or ``finish()``: exactly one of them this tick."""
    outcome = delete_resources(ctx, row)
    if outcome == SENT:
        return True  # DELETEs went out: this tick's one instance step (invariant 4)
    if outcome == PRESENT:
        return base.wait(ctx, row, "kubernetes_resources")
    return finish()


def _retired(ctx: PoolContext, row: TrinoPoolInstance, to: str) -> bool:
    """Resources are gone: MemberRetired(resourcesAbsent) → close the operation → CAS ``to``."""
    state = base.gateway_step(
        ctx,
        row,
        "retired",
        {"resourcesAbsent": True},
        base.member_path(ctx, row.instance_id, "retired"),
    )
    if state.outcome == "failed":
        raise base.refusal(state)
    fields = (
        base.member_fields(parse_member(state.result)) if isinstance(state.result, dict) else {}
    )
    # The member is RETIRED at the Gateway: its backend record goes before the terminal CAS, so
    # a terminal row never leaves a record behind (a failure here retries from this point).
    delete_backend(ctx, row)
    effects.close_operation(ctx.auth, base.operation_id(row.instance_id), "retired")
    base.advance(ctx, row, to, **fields)
    return True


BACKEND_DELETE_STEP = "backend.delete"


def delete_backend(ctx: PoolContext, row: TrinoPoolInstance) -> None:
    """Remove the instance's inactive backend record ``<routing group>-<id>`` (§4.8 registry).

    Called only once nothing can route to the instance any more — after ``MemberRetired`` (the
    member is ``RETIRED``) or, for a candidate the Gateway never registered, after its objects
    are gone — and always before the terminal CAS. A durable step ``backend.delete`` of
    ``instance:<id>`` (body ``{"name"}``; the call sends the plain-text name, as the upstream
    registry API takes it); an unsettled one is settled by read-back (``GET
    /gateway/backend/all`` without the name → ok), else the stored name is re-sent (the
    registry answers 200 for an unknown name). A record that is active, or that names another
    target or routing group (not this instance's), is never deleted: the step fails closed
    with an error on the row and the instance stays where it is. Nothing is journalled when
    the record is already absent and no delete was ever journalled.
    """
    routing_group = ctx.cell.routing_group
    name = instantiate.backend_name(routing_group, row.instance_id)
    stored = effects.load_step(base.operation_id(row.instance_id), BACKEND_DELETE_STEP)
    if stored is not None and stored.outcome == "ok":
        return

    def current() -> Backend | None:
        for backend in parse_backends(ctx.gateway.get(GatewayClient.BACKEND_ALL)):
            if backend.name == name:
                return backend
        return None

    record = current()
    if record is None and stored is None:
        return
    if record is not None:
        if record.active:
            raise InstanceError(f"Gateway backend {name} is active; refusing to delete it")
        if record.routing_group != routing_group or record.proxy_to != (row.endpoint_url or ""):
            raise InstanceError(
                f"Gateway backend {name} names another target or routing group than instance "
                f"{row.instance_id}; refusing to delete it"
            )

    def read_back(_state: effects.StepState) -> effects.Settled | None:
        if current() is None:
            return effects.Settled("ok", {"readBack": "absent"})
        return None  # still there: re-send the stored name

    def call(payload: str) -> Any:
        stored_name = str(effects.business_body(payload)["name"])
        return ctx.gateway.send(
            "POST", GatewayClient.BACKEND_DELETE, stored_name, content_type="text/plain"
        )

    ctx.ensure_leading()
    state = effects.run_step(
        ctx.auth,
        operation_id=base.operation_id(row.instance_id),
        kind="retire",
        step_id=BACKEND_DELETE_STEP,
        body={"name": name},
        call=call,
        read_back=read_back,
    )
    if state.outcome == "failed":
        raise base.refusal(state)


def step_retiring(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    return _delete_then(ctx, row, lambda: _retired(ctx, row, P.RETIRED))


# LOST, FAILED_PREPARING: failure retirement ----------------------------------------------------


def step_lost(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    if not isinstance(row.retirement_receipt, dict):
        # The Gateway's failure receipt is its irreversible record of the loss: only with it
        # may the objects of an instance that once served be deleted (invariant 1).
        path = base.member_path(ctx, row.instance_id, "failure-receipt")
        receipt = parse_failure_receipt(ctx.gateway.get(path))
        base.update(
            ctx,
            row,
            retirement_receipt={
                "kind": receipt.kind,
                "state": receipt.state,
                "generation": receipt.generation,
                "recordedAt": receipt.recorded_at,
            },
        )
    return _delete_then(ctx, row, lambda: _retired(ctx, row, P.FAILURE_RETIRED))


def step_failed_preparing(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """Walk the member out, then delete; fail closed on anything the protocol does not expect.

    Objects are deleted only when the Gateway has no member and the ``register`` step is
    settled refused or was never journalled (the candidate was provably never admitted), or
    when the member is ``LOST`` (its irreversible loss claim; ``RETIRED`` after a lost
    ``retired`` answer). An unsettled ``register`` is resolved first (read-back, else the
    stored registration re-sent byte for byte) so a late-landing registration cannot leave an
    orphan member; a registered member is then walked out. Any other member state is an
    error naming it (recorded on the row, retried next tick).
    """
    member = base.read_member(ctx, row.instance_id)  # None: not registered (now)
    if member is None:
        register = effects.load_step(base.operation_id(row.instance_id), "register")
        if register is not None and register.outcome in ("pending", "unknown"):
            state = base.gateway_step(
                ctx,
                row,
                "register",
                effects.business_body(register.payload),
                GatewayClient.pool_path(ctx.cell.routing_group, "members"),
            )
            if state.outcome == "ok":
                registered = parse_member(state.result)
                base.update(
                    ctx, row, **base.member_identity(registered), **base.member_fields(registered)
                )
            return True  # resolved: a registered member is walked out from the next tick
        if register is not None and register.outcome == "ok":
            raise InstanceError(
                f"the Gateway accepted the registration of {row.instance_id} but has no such "
                "member; refusing to delete its objects"
            )
        return _delete_then(ctx, row, lambda: _close_failed(ctx, row))
    if member.state in ("PREPARING", "SUSPECT"):
        # Walk the registered member PREPARING → SUSPECT → LOST (safeguard 21), one call a tick.
        step_id = "suspect" if member.state == "PREPARING" else "lost"
        if not row.coordinator_pod_uid:  # registered, but its answer never reached the row
            base.update(ctx, row, **base.member_identity(member))
        claimed = evidence.claim(ctx, row, step_id, evidence.failure_evidence(row))
        base.update(ctx, row, **base.member_fields(claimed))
        return True
    if member.state in ("LOST", "RETIRED"):
        return _delete_then(ctx, row, lambda: _retired(ctx, row, P.FAILURE_RETIRED))
    raise InstanceError(
        f"the Gateway member {row.instance_id} of this failed candidate is {member.state}; "
        "its objects are deleted only once the member is absent or LOST"
    )


def _close_failed(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    # Never registered: the backend added in CREATING goes before the terminal CAS too.
    delete_backend(ctx, row)
    effects.close_operation(ctx.auth, base.operation_id(row.instance_id), "failed")
    base.advance(ctx, row, P.FAILURE_RETIRED)
    return True
