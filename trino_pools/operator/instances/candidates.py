"""The candidate phases of an instance: ``PENDING``, ``CREATING``, ``PREPARING``, ``VALIDATING``
(spec trino-pools §3.1, §4.6, §4.7, §4.12).

Invariants:

1. **The instance's own snapshot.** ``PENDING`` builds the five objects from the row's blueprint
   snapshot, never the current blueprint, in one durable step ``k8s.create`` whose journalled
   body is the five full documents: a re-send (same or newer term) creates exactly the stored
   documents, with the original term's epoch annotation; objects that already exist are adopted
   by the 409 path (this instance's labels and spec digest).
2. **Identity as the Gateway recorded it.** ``bootId`` = the coordinator's ``processId`` (never
   the pod UID, safeguard 19); node id and coordinator id are stored from the Gateway's member
   record, also when a lost registration response is adopted by reading the member back
   (safeguard 20); every register sends ``repairFor`` (``""`` for a normal create, safeguard 22).
3. **Backend records are added inactive**; an existing active or mismatching record is refused
   (only admit activates a member's record).
4. **Admit and the generation** (safeguard 25): the admit body carries ``expectedGeneration`` =
   the generation recorded at registration, which does not change while the instance is
   ``VALIDATING`` (the member stays ``PREPARING`` at the Gateway), so a retry after a lost
   response re-sends the identical stored payload (or settles by read-back) and the Gateway —
   which excludes ``expectedGeneration`` from its intent hash — answers it as a replay. Only a
   refusal (which applied nothing) can lead to a body with another generation, and then it is a
   new attempt of the same step. ``POOL_PUBLICATION_BARRIER`` releases the live tenant barrier
   (``admission.release_barrier``); the admit is retried on a later tick.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from duckgres_admin.lib import k8s
from duckgres_admin.lib.gateway import GatewayClient, Member, parse_backends, parse_member
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance, clip_status_message
from trino_pools import effects, instantiate, probes
from trino_pools.blueprint import BlueprintError
from trino_pools.operator import admission
from trino_pools.operator.context import PoolContext
from trino_pools.operator.errors import InstanceError
from trino_pools.operator.instances import base, evidence
from trino_pools.operator.instances.plan import spec_outdated

P = InstancePhase
_log = logging.getLogger("duckgres.trino.instances")

SUPERSEDED = "candidate blueprint was superseded before admission"

# Register refusals after which the candidate can never join: fail it (and clean it up).
FATAL_REGISTER_REFUSALS = frozenset(
    {"POOL_IDENTITY_CONFLICT", "POOL_VALIDATION", "POOL_IRREVERSIBLE", "POOL_PHASE"}
)


def fail_candidate(ctx: PoolContext, row: TrinoPoolInstance, reason: str) -> None:
    base.advance(ctx, row, P.FAILED_PREPARING, failure_reason=clip_status_message(reason))
    _log.warning(
        "Trino pool candidate failed: %s",
        reason,
        extra={"pool": ctx.cell.id, "instance": row.instance_id, "epoch": ctx.auth.epoch},
    )


# PENDING ---------------------------------------------------------------------------------------


def step_pending(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    namespace = base.namespace(row)
    try:
        docs = instantiate.instance_objects(
            row.instance_id,
            ctx.cell.id,
            ctx.cell.routing_group,
            base.snapshot(row),
            ctx.auth.epoch,
        )
    except (instantiate.InstanceSpecError, BlueprintError) as exc:
        # The instance's own snapshot can never produce objects: nothing was created.
        fail_candidate(ctx, row, f"the instance snapshot cannot be instantiated: {exc}")
        return True
    ctx.ensure_leading()
    state = effects.run_step(
        ctx.auth,
        operation_id=base.operation_id(row.instance_id),
        kind=base.operation_kind(row),
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
        base.advance(
            ctx,
            row,
            P.FAILED_PREPARING,
            failure_reason=clip_status_message(f"Kubernetes refused the objects: {message}"),
        )
        return True
    created = state.result if isinstance(state.result, dict) else {}
    fields: dict[str, Any] = {}
    for key, (name_f, uid_f) in base.INVENTORY_FIELDS.items():
        pair = created.get(key)
        if not pair:
            raise InstanceError(f"instantiation recorded no {key} for {row.instance_id}")
        fields[name_f], fields[uid_f] = str(pair[0]), str(pair[1])
    base.advance(ctx, row, P.CREATING, **fields)
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


def _adopt_member(ctx: PoolContext, row: TrinoPoolInstance, member: Member) -> None:
    """Record the Gateway's member identity (as the Gateway recorded it) and → PREPARING."""
    container_id = row.coordinator_container_id
    if not container_id:
        pod = evidence.coordinator_pod(row) if not row.coordinator_pod_uid else None
        if pod is not None and (pod.get("metadata") or {}).get("uid") == member.pod_uid:
            container_id = str(evidence.container_status(row, pod).get("containerID") or "")
    base.advance(
        ctx,
        row,
        P.PREPARING,
        coordinator_pod_uid=member.pod_uid,
        coordinator_boot_id=member.boot_id,
        coordinator_node_id=member.node_id,
        coordinator_id=member.coordinator_id,
        coordinator_container_id=container_id,
        **base.member_fields(member),
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
        operation_id=base.operation_id(row.instance_id),
        kind=base.operation_kind(row),
        step_id="backend",
        body=wanted,
        call=lambda payload: ctx.gateway.send(
            "POST", GatewayClient.BACKEND_ADD, effects.canonical(effects.business_body(payload))
        ),
        read_back=read_back,
    )
    if state.outcome == "failed":
        raise base.refusal(state)


