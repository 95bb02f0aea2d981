"""Instance lifecycle of a shared Trino pool (spec trino-pools §3.1, §4.5 create/drain, §4.6).

The operator's tick calls ``progress(ctx, rows, errors)`` (step 10) and, when nothing progressed,
``apply_plan(ctx, rows)`` (step 11). Both work on the durable instance rows only.

Invariants:

1. **Intent before effect.** ``create`` persists the ``PENDING`` row (own blueprint snapshot,
   release id, spec digest, endpoint, repair flags, epoch) in a fenced transaction before any
   Kubernetes object exists. Every Gateway mutation and the Kubernetes creates and deletes go
   through ``effects.run_step`` (operation ``instance:<id>``, steps ``k8s.create``,
   ``backend``, ``register``, ``admit``, ``drain``, ``seal``, ``suspect``, ``lost``,
   ``retire``, ``k8s.delete``, ``retired``, ``backend.delete``; a repeated ``drain``,
   ``seal`` or ``suspect`` after a ``SUSPECT`` detour is ``<step>.g<generation>``, see
   ``attempt_step_id``); an unknown outcome is resolved by read-back
   (Gateway ``GET /operations/<op>``: a step the Gateway never received is absent → the stored
   payload is re-sent byte for byte; Kubernetes deletes: GET by name and UID; the backend
   delete: ``GET /gateway/backend/all`` without the name). The
   ``k8s.create`` body is the five full documents: a re-send creates exactly the journalled
   documents (in a newer term too, with the original term's epoch annotation); objects that
   already exist are adopted by the 409 path (this instance's labels and spec digest).
2. **One fenced CAS per phase change.** ``UPDATE … SET phase=:to, phase_changed_at=now(),
   owner_epoch=:epoch WHERE instance_id=:id AND phase=:from`` inside ``authority.fenced``, rowcount
   checked, the move checked against ``phases.check_transition`` first. "Trino pool member phase
   advanced." is logged only after that transaction commits, "Trino pool instance retired." only
   after the ``RETIRED`` CAS commits: a failing CAS logs neither (safeguard 36).
3. **One step per tick, isolated.** ``progress`` visits the instances in id order; the first one
   that does work gets exactly one step and the sweep ends; any step that sent a mutation
   (Gateway or Kubernetes) is that step, also when it was refused (a ``POOL_NOT_DRAINED``
   seal) or only issued DELETEs that are still finishing. A waiting instance (obligations
   open, resources still present, coordinator not ready, healthy) sent nothing and the sweep
   goes on. A failing instance has its error recorded on its row (``last_error``, fenced) and in
   ``errors``; the sweep moves on. ``PoolConflict`` and ``LeadershipLost`` stop the sweep.
4. **Identity as the Gateway recorded it.** ``bootId`` = the coordinator's ``processId`` (never
   the pod UID, safeguard 19); node id and coordinator id are stored from the Gateway's member
   record, also when a lost registration response is adopted by reading the member back
   (safeguard 20); every register sends ``repairFor`` (``""`` for a normal create, safeguard 22).
5. **Generations.** Admit, seal and retire send the generation recorded on the row from the
   Gateway's last member answer, never the one reported by ``/obligations`` (safeguard 24). A
   ``POOL_STALE_GENERATION`` refusal refreshes the recorded generation from ``GET /members/<id>``
   and the step is retried on a later tick.
6. **Health by evidence only.** ``ADMITTED``/``SERVING``/``DRAINING``/``SEALED`` are
   health-watched (a dead coordinator's obligations never complete, so a draining instance
   would otherwise wait forever) and become ``SUSPECT`` only with termination
   evidence from the registered coordinator pod's container status (the current container
   terminated, or the container recorded at registration terminated or replaced; never a
   ``lastState`` of an earlier container); a ``SUSPECT`` with evidence
   becomes ``LOST``, one without is drained and retired normally; nothing returns to ``SERVING``.
   ``LOST`` objects are deleted only once the Gateway's failure receipt (its irreversible loss
   record) is stored on the row. ``DRAINING``/``SEALED`` check evidence first, unless their own
   ``seal``/``retire`` is journalled and not refused (resolved first: the retire claim is
   irreversible). There, and in ``SUSPECT``, a claim the Gateway applied whose CAS never
   committed is completed whatever the evidence says now.
7. **Drain by obligations only.** ``DRAINING`` seals only when (``readyToSeal`` or ``drained``)
   and ``pendingRequests + openTransactions + activeQueries == 0`` as read from
   ``/obligations``; there is no drain deadline. A serving-floor refusal of the drain is
   authoritative: no CAS, retried on a later tick.
8. **Deletes are guarded.** Kubernetes objects are deleted only in ``RETIRING`` (after the
   Gateway's irreversible retire claim), ``LOST`` (after the Gateway's loss record) and
   ``FAILED_PREPARING`` (never admitted), always by recorded name and UID (the worker ConfigMap
   included, safeguard 23), in one journalled ``k8s.delete`` step with the lease re-checked
   before every DELETE. ``RETIRED`` needs every object verifiably absent. A
   ``FAILED_PREPARING`` candidate's objects are deleted only when the Gateway has no member
   and its ``register`` step is settled refused or was never journalled (an unsettled one is
   resolved first), or when its member is ``LOST``; any other member state fails closed.
9. **No backend record outlives its instance.** The inactive backend ``<routing group>-<id>``
   added in ``CREATING`` is deleted (durable step ``backend.delete``) after ``MemberRetired``
   (member ``RETIRED``) or, for a never-registered candidate, after its objects are gone —
   always before the terminal CAS, so a ``RETIRED``/``FAILURE_RETIRED`` row never leaves a
   record behind. An active record, or one naming another target or routing group, is never
   deleted (fail closed, error on the row).

Admit and safeguard 25: the admit body carries ``expectedGeneration`` = the generation recorded at
registration, which does not change while the instance is ``VALIDATING`` (the member stays
``PREPARING`` at the Gateway), so a retry after a lost response re-sends the identical stored
payload (or settles by read-back) and the Gateway — which excludes ``expectedGeneration`` from its
intent hash — answers it as a replay. Only a refusal (which applied nothing) can lead to a body
with another generation, and then it is a new attempt of the same step.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError
from django.db.models.functions import Now
from django.utils import timezone

from duckgres_admin.lib import k8s
from duckgres_admin.lib.gateway import (
    Backend,
    GatewayClient,
    GatewayRefused,
    Member,
    Obligations,
    parse_backends,
    parse_failure_receipt,
    parse_member,
    parse_obligations,
    parse_operation,
)
from duckgres_admin.models.trino import (
    InstancePhase,
    TrinoPoolInstance,
    clip_status_message,
)
from trino_pools import authority, effects, instantiate, phases, planner, probes
from trino_pools.authority import PoolConflict
from trino_pools.blueprint import INSTANCE_LABEL, BlueprintError

if TYPE_CHECKING:
    from trino_pools.operator import PoolContext

P = InstancePhase
_log = logging.getLogger("duckgres.trino.instances")

ADVANCED = "Trino pool member phase advanced."
RETIRED_MESSAGE = "Trino pool instance retired."
CREATED_MESSAGE = "Trino pool instance created."
SUPERSEDED = "candidate blueprint was superseded before admission"
ID_ATTEMPTS = 8

# Kubernetes inventory: instantiate's key (the row's column prefix) -> (name field, uid field).
INVENTORY_FIELDS: dict[str, tuple[str, str]] = {
    key: (f"{key}_name", f"{key}_uid") for key in instantiate.INVENTORY
}

# Register refusals after which the candidate can never join: fail it (and clean it up).
FATAL_REGISTER_REFUSALS = frozenset(
    {"POOL_IDENTITY_CONFLICT", "POOL_VALIDATION", "POOL_IRREVERSIBLE", "POOL_PHASE"}
)


class InstanceError(Exception):
    """One instance's step failed; recorded on the row and the sweep moves on."""


