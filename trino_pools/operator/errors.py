"""The pool tick's control-flow exceptions (spec trino-pools §4.3, §4.4, §4.6, §4.11).

``LeadershipLost`` ends every term of the process at once (the tick stops). A fence refusal is
not one of these: it is ``authority.PoolConflict`` (or the catalog writer's ``WriterFenced``)
and ends only its pool's term. The others stay inside one pool's tick: a stale or invalid
desired configuration freezes the pool, an instance error is recorded on its row and the sweep
moves on, an admission error puts its tenant in backoff.
"""

from __future__ import annotations


class LeadershipLost(Exception):
    """The ``trino`` lease was lost or its renew deadline passed: stop at once."""


class StaleGeneration(Exception):
    """The desired configuration's generation is older than the stored one."""


class ConfigureMismatch(Exception):
    """The Gateway's answer to the pool configuration does not echo every requested setting."""


class InstanceError(Exception):
    """One instance's step failed; recorded on the row and the sweep moves on."""


class PhaseChanged(InstanceError):
    """The phase CAS found another phase: someone else moved the instance."""


class AdmissionError(Exception):
    """A tenant step failed for a reason that is not a Gateway answer (probe, protocol)."""


class RowChanged(Exception):
    """A publication row changed under this term (compare-and-set lost)."""
