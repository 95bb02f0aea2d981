"""The shared-pool operator (spec trino-pools §4.3-§4.13): the pool tick and its steps.

One ``Operator`` lives in the trino worker process; beat calls ``trino.pool_tick`` every 5 s and
the task calls ``operator().tick()``. The package is layered, top to bottom (import-linter
enforces it; nothing imports upwards and there is no cycle):

- ``tick``: the ``Operator`` — leadership, terms, one tick over every pool; the process-wide
  operator (``operator()``, ``installed()``, ``shutdown()``);
- ``pool``: the pool's own steps — the seed and fenced pool-row writes (freeze, thaw, spec),
  the Gateway pool configuration, the bounded instance listing and the metrics snapshot;
- ``instances``: the instance lifecycle (the sweep, create/drain, one module per phase group,
  evidence and teardown apart);
- ``admission``: tenant admission (``publications``: the rows and identities; ``stages``: the
  pass);
- ``gateway_step``: the durable Gateway step with its journal read-back, and the one refusal
  converter;
- ``context``: the typed term (``PoolTerm``, ``AdmissionMemory``) and ``PoolContext`` (with
  ``ensure_leading`` as a callable, never the operator);
- ``errors``: the tick's exceptions (``LeadershipLost`` …).

This module only re-exports the public names.
"""

from __future__ import annotations

from trino_pools.operator.context import (
    AdmissionMemory,
    CredentialSource,
    PoolContext,
    PoolTerm,
)
from trino_pools.operator.errors import (
    AdmissionError,
    ConfigureMismatch,
    InstanceError,
    LeadershipLost,
    PhaseChanged,
    RowChanged,
    StaleGeneration,
)
from trino_pools.operator.pool import (
    configure_gateway_pool,
    freeze,
    list_instances,
    record_snapshot,
    seed_pool,
    thaw,
    upsert_spec,
)
from trino_pools.operator.tick import (
    GatewayFactory,
    Operator,
    TickReport,
    default_gateway,
    installed,
    operator,
    read_token,
    shutdown,
)

__all__ = [
    "AdmissionError",
    "AdmissionMemory",
    "ConfigureMismatch",
    "CredentialSource",
    "GatewayFactory",
    "InstanceError",
    "LeadershipLost",
    "Operator",
    "PhaseChanged",
    "PoolContext",
    "PoolTerm",
    "RowChanged",
    "StaleGeneration",
    "TickReport",
    "configure_gateway_pool",
    "default_gateway",
    "freeze",
    "installed",
    "list_instances",
    "operator",
    "read_token",
    "record_snapshot",
    "seed_pool",
    "shutdown",
    "thaw",
    "upsert_spec",
]
