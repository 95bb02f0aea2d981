"""A pool's term and the context one pool tick hands to its steps (spec trino-pools §4.3, §4.4).

A **term** (``PoolTerm``) is one continuous leadership run over one pool in this process: it
starts with a fresh authority epoch and ends when the lease is lost, on worker shutdown or on a
fence refusal. Everything the tick remembers between ticks lives here, typed, and dies with the
term: nothing in it is ever carried into a newer term (a newer term starts from the durable rows
and the journals). In particular the admission memory holds the only proof of a barrier's basis
(the catalog revision it was opened at): a barrier whose basis this term does not know is
released, never committed (safeguard 29).

``PoolContext`` is what one pool's tick hands to the configuration, admission and instance
steps. It carries ``ensure_leading`` — the process's renew-before-effect check, which raises
``LeadershipLost`` once acting is no longer allowed — and never the operator itself: a step
cannot start or end terms, only stop by raising.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from duckgres_admin.lib.gateway import GatewayClient
from duckgres_admin.models.trino import TrinoPool
from trino_pools import config, probes, term_metrics
from trino_pools.authority import Authority
from trino_pools.desired import Desired
from trino_pools.registry import Cell
from trino_pools.waitlog import WaitLog

#: ``namespace -> (username, password)`` of the pool's observer principal.
CredentialSource = Callable[[str], probes.Credential]


@dataclass
class AdmissionMemory:
    """Tenant admission's term memory (spec §4.11; ``trino_pools.operator.admission``)."""

    #: Round-robin cursor per category (``pending``, ``revoke``, ``publish``, ``open``): the org
    #: chosen last, so one failing tenant never monopolises a category (safeguard 28).
    cursors: dict[str, str] = field(default_factory=dict)
    #: Which of publish-a-binding / open-a-barrier goes first on the next pass (they alternate).
    turn: Literal["publish", "open"] = "publish"
    #: Publication id -> the catalog revision this term opened the barrier at (its basis).
    basis: dict[str, int] = field(default_factory=dict)


@dataclass
class PoolTerm:
    """One continuous leadership run over one pool in this process."""

    pool_id: str
    auth: Authority
    metrics_token: term_metrics.TermToken
    started_mono: float
    validator: probes.Validator | None = None  # created lazily by the PREPARING step
    waitlog: WaitLog = field(default_factory=WaitLog)
    #: The Gateway pool configuration (§4.4 step 7): the attempt counter of its step ids, the
    #: business hash the Gateway last confirmed, and an unsettled request of this term (step id,
    #: body) that is re-sent identically before any newer payload.
    configure_seq: int = 0
    configured_hash: str = ""
    configure_pending: tuple[str, dict[str, Any]] | None = None
    admission: AdmissionMemory = field(default_factory=AdmissionMemory)
    #: Test hook: the observer credential source of the admission receipt probes. ``None`` (the
    #: production value) reads the pool's Secret through ``probes.observer_credential``; tests
    #: set a fixed credential instead of creating the Secret.
    observer_credentials: CredentialSource | None = None


@dataclass
class PoolContext:
    """Everything one pool's tick needs; handed to the configuration, admission and instance
    steps. ``ensure_leading`` renews the lease before an effect (``LeadershipLost`` past it)."""

    ensure_leading: Callable[[], None]
    settings: config.TrinoSettings
    cell: Cell
    desired: Desired
    term: PoolTerm
    gateway: GatewayClient
    pool: TrinoPool

    @property
    def auth(self) -> Authority:
        return self.term.auth

    def log_extra(self, **fields: Any) -> dict[str, Any]:
        return {"pool_id": self.auth.pool_id, "epoch": self.auth.epoch, **fields}
