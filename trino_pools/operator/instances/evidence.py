"""Health evidence and member claims of a shared-pool instance (spec trino-pools §3.1, §4.6, §4.7).

Invariants:

1. **Health by evidence only.** ``ADMITTED``/``SERVING``/``DRAINING``/``SEALED`` are
   health-watched (a dead coordinator's obligations never complete, so a draining instance
   would otherwise wait forever) and become ``SUSPECT`` only with termination evidence from the
   registered coordinator pod's container status: the current container terminated, or the
   container recorded at registration terminated or was replaced — never a ``lastState`` of an
   earlier container (a crash during startup, before registration). A ``SUSPECT`` with evidence
   becomes ``LOST``; nothing returns to ``SERVING``.
2. **A claim the Gateway applied is completed.** In ``SUSPECT``, ``DRAINING`` and ``SEALED`` a
   settled claim whose phase CAS never committed (its answer's generation is above the recorded
   one) is that attempt and is completed, whatever the evidence says now; ``ADMITTED`` and
   ``SERVING`` (the steady state) read no journal without evidence.
3. **Repeated actions are new steps.** A settled step is a replay (§4.7), so a member action a
   lifecycle needs twice (``drain``, ``seal``, ``suspect``) gets its own step id
   ``<step>.g<generation>`` (``attempt_step_id``), stable until the phase CAS records the
   Gateway's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from duckgres_admin.base.times import rfc3339_seconds
from duckgres_admin.lib import k8s
from duckgres_admin.lib.gateway import Member, parse_member
from duckgres_admin.models.trino import InstancePhase, TrinoPoolInstance
from trino_pools import effects
from trino_pools.blueprint import INSTANCE_LABEL
from trino_pools.operator.context import PoolContext
from trino_pools.operator.instances import base

P = InstancePhase


# --- the registered coordinator pod ----------------------------------------------------------


def coordinator_pod(row: TrinoPoolInstance) -> dict[str, Any] | None:
    """The instance's coordinator pod (newest, by the identity binding labels), or None."""
    component_label = str(base.identity(row).get("component_label") or "")
    if not component_label:
        return None
    pods = k8s.list_pods(
        base.namespace(row), f"{INSTANCE_LABEL}={row.instance_id},{component_label}=coordinator"
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


def container_status(row: TrinoPoolInstance, pod: Mapping[str, Any]) -> dict[str, Any]:
    name = str(base.identity(row).get("coordinator_container_name") or "")
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(status, dict) and status.get("name") == name:
            return status
    return {}


def running_image(row: TrinoPoolInstance, pod: Mapping[str, Any]) -> str:
    status = container_status(row, pod)
    if status.get("image"):
        return str(status["image"])
    name = str(base.identity(row).get("coordinator_container_name") or "")
    for container in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(container, dict) and container.get("name") == name:
            return str(container.get("image") or "")
    return ""


# --- termination evidence --------------------------------------------------------------------


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
    status = container_status(row, pod)
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
        "observedAt": observed or rfc3339_seconds(datetime.now(UTC)),
    }


def failure_evidence(row: TrinoPoolInstance) -> dict[str, Any]:
    """The evidence a failed candidate's member is walked out with (termination, else the
    failure itself)."""
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
        "observedAt": rfc3339_seconds(row.phase_changed_at or datetime.now(UTC)),
    }


# --- claims and their attempts ---------------------------------------------------------------


def claim(
    ctx: PoolContext,
    row: TrinoPoolInstance,
    action: str,
    evidence: dict[str, Any],
    step_id: str | None = None,
) -> Member:
    """``SuspectMember`` / ``LostMember`` with ``evidence`` (durable step ``action``)."""
    state = base.gateway_step(
        ctx,
        row,
        step_id or action,
        {"evidence": evidence},
        base.member_path(ctx, row.instance_id, action),
    )
    if state.outcome == "failed":
        raise base.refusal(state)
    return parse_member(state.result)


def _answer_generation(result: Any) -> int | None:
    generation = result.get("generation") if isinstance(result, dict) else None
    if isinstance(generation, bool) or not isinstance(generation, int):
        return None
    return generation


def attempt_step_id(row: TrinoPoolInstance, action: str) -> str:
    """The step id of this attempt of a member action that a lifecycle may repeat.

    ``drain``, ``seal`` and ``suspect`` can be needed twice: an instance that went ``DRAINING``
    or ``SEALED → SUSPECT`` and lost its evidence is drained again, and one that was drained
    from ``SUSPECT`` may become suspect again. A settled step is a replay (§4.7), so a repeated
    action needs its own step id. The first attempt is ``action``. A settled ``action`` whose
    answer's generation is above the row's recorded generation was never recorded on the row
    (its phase CAS did not happen): it *is* this attempt and is replayed. Otherwise that
    attempt is complete and this one is ``<action>.g<recorded generation>`` — stable until the
    phase CAS records the answer, because only the Gateway's answers change that generation.
    """
    return _attempt(row, action)[0]


def _attempt(row: TrinoPoolInstance, action: str) -> tuple[str, effects.StepState | None]:
    """``attempt_step_id`` and that step's journal row (one query unless ``action`` is done)."""
    stored = effects.load_step(base.operation_id(row.instance_id), action)
    if stored is None or stored.outcome != "ok":
        return action, stored
    answered = _answer_generation(stored.result)
    recorded = row.gateway_generation
    if answered is None or recorded is None or answered > recorded:
        return action, stored
    step_id = f"{action}.g{recorded}"
    return step_id, effects.load_step(base.operation_id(row.instance_id), step_id)


def _uncommitted_answer(row: TrinoPoolInstance, stored: effects.StepState | None) -> Member | None:
    """The Gateway's answer to a settled step whose phase CAS never committed, else None."""
    if stored is None or stored.outcome != "ok" or not isinstance(stored.result, dict):
        return None
    answered = _answer_generation(stored.result)
    recorded = row.gateway_generation
    if answered is not None and recorded is not None and answered <= recorded:
        return None
    return parse_member(stored.result)


def in_flight(row: TrinoPoolInstance, action: str) -> bool:
    """This attempt of ``action`` is journalled and not refused: pending, unknown, or applied
    without its phase CAS. It is finished before anything newer is claimed (§4.7 item 4)."""
    _, stored = _attempt(row, action)
    return stored is not None and stored.outcome in ("pending", "unknown", "ok")


# --- health observation ----------------------------------------------------------------------


def observe(ctx: PoolContext, row: TrinoPoolInstance) -> bool:
    """Health observation (invariant 1): ``SUSPECT`` → ``lost``, every other watched phase
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
        member = claim(ctx, row, action, evidence, step_id)
    base.advance(ctx, row, to, **base.member_fields(member))
    return True
