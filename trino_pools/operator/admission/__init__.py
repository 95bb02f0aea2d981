"""Tenant admission of a shared Trino pool (spec trino-pools §4.11, §4.16 tenants/publications).

Runs once per pool tick (``run(ctx)``) and only when the pool's ``tenant_admission`` is true;
the instance lifecycle calls ``release_barrier`` when an admit is refused with
``POOL_PUBLICATION_BARRIER``. Modules (each states its own invariants):

- ``publications``: the per-org publication row (fenced compare-and-set writes), the
  identities (operation, occurrence, target, publication and step ids), backoff, the tenants;
- ``stages``: the pass — revision evidence first, then at most one external tenant step in the
  §4.11 priority order, the barrier's receipts and commit, intents and their settlement.
"""

from __future__ import annotations

from trino_pools.operator.admission.publications import (
    Row,
    Tenant,
    backoff_delay,
    binding_of,
    load_rows,
    occurrence,
    open_payload_hash,
    operation_id,
    publication_id,
    receipt_step,
    step_id,
    target_revision,
    wanted_tenants,
)
from trino_pools.operator.admission.stages import (
    BACKOFF_REASON,
    BASIS_CHANGED_REASON,
    BASIS_UNKNOWN_REASON,
    BINDING_CHANGED_REASON,
    CANDIDATE_REASON,
    IN_FLIGHT_REASON,
    MEMBERSHIP_REASON,
    OPERATION_KIND,
    REVOKE_REASON,
    release_barrier,
    run,
)
from trino_pools.operator.errors import AdmissionError, RowChanged

__all__ = [
    "BACKOFF_REASON",
    "BASIS_CHANGED_REASON",
    "BASIS_UNKNOWN_REASON",
    "BINDING_CHANGED_REASON",
    "CANDIDATE_REASON",
    "IN_FLIGHT_REASON",
    "MEMBERSHIP_REASON",
    "OPERATION_KIND",
    "REVOKE_REASON",
    "AdmissionError",
    "Row",
    "RowChanged",
    "Tenant",
    "backoff_delay",
    "binding_of",
    "load_rows",
    "occurrence",
    "open_payload_hash",
    "operation_id",
    "publication_id",
    "receipt_step",
    "release_barrier",
    "run",
    "step_id",
    "target_revision",
    "wanted_tenants",
]
