"""The one ownership rule of a reshard operation (spec reshard §1 inv. 4, §4.1, §4.13, §4.15).

An active operation **has an owner** exactly while it is ``running`` with a heartbeat younger
than the stale window (``DUCKGRES_RESHARD_STALE_SECONDS``). Every other active operation —
``pending``, or ``running`` with a null heartbeat (the janitor released it after seeing its
runner dead) or a stale one — **needs an owner**: a runner may claim it. A terminal operation
never has an owner again. Always judged by the config store's clock (``now()``), never a
process's.

Three parties decide on this rule, and they must never disagree about who owns an op:

- the runner's claim (``reshard.runner.fencing.claim``): its compare-and-set takes the op
  exactly when :data:`NEEDS_OWNER_SQL` holds;
- the launch task (``reshard.control.launch``) starts a runner only for an op it holds for;
- the janitor (``reshard.control.janitor``) lists, respawns and force-fails only ops for which
  :data:`NEEDS_RUNNER_SQL` holds — the same rule, except that a ``pending`` op is left to the
  launch task for the pending grace (``DUCKGRES_RESHARD_PENDING_GRACE_SECONDS``) — and every
  one of its compare-and-sets re-checks that predicate, so each write re-checks exactly what
  its decision was based on.

So every one of them composes the fragments below; none spells the predicate itself. Each
fragment is a parenthesised boolean SQL expression over the columns of
``duckgres_reshard_operations`` with ``%s`` placeholders, bound by the matching ``*_params``.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

# Pending, or running with a null or stale heartbeat. Parameter: the stale window in seconds.
NEEDS_OWNER_SQL = (
    "(state = 'pending' OR (state = 'running' AND (heartbeat_at IS NULL"
    " OR heartbeat_at < now() - make_interval(secs => %s))))"
)

# The janitor's "needs a runner": needs an owner, and not a pending op still within its grace.
# Parameters: the stale window, then the pending grace, in seconds.
NEEDS_RUNNER_SQL = (
    f"({NEEDS_OWNER_SQL}"
    " AND NOT (state = 'pending' AND created_at >= now() - make_interval(secs => %s)))"
)


def stale_seconds(override: int | None = None) -> int:
    """The stale window: ``override`` when given, else ``DUCKGRES_RESHARD_STALE_SECONDS``."""
    return int(settings.DUCKGRES_RESHARD_STALE_SECONDS if override is None else override)


def needs_owner_params(stale: int | None = None) -> list[int]:
    """The parameters of :data:`NEEDS_OWNER_SQL`."""
    return [stale_seconds(stale)]


def needs_runner_params() -> list[int]:
    """The parameters of :data:`NEEDS_RUNNER_SQL`."""
    return [*needs_owner_params(), int(settings.DUCKGRES_RESHARD_PENDING_GRACE_SECONDS)]


def needs_owner() -> RawSQL:
    """:data:`NEEDS_OWNER_SQL` as a boolean annotation (the launch check)."""
    return RawSQL(  # noqa: S611 - constant SQL, bound params
        NEEDS_OWNER_SQL, needs_owner_params(), output_field=BooleanField()
    )


def needs_runner() -> RawSQL:
    """:data:`NEEDS_RUNNER_SQL` as a boolean annotation (the janitor's listing and re-check)."""
    return RawSQL(  # noqa: S611 - constant SQL, bound params
        NEEDS_RUNNER_SQL, needs_runner_params(), output_field=BooleanField()
    )
