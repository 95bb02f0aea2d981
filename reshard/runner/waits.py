"""Bounded, cancel-aware waiting (spec reshard §4.1, §4.4; design §6 "every wait loop…").

Every wait announces its deadline, sleeps in slices of at most ``DUCKGRES_RESHARD_POLL_SECONDS``,
returns early on ``stop`` (raising :class:`Interrupted`), reads the cancel flag with a fresh
query when cancel-aware (a failed read counts as "not cancelled") and logs what it observes
about every 15 s. A wait's deadline also bounds the statements its observations send: it
extends the step's deadline (``RunContext.extend_deadline``), from which every store
connection's ``statement_timeout``/``lock_timeout`` is sized (safeguard reshard-67).

:func:`cancel_watch` covers the long statements that are not waits (the copy, ``pg_dump``):
while its body runs a helper thread reads the cancel flag, and an operator cancel before the
cutoff cancels the step's running statements and kills its children instead of waiting for
them to end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection

from duckgres_admin.models import ReshardOperation
from reshard.runner.context import RunContext
from reshard.runner.errors import Cancelled, Interrupted, StepError
from reshard.runner.logwriter import OpLogWriter

OBSERVATION_INTERVAL = 15.0


def cancel_requested(op_id: int) -> bool:
    """Fresh read of the cancel flag; a failed read counts as "not cancelled"."""
    try:
        flag = (
            ReshardOperation.objects.filter(id=op_id)
            .values_list("cancel_requested", flat=True)
            .first()
        )
    except DatabaseError:
        return False
    return bool(flag)


def hold(
    ctx: RunContext,
    oplog: OpLogWriter,
    seconds: float,
    *,
    purpose: str,
    cancel_aware: bool = True,
) -> None:
    """Let ``seconds`` elapse (a propagation wait): its end is success, not a timeout."""
    deadline = time.monotonic() + seconds
    ctx.extend_deadline(deadline)
    slice_seconds = float(settings.DUCKGRES_RESHARD_POLL_SECONDS)
    oplog.info(f"waiting {seconds:g} s {purpose} (deadline in {seconds:g} s)")
    next_observation = time.monotonic() + OBSERVATION_INTERVAL
    while True:
        if ctx.stop.is_set():
            raise Interrupted()
        if cancel_aware and cancel_requested(ctx.op_id):
            raise Cancelled()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if time.monotonic() >= next_observation:
            oplog.info(f"still waiting {purpose}: {remaining:.0f} s left, no cancel requested")
            next_observation = time.monotonic() + OBSERVATION_INTERVAL
        ctx.stop.wait(min(slice_seconds, remaining))


def rollback_deadline(ctx: RunContext, seconds: float) -> float:
    """A rollback wait's monotonic deadline, capped by the SIGTERM budget once a signal came
    (spec §4.2: the rollback must end within the pod's grace)."""
    deadline = time.monotonic() + seconds
    if ctx.sigterm_at is not None:
        deadline = min(deadline, ctx.sigterm_at + settings.DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS)
    return deadline


def poll_until(
    ctx: RunContext,
    oplog: OpLogWriter,
    seconds: float,
    observe: Callable[[], tuple[bool, str]],
    *,
    purpose: str,
    timeout_message: str,
    cancel_aware: bool = True,
    rollback: bool = False,
    interval: float | None = None,
) -> str:
    """Poll ``observe`` (→ (done, observation)) until done; returns the last observation.

    Announces the deadline, logs the observation about every 15 s, checks ``stop`` (not in
    ``rollback`` mode, whose deadline is capped by the SIGTERM budget instead) and the cancel
    flag when ``cancel_aware``; on timeout raises ``StepError`` with the last observation.
    """
    deadline = rollback_deadline(ctx, seconds) if rollback else time.monotonic() + seconds
    ctx.extend_deadline(deadline)
    pause = float(settings.DUCKGRES_RESHARD_POLL_SECONDS) if interval is None else interval
    oplog.info(f"waiting up to {seconds:g} s {purpose} (deadline in {seconds:g} s)")
    next_observation = time.monotonic() + OBSERVATION_INTERVAL
    last = "no observation yet"
    while True:
        if not rollback and ctx.stop.is_set():
            raise Interrupted()
        if ctx.fenced:
            raise Interrupted()
        if cancel_aware and not rollback and cancel_requested(ctx.op_id):
            raise Cancelled()
        previous = last
        done, last = observe()
        if done:
            return last
        if last != previous:
            oplog.info(f"observation ({purpose}): {last}")
        if rollback and ctx.sigterm_at is not None:
            # A SIGTERM that arrives during the wait caps it too (§4.2), not only one before it.
            deadline = min(
                deadline, ctx.sigterm_at + settings.DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if rollback and ctx.sigterm_at is not None:
                # §4.2: out of the SIGTERM budget — no verdict, no terminal write; a takeover
                # re-runs the (idempotent) rollback.
                raise Interrupted(
                    f"rollback ran out of the SIGTERM budget {purpose}; last observation: {last}"
                )
            raise StepError(f"{timeout_message}; last observation: {last}")
        if time.monotonic() >= next_observation:
            oplog.info(f"still waiting {purpose}: {remaining:.0f} s left; observed: {last}")
            next_observation = time.monotonic() + OBSERVATION_INTERVAL
        if rollback:
            time.sleep(min(pause, remaining))
        else:
            ctx.stop.wait(min(pause, remaining))


# How often a wait on background work looks at it (the work's end is seen at most this late).
BACKGROUND_SLICE_SECONDS = 0.2


def await_done(
    ctx: RunContext,
    oplog: OpLogWriter,
    seconds: float,
    future: Future[Any],
    *,
    purpose: str,
    timeout_message: str,
    cancel_aware: bool,
) -> float:
    """Wait until ``future`` (work running beside the steps) is done; returns the seconds
    waited. Its outcome is the caller's to read. Checks ``stop`` and fencing every
    :data:`BACKGROUND_SLICE_SECONDS` and, when ``cancel_aware``, the cancel flag every
    ``DUCKGRES_RESHARD_POLL_SECONDS`` (first at once); logs about every 15 s; raises
    ``StepError`` at the deadline."""
    started = time.monotonic()
    if future.done():
        return 0.0
    deadline = started + seconds
    ctx.extend_deadline(deadline)
    pause = float(settings.DUCKGRES_RESHARD_POLL_SECONDS)
    oplog.info(f"waiting up to {seconds:g} s {purpose} (deadline in {seconds:g} s)")
    next_cancel = started
    next_observation = started + OBSERVATION_INTERVAL
    while not future.done():
        if ctx.stop.is_set() or ctx.fenced:
            raise Interrupted()
        now = time.monotonic()
        if cancel_aware and now >= next_cancel:
            if cancel_requested(ctx.op_id):
                raise Cancelled()
            next_cancel = now + pause
        if now >= deadline:
            raise StepError(f"{timeout_message} (waited {seconds:g} s)")
        if now >= next_observation:
            oplog.info(f"still waiting {purpose}: {deadline - now:.0f} s left; not done yet")
            next_observation = now + OBSERVATION_INTERVAL
        with contextlib.suppress(TimeoutError):
            future.exception(timeout=min(BACKGROUND_SLICE_SECONDS, max(0.0, deadline - now)))
    return time.monotonic() - started


def join_bounded(thread: threading.Thread, seconds: float) -> bool:
    """Join ``thread`` for at most ``seconds``; True when it ended."""
    thread.join(timeout=seconds)
    return not thread.is_alive()


def full_source_timeout() -> float:
    """The default flip timeout (never the per-op cutover override; spec §4.4)."""
    return float(settings.DUCKGRES_RESHARD_FLIP_TIMEOUT)


def cutover_timeout(op: ReshardOperation) -> float:
    """The cutover's login wait: the op's override when set, else the default flip timeout."""
    value = op.cutover_timeout_seconds
    return float(value) if value and value > 0 else full_source_timeout()


@contextlib.contextmanager
def cancel_watch(
    ctx: RunContext, oplog: OpLogWriter, *, enabled: bool, interval: float | None = None
) -> Iterator[threading.Event]:
    """Yield an event that is set once an operator cancel is observed while the body runs.

    With ``enabled`` (the step is before its direction's cancel cutoff) a daemon thread reads
    the cancel flag every ``interval`` (default ``DUCKGRES_RESHARD_POLL_SECONDS``); when it is
    set, the event is set, one line is logged and ``ctx.interrupt(stop_only=True)`` cancels the
    statements of the step's ``interrupt_on_stop`` connections and kills its children. The
    thread ends with the body (its deadline) and closes its own config-store connection. The
    body raises :class:`Cancelled` when it sees the event."""
    seen = threading.Event()
    if not enabled:
        yield seen
        return
    done = threading.Event()
    pause = float(settings.DUCKGRES_RESHARD_POLL_SECONDS) if interval is None else interval

    def watch() -> None:
        try:
            while not done.wait(pause):
                if ctx.stop.is_set() or ctx.fenced:
                    return
                if cancel_requested(ctx.op_id):
                    seen.set()
                    oplog.warn("cancel requested: interrupting the running statements of the step")
                    ctx.interrupt(stop_only=True)
                    return
        finally:
            with contextlib.suppress(DatabaseError, InterfaceError):
                connection.close()

    thread = threading.Thread(target=watch, name="reshard-cancel-watch", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=pause + 10)