class PhaseChanged(InstanceError):
    """The phase CAS found another phase: someone else moved the instance."""


def operation_id(instance_id: str) -> str:
    return f"instance:{instance_id}"


# --- small helpers ---------------------------------------------------------------------------


def _snapshot(row: TrinoPoolInstance) -> dict[str, Any]:
    snap = row.blueprint_snapshot
    return snap if isinstance(snap, dict) else {}


def _blueprint_raw(row: TrinoPoolInstance) -> dict[str, Any]:
    """The instance's own blueprint (``instantiate.snapshot_for`` form or a bare blueprint)."""
    snap = _snapshot(row)
    raw = snap.get("blueprint", snap)
    return raw if isinstance(raw, dict) else {}


def _namespace(row: TrinoPoolInstance) -> str:
    return str(_blueprint_raw(row).get("namespace") or "")


def _identity(row: TrinoPoolInstance) -> dict[str, Any]:
    ident = _blueprint_raw(row).get("identity_binding")
    return ident if isinstance(ident, dict) else {}


def _phase_age(row: TrinoPoolInstance) -> float:
    changed = row.phase_changed_at
    if changed is None:
        return 0.0
    return max(0.0, (timezone.now() - changed).total_seconds())


def _member_path(ctx: PoolContext, instance_id: str, *rest: str) -> str:
    return GatewayClient.pool_path(ctx.cell.routing_group, "members", instance_id, *rest)


def _operation_kind(row: TrinoPoolInstance) -> str:
    return "repair" if row.repair else "scale_up"


def _refusal(state: effects.StepState) -> GatewayRefused:
    result = state.result if isinstance(state.result, dict) else {}
    return GatewayRefused(
        str(result.get("code") or ""),
        int(result.get("status") or 409),
        str(result.get("message") or ""),
    )


def _gateway_read_back(
    ctx: PoolContext, step_id: str
) -> Callable[[effects.StepState], effects.Settled | None]:
    """Resolve an unknown Gateway step from ``GET /operations/<opId>`` (absent → None)."""

    def read_back(state: effects.StepState) -> effects.Settled | None:
        path = GatewayClient.pool_path(ctx.cell.routing_group, "operations", state.operation_id)
        try:
            record = parse_operation(ctx.gateway.get(path))
        except GatewayRefused as exc:
            if exc.code == "POOL_NOT_FOUND":
                return None  # the Gateway never received any step of this operation
            raise
        step = record.step(step_id)
        if step is None:
            return None
        if step.outcome == "APPLIED":
            return effects.Settled("ok", step.result)
        return effects.Settled(
            "failed", {"code": step.code, "status": 409, "message": "refused (read back)"}
        )

    return read_back


def _gateway_step(
    ctx: PoolContext,
    row: TrinoPoolInstance,
    step_id: str,
    body: Mapping[str, Any],
    path: str,
    *,
    method: str = "POST",
) -> effects.StepState:
    """One durable Gateway mutation of this instance (§4.7); EffectUnknown propagates."""
    ctx.ensure_leading()
    return effects.run_step(
        ctx.auth,
        operation_id=operation_id(row.instance_id),
        kind=_operation_kind(row),
        step_id=step_id,
        body=body,
        call=lambda payload: ctx.gateway.send(method, path, payload),
        read_back=_gateway_read_back(ctx, step_id),
    )


def _read_member(ctx: PoolContext, instance_id: str) -> Member | None:
    try:
        return parse_member(ctx.gateway.get(_member_path(ctx, instance_id)))
    except GatewayRefused as exc:
        if exc.code == "POOL_NOT_FOUND":  # decisive: the Gateway has no such member
            return None
        raise


def _member_fields(member: Member) -> dict[str, Any]:
    return {
        "gateway_state": member.state,
        "gateway_generation": member.generation,
        "gateway_incarnation": str(member.incarnation),
        "gateway_backend_name": member.backend_name,
    }


def _member_identity(member: Member) -> dict[str, Any]:
    """The coordinator identity as the Gateway recorded it (safeguard 20)."""
    return {
        "coordinator_pod_uid": member.pod_uid,
        "coordinator_boot_id": member.boot_id,
        "coordinator_node_id": member.node_id,
        "coordinator_id": member.coordinator_id,
    }


