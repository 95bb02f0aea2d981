"""Instance lifecycle of a shared Trino pool (spec trino-pools §3.1, §4.5 create/drain, §4.6).

The operator's tick calls ``progress(ctx, rows, errors)`` (step 10) and, when nothing progressed,
``apply_plan(ctx, rows)`` (step 11). Both work on the durable instance rows only. Every Gateway
mutation and the Kubernetes creates and deletes are durable steps of the operation
``instance:<id>`` (``trino_pools.effects``; steps ``k8s.create``, ``backend``, ``register``,
``admit``, ``drain``, ``seal``, ``suspect``, ``lost``, ``retire``, ``k8s.delete``, ``retired``,
``backend.delete``; a repeated ``drain``, ``seal`` or ``suspect`` after a ``SUSPECT`` detour is
``<step>.g<generation>``), journalled before the call and resolved by read-back when unknown.

Modules (each states its own invariants):

- ``base``: the row and its member — snapshot reads, the fenced phase CAS (``advance``) and
  updates, error and wait records, the instance's durable Gateway step;
- ``plan``: planner inputs and the lifecycle actions, create (intent before effect) and drain;
- ``sweep``: one step per tick, per-instance isolation, the phase → handler table;
- ``candidates``: ``PENDING``, ``CREATING``, ``PREPARING``, ``VALIDATING`` (objects from the
  instance's own snapshot, identity as the Gateway recorded it, validation, admit);
- ``evidence``: the registered coordinator's pod, termination evidence, suspect/lost claims and
  their attempts, the health observation;
- ``serving``: ``ADMITTED``, ``SERVING``, ``SUSPECT``;
- ``draining``: ``DRAINING``, ``SEALED`` (drain by obligations only, the retire claim);
- ``teardown``: ``RETIRING``, ``LOST``, ``FAILED_PREPARING``, the guarded deletes and the
  backend record delete.
"""

from __future__ import annotations

from trino_pools.operator.errors import InstanceError, PhaseChanged
from trino_pools.operator.instances.base import (
    ADVANCED,
    RETIRED_MESSAGE,
    advance,
    operation_id,
    record_error,
)
from trino_pools.operator.instances.candidates import FATAL_REGISTER_REFUSALS, SUPERSEDED
from trino_pools.operator.instances.evidence import (
    attempt_step_id,
    coordinator_pod,
    termination_evidence,
)
from trino_pools.operator.instances.plan import (
    CREATED_MESSAGE,
    apply_plan,
    create,
    drain,
    instance_views,
    pool_desired,
    spec_outdated,
)
from trino_pools.operator.instances.sweep import HANDLERS, progress, step
from trino_pools.operator.instances.teardown import (
    ABSENT,
    PRESENT,
    SENT,
    delete_backend,
    delete_resources,
)

__all__ = [
    "ABSENT",
    "ADVANCED",
    "CREATED_MESSAGE",
    "FATAL_REGISTER_REFUSALS",
    "HANDLERS",
    "PRESENT",
    "RETIRED_MESSAGE",
    "SENT",
    "SUPERSEDED",
    "InstanceError",
    "PhaseChanged",
    "advance",
    "apply_plan",
    "attempt_step_id",
    "coordinator_pod",
    "create",
    "delete_backend",
    "delete_resources",
    "drain",
    "instance_views",
    "operation_id",
    "pool_desired",
    "progress",
    "record_error",
    "spec_outdated",
    "step",
    "termination_evidence",
]