def step_creating(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    member = base.read_member(ctx, row.instance_id)
    if member is not None:
        # Registered already (a lost registration response): adopt what the Gateway recorded.
        _adopt_member(ctx, row, member)
        return True
    namespace = base.namespace(row)
    try:
        coordinator_ready, ready_workers, desired_workers = instantiate.workers_ready(
            namespace, row.instance_id
        )
    except k8s.KubeError as exc:
        if exc.status != 404:
            raise
        fail_candidate(ctx, row, f"an instance Deployment is missing: {exc}")
        return True
    if not (coordinator_ready and desired_workers > 0 and ready_workers == desired_workers):
        return base.wait(
            ctx,
            row,
            "kubernetes_readiness",
            coordinator_ready=coordinator_ready,
            ready_workers=ready_workers,
            desired_workers=desired_workers,
        )
    pod = evidence.coordinator_pod(row)
    if pod is None:
        return base.wait(ctx, row, "coordinator_pod")
    pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
    container_id = str(evidence.container_status(row, pod).get("containerID") or "")
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
    state = base.gateway_step(
        ctx, row, "register", body, GatewayClient.pool_path(ctx.cell.routing_group, "members")
    )
    if state.outcome == "failed":
        code = state.refusal_code
        if code in FATAL_REGISTER_REFUSALS:
            base.advance(
                ctx,
                row,
                P.FAILED_PREPARING,
                failure_reason=clip_status_message(f"the Gateway refused registration: {code}"),
            )
            return True
        raise base.refusal(state)
    member = parse_member(state.result)
    base.advance(
        ctx,
        row,
        P.PREPARING,
        coordinator_pod_uid=member.pod_uid or pod_uid,
        coordinator_boot_id=member.boot_id or process_id,
        # As the Gateway recorded them (safeguard 20).
        coordinator_node_id=member.node_id,
        coordinator_id=member.coordinator_id,
        coordinator_container_id=container_id,
        **base.member_fields(member),
    )
    return True


# PREPARING -------------------------------------------------------------------------------------


def _validator(ctx: PoolContext) -> probes.Validator:
    if ctx.term.validator is None:
        ctx.term.validator = probes.Validator()
    return ctx.term.validator


def step_preparing(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    if spec_outdated(ctx, row):
        fail_candidate(ctx, row, SUPERSEDED)
        return True
    namespace = base.namespace(row)
    _, ready_workers, _ = instantiate.workers_ready(namespace, row.instance_id)
    pod = evidence.coordinator_pod(row)
    if pod is None:
        fail_candidate(ctx, row, probes.RESTARTED + " (the registered coordinator pod is gone)")
        return True
    validation = probes.ValidationContext(
        instance_id=row.instance_id,
        endpoint_url=row.endpoint_url or "",
        namespace=namespace,
        image=str(base.blueprint_raw(row).get("image") or ""),
        worker_image="",
        ready_workers=ready_workers,
        publication_revision=int(ctx.pool.publication_revision or 0),
        registered_process_id=row.coordinator_boot_id,
        pod_uid=row.coordinator_pod_uid,
        config_revision=row.release_id,
        running_image=evidence.running_image(row, pod),
        registered_node_id=row.coordinator_node_id,
        registered_coordinator_id=row.coordinator_id,
    )
    result = _validator(ctx).step(validation)
    if result.done and result.receipt is not None:
        base.advance(
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
        fail_candidate(ctx, row, result.error or probes.RESTARTED)
        return True
    if result.error:
        raise InstanceError(f"validation pass failed (a new pass starts): {result.error}")
    return True  # the pass issued its requests this tick and resumes on the next one


# VALIDATING ------------------------------------------------------------------------------------


def step_validating(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    receipt = row.validation_receipt if isinstance(row.validation_receipt, dict) else None
    if receipt is None or row.gateway_generation is None:
        base.advance(ctx, row, P.PREPARING, validation_receipt=None, validated_at=None)
        return True
    body = {"expectedGeneration": int(row.gateway_generation), "receipt": receipt}
    state = base.gateway_step(
        ctx, row, "admit", body, base.member_path(ctx, row.instance_id, "admit")
    )
    if state.outcome == "failed":
        code = state.refusal_code
        if code == "POOL_PUBLICATION_BARRIER":
            admission.release_barrier(ctx, admission.CANDIDATE_REASON)
            return True
        if code == "POOL_NOT_CERTIFIED":
            base.advance(ctx, row, P.PREPARING, validation_receipt=None, validated_at=None)
            return True
        if code == "POOL_STALE_GENERATION":
            base.refresh_generation(ctx, row)
            return True
        raise base.refusal(state)
    member = parse_member(state.result) if isinstance(state.result, dict) else None
    if member is None:  # a replay without a body: read the member back
        member = base.read_member(ctx, row.instance_id)
    fields = base.member_fields(member) if member is not None else {}
    base.advance(ctx, row, P.ADMITTED, **fields)
    return True