def _update(ctx: PoolContext, row: TrinoPoolInstance, **fields: Any) -> None:
    """A fenced non-phase update of the row (same phase required)."""
    with authority.fenced(ctx.auth):
        changed = TrinoPoolInstance.objects.filter(
            instance_id=row.instance_id, phase=row.phase
        ).update(updated_at=Now(), **fields)
    if changed != 1:
        raise PhaseChanged(
            f"instance {row.instance_id} is no longer {row.phase}; its update was not written"
        )
    for key, value in fields.items():
        setattr(row, key, value)


def advance(ctx: PoolContext, row: TrinoPoolInstance, to: str, **fields: Any) -> None:
    """The fenced phase CAS ``row.phase → to`` (plus ``fields``); logs only after commit."""
    frm = row.phase
    phases.check_transition(frm, to)
    with authority.fenced(ctx.auth):
        changed = TrinoPoolInstance.objects.filter(
            instance_id=row.instance_id, pool_id=ctx.auth.pool_id, phase=frm
        ).update(
            phase=to,
            phase_changed_at=Now(),
            owner_epoch=ctx.auth.epoch,
            last_error="",
            updated_at=Now(),
            **fields,
        )
    if changed != 1:
        raise PhaseChanged(
            f"instance {row.instance_id} is no longer {frm}; the move to {to} was not written"
        )
    # Committed: only now may the logs claim it.
    for key, value in fields.items():
        setattr(row, key, value)
    row.phase = to
    row.phase_changed_at = timezone.now()
    row.owner_epoch = ctx.auth.epoch
    validator = ctx.term.validator
    if validator is not None:
        validator.forget(row.instance_id)
    _log.info(
        ADVANCED,
        extra={
            "pool": ctx.cell.id,
            "instance": row.instance_id,
            "epoch": ctx.auth.epoch,
            "from_phase": frm,
            "to_phase": to,
        },
    )
    if to == P.RETIRED:
        _log.info(
            RETIRED_MESSAGE,
            extra={"pool": ctx.cell.id, "instance": row.instance_id, "epoch": ctx.auth.epoch},
        )


def record_error(ctx: PoolContext, row: TrinoPoolInstance, exc: BaseException) -> None:
    """Fenced ``last_error`` of the instance (any phase)."""
    message = clip_status_message(f"{type(exc).__name__}: {exc}")
    with authority.fenced(ctx.auth):
        TrinoPoolInstance.objects.filter(instance_id=row.instance_id).update(
            last_error=message, updated_at=Now()
        )
    row.last_error = message


def _wait(ctx: PoolContext, row: TrinoPoolInstance, reason: str, **fields: Any) -> bool:
    ctx.term.waitlog.waiting(
        ctx.cell.id,
        row.instance_id,
        ctx.auth.epoch,
        row.phase,
        _phase_age(row),
        reason,
        **fields,
    )
    return False


# --- planner inputs and lifecycle actions (§4.5) ---------------------------------------------


def pool_desired(ctx: PoolContext) -> planner.PoolDesired:
    blueprint = ctx.desired.blueprint
    pool = ctx.pool
    return planner.PoolDesired(
        desired=int(pool.desired_instances),
        min_serving=int(pool.min_serving),
        max_surge=int(pool.max_surge),
        max_repair=int(pool.max_repair),
        release_id=blueprint.release_id if blueprint is not None else "",
        digest=blueprint.digest if blueprint is not None else "",
        frozen=bool(pool.frozen) or blueprint is None,
        frozen_reason=str(pool.frozen_reason or ctx.desired.frozen_reason or ""),
    )


def spec_outdated(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    blueprint = ctx.desired.blueprint
    if blueprint is None:
        return False
    return row.release_id != blueprint.release_id or row.spec_digest != instantiate.spec_digest(
        blueprint.digest, row.instance_id
    )


def instance_views(
    ctx: PoolContext, rows: Sequence[TrinoPoolInstance]
) -> list[planner.InstanceView]:
    return [
        planner.InstanceView(
            instance_id=row.instance_id,
            phase=row.phase,
            release_id=row.release_id,
            spec_outdated=spec_outdated(ctx, row),
            repair=bool(row.repair),
            repair_for=row.repair_for,
            created_at=row.created_at,
        )
        for row in rows
    ]


def apply_plan(ctx: PoolContext, rows: Sequence[TrinoPoolInstance]) -> str:
    """Step 11: ask the planner and persist at most one create or drain; returns the outcome."""
    action, reason = planner.plan(pool_desired(ctx), instance_views(ctx, rows))
    if action is None:
        return f"idle: {reason}"
    if action.kind == "create":
        instance_id = create(ctx, repair=action.repair, repair_for=action.repair_for)
        return f"created {instance_id}: {reason}"
    row = next(r for r in rows if r.instance_id == action.instance_id)
    return drain(ctx, row, reason)


def create(ctx: PoolContext, *, repair: bool = False, repair_for: str = "") -> str:
    """Persist a new ``PENDING`` instance (fenced) before anything exists in Kubernetes."""
    blueprint = ctx.desired.blueprint
    if blueprint is None:
        raise InstanceError("no desired blueprint: nothing to instantiate")
    snapshot = instantiate.snapshot_for(blueprint, ctx.cell)
    for _ in range(ID_ATTEMPTS):
        instance_id = f"cell-{secrets.token_hex(4)}"
        endpoint = instantiate.endpoint_url(
            instance_id, blueprint.namespace, ctx.cell.pool.coordinator_service_port
        )
        try:
            with authority.fenced(ctx.auth):
                if TrinoPoolInstance.objects.filter(instance_id=instance_id).exists():
                    continue  # never reused, retired rows included
                TrinoPoolInstance.objects.create(
                    instance_id=instance_id,
                    pool_id=ctx.auth.pool_id,
                    release_id=blueprint.release_id,
                    spec_digest=instantiate.spec_digest(blueprint.digest, instance_id),
                    blueprint_snapshot=snapshot,
                    phase=P.PENDING,
                    owner_epoch=ctx.auth.epoch,
                    repair=repair,
                    repair_for=repair_for,
                    endpoint_url=endpoint,
                )
        except IntegrityError:
            continue  # a concurrent insert of the same id: draw another
        _log.info(
            CREATED_MESSAGE,
            extra={
                "pool": ctx.cell.id,
                "instance": instance_id,
                "epoch": ctx.auth.epoch,
                "release_id": blueprint.release_id,
                "repair_for": repair_for,
            },
        )
        return instance_id
    raise InstanceError(f"no free instance id after {ID_ATTEMPTS} draws")


def drain(ctx: PoolContext, row: TrinoPoolInstance, reason: str = "") -> str:
    """Durable Gateway drain, then CAS ``SERVING → DRAINING``; a serving-floor refusal waits."""
    state = _gateway_step(ctx, row, "drain", {}, _member_path(ctx, row.instance_id, "drain"))
    if state.outcome == "failed":
        if state.refusal_code == "POOL_SERVING_FLOOR":
            _log.info(
                "Gateway refused the drain at its serving floor; retried on a later tick.",
                extra={"pool": ctx.cell.id, "instance": row.instance_id, "epoch": ctx.auth.epoch},
            )
            return f"waiting: drain of {row.instance_id} refused by the Gateway serving floor"
        raise _refusal(state)
    member = parse_member(state.result)
    advance(ctx, row, P.DRAINING, **_member_fields(member))
    return f"draining {row.instance_id}: {reason}"


# --- the sweep (§4.6) ------------------------------------------------------------------------


def progress(
    ctx: PoolContext, rows: Sequence[TrinoPoolInstance], errors: list[BaseException]
) -> bool:
    """Step 10: the first instance with work gets one step; True when one did."""
    from trino_pools.operator import LeadershipLost

    for row in sorted(rows, key=lambda r: r.instance_id):
        if not phases.is_valid(row.phase) or phases.is_terminal(row.phase):
            continue
        try:
            if step(ctx, row):
                return True
        except (PoolConflict, LeadershipLost):
            raise
        except Exception as exc:  # noqa: BLE001 - per-instance isolation (invariant 8)
            errors.append(exc)
            _log.warning(
                "Trino pool instance step failed: %s",
                exc,
                extra={
                    "pool": ctx.cell.id,
                    "instance": row.instance_id,
                    "epoch": ctx.auth.epoch,
                    "phase": row.phase,
                },
            )
            record_error(ctx, row, exc)
    return False


def step(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """One step of one instance; True when it did work, False when it only waited."""
    handler = _HANDLERS.get(row.phase)
    if handler is None:
        return False
    return handler(ctx, row)


# PENDING ---------------------------------------------------------------------------------------


def _inventory(row: TrinoPoolInstance) -> dict[str, tuple[str, str]]:
    return {
        key: (str(getattr(row, name_f)), str(getattr(row, uid_f)))
        for key, (name_f, uid_f) in INVENTORY_FIELDS.items()
        if getattr(row, name_f)
    }


def _step_pending(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    namespace = _namespace(row)
    try:
        docs = instantiate.instance_objects(
            row.instance_id, ctx.cell.id, ctx.cell.routing_group, _snapshot(row), ctx.auth.epoch
        )
    except (instantiate.InstanceSpecError, BlueprintError) as exc:
        # The instance's own snapshot can never produce objects: nothing was created.
        _fail_candidate(ctx, row, f"the instance snapshot cannot be instantiated: {exc}")
        return True
    ctx.ensure_leading()
    state = effects.run_step(
        ctx.auth,
        operation_id=operation_id(row.instance_id),
        kind=_operation_kind(row),
        step_id="k8s.create",
        # The full documents are the journalled intent: a re-send (same or newer term) creates
        # exactly the stored documents, never ones rebuilt with a newer epoch annotation.
        body={"namespace": namespace, "objects": docs, "specDigest": row.spec_digest},
        # Creation is idempotent (a 409 adopts this instance's own object when its labels and
        # spec digest match), so an unsettled create is resolved by repeating the stored one.
        call=_create_stored,
        classify=_classify_kube,
    )
    if state.outcome == "failed":
        message = state.result.get("message", "") if isinstance(state.result, dict) else ""
        advance(
            ctx,
            row,
            P.FAILED_PREPARING,
            failure_reason=clip_status_message(f"Kubernetes refused the objects: {message}"),
        )
        return True
    created = state.result if isinstance(state.result, dict) else {}
    fields: dict[str, Any] = {}
    for key, (name_f, uid_f) in INVENTORY_FIELDS.items():
        pair = created.get(key)
        if not pair:
            raise InstanceError(f"instantiation recorded no {key} for {row.instance_id}")
        fields[name_f], fields[uid_f] = str(pair[0]), str(pair[1])
    advance(ctx, row, P.CREATING, **fields)
    return True


def _create_stored(payload: str) -> dict[str, list[str]]:
    """Create the documents of a stored ``k8s.create`` step (byte for byte what was journalled)."""
    stored = effects.business_body(payload)
    docs = [dict(doc) for doc in stored["objects"]]
    created = instantiate.create_objects(str(stored["namespace"]), docs)
    return {key: list(value) for key, value in created.items()}


def _classify_kube(exc: BaseException) -> effects.Verdict:
    """Kubernetes create: a validation/permission refusal applied nothing; the rest is unknown."""
    status = getattr(exc, "status", None)
    if isinstance(exc, k8s.KubeError) and status in (400, 403, 422):
        return "failed"
    return "unknown"


# CREATING --------------------------------------------------------------------------------------


def coordinator_pod(row: TrinoPoolInstance) -> dict[str, Any] | None:
    """The instance's coordinator pod (newest, by the identity binding labels), or None."""
    component_label = str(_identity(row).get("component_label") or "")
    if not component_label:
        return None
    pods = k8s.list_pods(
        _namespace(row), f"{INSTANCE_LABEL}={row.instance_id},{component_label}=coordinator"
    )
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if row.coordinator_pod_uid:
        for pod in pods:
            if (pod.get("metadata") or {}).get("uid") == row.coordinator_pod_uid:
                return pod
        return None
    if not live:
        return None
    live.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    return live[-1]


def _container_status(row: TrinoPoolInstance, pod: Mapping[str, Any]) -> dict[str, Any]:
    name = str(_identity(row).get("coordinator_container_name") or "")
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(status, dict) and status.get("name") == name:
            return status
    return {}


def _running_image(row: TrinoPoolInstance, pod: Mapping[str, Any]) -> str:
    status = _container_status(row, pod)
    if status.get("image"):
        return str(status["image"])
    name = str(_identity(row).get("coordinator_container_name") or "")
    for container in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(container, dict) and container.get("name") == name:
            return str(container.get("image") or "")
    return ""


def _adopt_member(ctx: PoolContext, row: TrinoPoolInstance, member: Member) -> None:
    """Record the Gateway's member identity (as the Gateway recorded it) and → PREPARING."""
    container_id = row.coordinator_container_id
    if not container_id:
        pod = coordinator_pod(row) if not row.coordinator_pod_uid else None
        if pod is not None and (pod.get("metadata") or {}).get("uid") == member.pod_uid:
            container_id = str(_container_status(row, pod).get("containerID") or "")
    advance(
        ctx,
        row,
        P.PREPARING,
        coordinator_pod_uid=member.pod_uid,
        coordinator_boot_id=member.boot_id,
        coordinator_node_id=member.node_id,
        coordinator_id=member.coordinator_id,
        coordinator_container_id=container_id,
        **_member_fields(member),
    )


def _ensure_backend(ctx: PoolContext, row: TrinoPoolInstance) -> None:
    """An inactive backend record for the instance; an active or mismatching one is refused."""
    name = instantiate.backend_name(ctx.cell.routing_group, row.instance_id)
    wanted = {
        "name": name,
        "proxyTo": row.endpoint_url or "",
        "active": False,
        "routingGroup": ctx.cell.routing_group,
    }

    def present() -> bool:
        for backend in parse_backends(ctx.gateway.get(GatewayClient.BACKEND_ALL)):
            if backend.name != name:
                continue
            if backend.active:
                raise InstanceError(f"Gateway backend {name} is already active; refusing it")
            if (
                backend.proxy_to != wanted["proxyTo"]
                or backend.routing_group != wanted["routingGroup"]
            ):
                raise InstanceError(
                    f"Gateway backend {name} exists with another target or routing group"
                )
            return True
        return False

    if present():
        return

    def read_back(_state: effects.StepState) -> effects.Settled | None:
        return effects.Settled("ok", wanted) if present() else None

    ctx.ensure_leading()
    # The backend registry is outside the pooled-member API and takes the plain record: the
    # intent (with its envelope) is journalled, the record alone is sent.
    state = effects.run_step(
        ctx.auth,
        operation_id=operation_id(row.instance_id),
        kind=_operation_kind(row),
        step_id="backend",
        body=wanted,
        call=lambda payload: ctx.gateway.send(
            "POST", GatewayClient.BACKEND_ADD, effects.canonical(effects.business_body(payload))
        ),
        read_back=read_back,
    )
    if state.outcome == "failed":
        raise _refusal(state)


def _step_creating(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    member = _read_member(ctx, row.instance_id)
    if member is not None:
        # Registered already (a lost registration response): adopt what the Gateway recorded.
        _adopt_member(ctx, row, member)
        return True
    namespace = _namespace(row)
    try:
        coordinator_ready, ready_workers, desired_workers = instantiate.workers_ready(
            namespace, row.instance_id
        )
    except k8s.KubeError as exc:
        if exc.status != 404:
            raise
        _fail_candidate(ctx, row, f"an instance Deployment is missing: {exc}")
        return True
    if not (coordinator_ready and desired_workers > 0 and ready_workers == desired_workers):
        return _wait(
            ctx,
            row,
            "kubernetes_readiness",
            coordinator_ready=coordinator_ready,
            ready_workers=ready_workers,
            desired_workers=desired_workers,
        )
    pod = coordinator_pod(row)
    if pod is None:
        return _wait(ctx, row, "coordinator_pod")
    pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
    container_id = str(_container_status(row, pod).get("containerID") or "")
    process_id = probes.read_process_id(row.endpoint_url or "", namespace)
    _ensure_backend(ctx, row)
    body = {
        "memberId": row.instance_id,
        "backendName": instantiate.backend_name(ctx.cell.routing_group, row.instance_id),
        "podUid": pod_uid,
        "bootId": process_id,  # the coordinator's processId, never the pod UID (safeguard 19)
        "configRevision": row.release_id,
        "repairFor": row.repair_for,  # always sent, "" for a normal create (safeguard 22)
    }
    state = _gateway_step(
        ctx, row, "register", body, GatewayClient.pool_path(ctx.cell.routing_group, "members")
    )
    if state.outcome == "failed":
        code = state.refusal_code
        if code in FATAL_REGISTER_REFUSALS:
            advance(
                ctx,
                row,
                P.FAILED_PREPARING,
                failure_reason=clip_status_message(f"the Gateway refused registration: {code}"),
            )
            return True
        raise _refusal(state)
    member = parse_member(state.result)
    advance(
        ctx,
        row,
        P.PREPARING,
        coordinator_pod_uid=member.pod_uid or pod_uid,
        coordinator_boot_id=member.boot_id or process_id,
        # As the Gateway recorded them (safeguard 20).
        coordinator_node_id=member.node_id,
        coordinator_id=member.coordinator_id,
        coordinator_container_id=container_id,
        **_member_fields(member),
    )
    return True


# PREPARING -------------------------------------------------------------------------------------


def _validator(ctx: PoolContext) -> probes.Validator:
    if ctx.term.validator is None:
        ctx.term.validator = probes.Validator()
    validator: probes.Validator = ctx.term.validator
    return validator


def _fail_candidate(ctx: PoolContext, row: TrinoPoolInstance, reason: str) -> None:
    advance(ctx, row, P.FAILED_PREPARING, failure_reason=clip_status_message(reason))
    _log.warning(
        "Trino pool candidate failed: %s",
        reason,
        extra={"pool": ctx.cell.id, "instance": row.instance_id, "epoch": ctx.auth.epoch},
    )


def _step_preparing(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    if spec_outdated(ctx, row):
        _fail_candidate(ctx, row, SUPERSEDED)
        return True
    namespace = _namespace(row)
    _, ready_workers, _ = instantiate.workers_ready(namespace, row.instance_id)
    pod = coordinator_pod(row)
    if pod is None:
        _fail_candidate(ctx, row, probes.RESTARTED + " (the registered coordinator pod is gone)")
        return True
    validation = probes.ValidationContext(
        instance_id=row.instance_id,
        endpoint_url=row.endpoint_url or "",
        namespace=namespace,
        image=str(_blueprint_raw(row).get("image") or ""),
        worker_image="",
        ready_workers=ready_workers,
        publication_revision=int(ctx.pool.publication_revision or 0),
        registered_process_id=row.coordinator_boot_id,
        pod_uid=row.coordinator_pod_uid,
        config_revision=row.release_id,
        running_image=_running_image(row, pod),
        registered_node_id=row.coordinator_node_id,
        registered_coordinator_id=row.coordinator_id,
    )
    result = _validator(ctx).step(validation)
    if result.done and result.receipt is not None:
        advance(
            ctx,
            row,
            P.VALIDATING,
            coordinator_node_id=result.node_id or row.coordinator_node_id,
            coordinator_id=result.coordinator_id or row.coordinator_id,
            coordinator_boot_id=result.process_id or row.coordinator_boot_id,
            applied_catalog_revision=result.applied_revision,
            validation_receipt=result.receipt,
            validated_at=datetime.now(UTC),
        )
        return True
    if result.fatal:
        _fail_candidate(ctx, row, result.error or probes.RESTARTED)
        return True
    if result.error:
        raise InstanceError(f"validation pass failed (a new pass starts): {result.error}")
    return True  # the pass issued its requests this tick and resumes on the next one


# VALIDATING ------------------------------------------------------------------------------------


def _refresh_generation(ctx: PoolContext, row: TrinoPoolInstance) -> None:
    member = _read_member(ctx, row.instance_id)
    if member is None:
        raise InstanceError(f"the Gateway has no member {row.instance_id}")
    _update(ctx, row, **_member_fields(member))


def _step_validating(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    receipt = row.validation_receipt if isinstance(row.validation_receipt, dict) else None
    if receipt is None or row.gateway_generation is None:
        advance(ctx, row, P.PREPARING, validation_receipt=None, validated_at=None)
        return True
    body = {"expectedGeneration": int(row.gateway_generation), "receipt": receipt}
    state = _gateway_step(ctx, row, "admit", body, _member_path(ctx, row.instance_id, "admit"))
    if state.outcome == "failed":
        code = state.refusal_code
        if code == "POOL_PUBLICATION_BARRIER":
            from trino_pools import admission

            admission.release_barrier(ctx, "a candidate is waiting to join")
            return True
        if code == "POOL_NOT_CERTIFIED":
            advance(ctx, row, P.PREPARING, validation_receipt=None, validated_at=None)
            return True
        if code == "POOL_STALE_GENERATION":
            _refresh_generation(ctx, row)
            return True
        raise _refusal(state)
    member = parse_member(state.result) if isinstance(state.result, dict) else None
    if member is None:  # a replay without a body: read the member back
        member = _read_member(ctx, row.instance_id)
    fields = _member_fields(member) if member is not None else {}
    advance(ctx, row, P.ADMITTED, **fields)
    return True


# ADMITTED, SERVING, SUSPECT: health observation -------------------------------------------------


def termination_evidence(row: TrinoPoolInstance) -> dict[str, Any] | None:
    """Evidence that the **registered** coordinator process ended, from its container status only.

    Counted: the current container is terminated (``state.terminated``); the previous container
    (``lastState.terminated``) only when its ``containerID`` is the one recorded at registration
    (the registered process died and was restarted); or the status now names another container
    than the recorded one (a container is only replaced after it ended). A ``lastState`` from
    another container (e.g. a crash during startup, before the registered container began) is
    never evidence. Without a recorded container id only ``state.terminated`` counts.
    """
    if not row.coordinator_pod_uid:
        return None
    pod = coordinator_pod(row)
    if pod is None:
        return None
    status = _container_status(row, pod)
    recorded = str(row.coordinator_container_id or "")
    current_id = str(status.get("containerID") or "")
    current = (status.get("state") or {}).get("terminated")
    previous = (status.get("lastState") or {}).get("terminated")
    restarts = int(status.get("restartCount") or 0)
    if isinstance(current, dict):
        terminated: dict[str, Any] = current
        observation = "coordinator container terminated"
    elif (
        recorded
        and isinstance(previous, dict)
        and str(previous.get("containerID") or "") == recorded
    ):
        terminated = previous
        observation = "registered coordinator container terminated and was restarted"
    elif recorded and current_id and current_id != recorded:
        terminated = previous if isinstance(previous, dict) else {}
        observation = f"registered coordinator container was replaced (restart count {restarts})"
    else:
        return None
    reason = str(terminated.get("reason") or terminated.get("exitCode") or "terminated")
    observed = str(terminated.get("finishedAt") or terminated.get("startedAt") or "")
    return {
        "podUid": row.coordinator_pod_uid,
        "bootId": row.coordinator_boot_id,
        "nodeId": row.coordinator_node_id,
        "coordinatorId": row.coordinator_id,
        "observation": f"{observation}: {reason}",
        "observedAt": observed or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _claim(
    ctx: PoolContext,
    row: TrinoPoolInstance,
    action: str,
    evidence: dict[str, Any],
    step_id: str | None = None,
) -> Member:
    state = _gateway_step(
        ctx,
        row,
        step_id or action,
        {"evidence": evidence},
        _member_path(ctx, row.instance_id, action),
    )
    if state.outcome == "failed":
        raise _refusal(state)
    return parse_member(state.result)


def _answer_generation(result: Any) -> int | None:
    generation = result.get("generation") if isinstance(result, dict) else None
    if isinstance(generation, bool) or not isinstance(generation, int):
        return None
    return generation


def attempt_step_id(row: TrinoPoolInstance, base: str) -> str:
    """The step id of this attempt of a member action that a lifecycle may repeat.

    ``drain``, ``seal`` and ``suspect`` can be needed twice: an instance that went ``DRAINING``
    or ``SEALED → SUSPECT`` and lost its evidence is drained again, and one that was drained
    from ``SUSPECT`` may become suspect again. A settled step is a replay (§4.7), so a repeated
    action needs its own step id. The first attempt is ``base``. A settled ``base`` whose
    answer's generation is above the row's recorded generation was never recorded on the row
    (its phase CAS did not happen): it *is* this attempt and is replayed. Otherwise that
    attempt is complete and this one is ``base.g<recorded generation>`` — stable until the
    phase CAS records the answer, because only the Gateway's answers change that generation.
    """
    return _attempt(row, base)[0]


def _attempt(row: TrinoPoolInstance, base: str) -> tuple[str, effects.StepState | None]:
    """``attempt_step_id`` and that step's journal row (one query unless ``base`` is done)."""
    stored = effects.load_step(operation_id(row.instance_id), base)
    if stored is None or stored.outcome != "ok":
        return base, stored
    answered = _answer_generation(stored.result)
    recorded = row.gateway_generation
    if answered is None or recorded is None or answered > recorded:
        return base, stored
    step_id = f"{base}.g{recorded}"
    return step_id, effects.load_step(operation_id(row.instance_id), step_id)


def _uncommitted_answer(row: TrinoPoolInstance, stored: effects.StepState | None) -> Member | None:
    """The Gateway's answer to a settled step whose phase CAS never committed, else None."""
    if stored is None or stored.outcome != "ok" or not isinstance(stored.result, dict):
        return None
    answered = _answer_generation(stored.result)
    recorded = row.gateway_generation
    if answered is not None and recorded is not None and answered <= recorded:
        return None
    return parse_member(stored.result)


def _in_flight(row: TrinoPoolInstance, base: str) -> bool:
    """This attempt of ``base`` is journalled and not refused: pending, unknown, or applied
    without its phase CAS. It is finished before anything newer is claimed (§4.7 item 4)."""
    _, stored = _attempt(row, base)
    return stored is not None and stored.outcome in ("pending", "unknown", "ok")


def _observe(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """Health observation (invariant 6): ``SUSPECT`` → ``lost``, every other watched phase
    (``ADMITTED``, ``SERVING``, ``DRAINING``, ``SEALED``) → ``suspect``, only with termination
    evidence. In ``SUSPECT``, ``DRAINING`` and ``SEALED`` a claim the Gateway applied but whose
    CAS never committed is completed first, whatever the evidence says now; ``ADMITTED`` and
    ``SERVING`` (the steady state) read no journal without evidence."""
    action, to = ("lost", P.LOST) if row.phase == P.SUSPECT else ("suspect", P.SUSPECT)
    evidence: dict[str, Any] | None = None
    if row.phase in (P.ADMITTED, P.SERVING):
        evidence = termination_evidence(row)
        if evidence is None:
            return False
    step_id, stored = _attempt(row, action)
    member = _uncommitted_answer(row, stored)
    if member is None:
        if evidence is None:
            evidence = termination_evidence(row)
        if evidence is None:
            return False
        member = _claim(ctx, row, action, evidence, step_id)
    advance(ctx, row, to, **_member_fields(member))
    return True


def _step_admitted(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    member = _read_member(ctx, row.instance_id)
    if member is not None and member.state == "ACTIVE" and member.eligible:
        advance(ctx, row, P.SERVING, **_member_fields(member))
        return True
    if _observe(ctx, row):
        return True
    return _wait(
        ctx,
        row,
        "gateway_member_state",
        member_state=member.state if member is not None else "absent",
        eligible=bool(member and member.eligible),
    )


def _step_serving(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    return _observe(ctx, row)


def _step_suspect(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """Evidence still there → lost. Gone (the registered pod vanished or no longer reports a
    termination) → drain it and retire it normally: a suspect never serves again."""
    if _observe(ctx, row):
        return True
    # A second drain (this instance was DRAINING or SEALED before it became suspect) has its
    # own step id: the first one's settled answer would otherwise be replayed.
    state = _gateway_step(
        ctx,
        row,
        attempt_step_id(row, "drain"),
        {},
        _member_path(ctx, row.instance_id, "drain"),
    )
    if state.outcome == "failed":
        raise _refusal(state)
    advance(ctx, row, P.DRAINING, **_member_fields(parse_member(state.result)))
    return True


# DRAINING, SEALED, RETIRING --------------------------------------------------------------------


def _wait_obligations(ctx: PoolContext, row: TrinoPoolInstance, obligations: Obligations) -> bool:
    """The waiting line for open obligations, with the counters the Gateway reported."""
    return _wait(
        ctx,
        row,
        "gateway_obligations",
        pending_requests=obligations.pending_requests,
        open_transactions=obligations.open_transactions,
        active_queries=obligations.active_queries,
        ready_to_seal=obligations.ready_to_seal,
        drained=obligations.drained,
    )


def _step_draining(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    # Health first (§3.1 DRAINING → SUSPECT): a dead coordinator's obligations never complete,
    # and there is no drain deadline. An unsettled seal is resolved before anything newer.
    if not _in_flight(row, "seal") and _observe(ctx, row):
        return True
    obligations = parse_obligations(
        ctx.gateway.get(_member_path(ctx, row.instance_id, "obligations"))
    )
    if not obligations.sealable:
        return _wait_obligations(ctx, row, obligations)
    if row.gateway_generation is None:
        _refresh_generation(ctx, row)
    # The generation recorded from the Gateway's member answer, never the obligations' one.
    body = {"expectedGeneration": int(row.gateway_generation or 0)}
    state = _gateway_step(
        ctx, row, attempt_step_id(row, "seal"), body, _member_path(ctx, row.instance_id, "seal")
    )
    if state.outcome == "failed":
        if state.refusal_code == "POOL_NOT_DRAINED":
            _wait_obligations(ctx, row, obligations)
            return True  # the seal was sent: this tick's one instance step (invariant 8)
        if state.refusal_code == "POOL_STALE_GENERATION":
            _refresh_generation(ctx, row)
            return True
        raise _refusal(state)
    advance(ctx, row, P.SEALED, **_member_fields(parse_member(state.result)))
    return True


def _step_sealed(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    # Health first (§3.1 SEALED → SUSPECT), unless the irreversible retire claim may already
    # have been applied (journalled, not refused): that is resolved first.
    if not _in_flight(row, "retire") and _observe(ctx, row):
        return True
    body = {"expectedGeneration": int(row.gateway_generation or 0)}
    state = _gateway_step(ctx, row, "retire", body, _member_path(ctx, row.instance_id, "retire"))
    if state.outcome == "failed":
        if state.refusal_code == "POOL_STALE_GENERATION":
            _refresh_generation(ctx, row)
            return True
        raise _refusal(state)
    member = parse_member(state.result)
    advance(
        ctx,
        row,
        P.RETIRING,
        retirement_receipt=member.retirement_receipt or {},
        **_member_fields(member),
    )
    return True


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
    from trino_pools.operator import LeadershipLost

    lost_with_receipt = row.phase == P.LOST and isinstance(row.retirement_receipt, dict)
    if not phases.deletion_permitted(row.phase) and not lost_with_receipt:
        raise InstanceError(f"refusing to delete the objects of {row.instance_id} in {row.phase}")
    namespace = _namespace(row)
    plan = instantiate.delete_plan(_inventory(row), instance_id=row.instance_id)
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
            operation_id=operation_id(row.instance_id),
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
        return True  # DELETEs went out: this tick's one instance step (invariant 8)
    if outcome == PRESENT:
        return _wait(ctx, row, "kubernetes_resources")
    return finish()


def _retired(ctx: PoolContext, row: TrinoPoolInstance, to: str) -> bool:
    """Resources are gone: MemberRetired(resourcesAbsent) → close the operation → CAS ``to``."""
    state = _gateway_step(
        ctx,
        row,
        "retired",
        {"resourcesAbsent": True},
        _member_path(ctx, row.instance_id, "retired"),
    )
    if state.outcome == "failed":
        raise _refusal(state)
    fields = _member_fields(parse_member(state.result)) if isinstance(state.result, dict) else {}
    # The member is RETIRED at the Gateway: its backend record goes before the terminal CAS, so
    # a terminal row never leaves a record behind (a failure here retries from this point).
    delete_backend(ctx, row)
    effects.close_operation(ctx.auth, operation_id(row.instance_id), "retired")
    advance(ctx, row, to, **fields)
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
    stored = effects.load_step(operation_id(row.instance_id), BACKEND_DELETE_STEP)
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
        operation_id=operation_id(row.instance_id),
        kind="retire",
        step_id=BACKEND_DELETE_STEP,
        body={"name": name},
        call=call,
        read_back=read_back,
    )
    if state.outcome == "failed":
        raise _refusal(state)


def _step_retiring(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    return _delete_then(ctx, row, lambda: _retired(ctx, row, P.RETIRED))


# LOST, FAILED_PREPARING: failure retirement ----------------------------------------------------


def _failure_evidence(row: TrinoPoolInstance) -> dict[str, Any]:
    evidence = termination_evidence(row)
    if evidence is not None:
        return evidence
    reason = row.failure_reason or "the candidate failed before admission"
    return {
        "podUid": row.coordinator_pod_uid,
        "bootId": row.coordinator_boot_id,
        "nodeId": row.coordinator_node_id,
        "coordinatorId": row.coordinator_id,
        "observation": f"candidate failed before admission: {reason}"[:500],
        "observedAt": row.phase_changed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if row.phase_changed_at is not None
        else datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _step_lost(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    if not isinstance(row.retirement_receipt, dict):
        # The Gateway's failure receipt is its irreversible record of the loss: only with it
        # may the objects of an instance that once served be deleted (invariant 6).
        path = _member_path(ctx, row.instance_id, "failure-receipt")
        receipt = parse_failure_receipt(ctx.gateway.get(path))
        _update(
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


def _step_failed_preparing(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """Walk the member out, then delete; fail closed on anything the protocol does not expect.

    Objects are deleted only when the Gateway has no member and the ``register`` step is
    settled refused or was never journalled (the candidate was provably never admitted), or
    when the member is ``LOST`` (its irreversible loss claim; ``RETIRED`` after a lost
    ``retired`` answer). An unsettled ``register`` is resolved first (read-back, else the
    stored registration re-sent byte for byte) so a late-landing registration cannot leave an
    orphan member; a registered member is then walked out. Any other member state is an
    error naming it (recorded on the row, retried next tick).
    """
    member = _read_member(ctx, row.instance_id)  # None: not registered (now)
    if member is None:
        register = effects.load_step(operation_id(row.instance_id), "register")
        if register is not None and register.outcome in ("pending", "unknown"):
            state = _gateway_step(
                ctx,
                row,
                "register",
                effects.business_body(register.payload),
                GatewayClient.pool_path(ctx.cell.routing_group, "members"),
            )
            if state.outcome == "ok":
                registered = parse_member(state.result)
                _update(ctx, row, **_member_identity(registered), **_member_fields(registered))
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
            _update(ctx, row, **_member_identity(member))
        claimed = _claim(ctx, row, step_id, _failure_evidence(row))
        _update(ctx, row, **_member_fields(claimed))
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
    effects.close_operation(ctx.auth, operation_id(row.instance_id), "failed")
    advance(ctx, row, P.FAILURE_RETIRED)
    return True


_HANDLERS: dict[str, Callable[[Any, TrinoPoolInstance], bool]] = {
    P.PENDING: _step_pending,
    P.CREATING: _step_creating,
    P.PREPARING: _step_preparing,
    P.VALIDATING: _step_validating,
    P.ADMITTED: _step_admitted,
    P.SERVING: _step_serving,
    P.SUSPECT: _step_suspect,
    P.DRAINING: _step_draining,
    P.SEALED: _step_sealed,
    P.RETIRING: _step_retiring,
    P.LOST: _step_lost,
    P.FAILED_PREPARING: _step_failed_preparing,
}
