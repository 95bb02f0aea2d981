"""Store drains: empty one metadata store through ordinary reshards (docs/drains.md).

An operator asks for a drain (``POST /metadata-stores/<name>/drain``); :func:`create_drain`
writes the plan (a ``StoreDrain`` row) and one ``StoreDrainItem`` per warehouse bound to the
store at that moment, in one transaction. Nothing is launched by the web request: the janitor's
leader calls :func:`advance` every tick, which launches each item as an ordinary reshard
operation (the same start service and checks as the API) at most ``max_concurrent`` at a time.

Invariants:

- **An item is launched at most once.** The operation row carries ``drain_item`` (unique), set
  by the same insert that creates it; a second insert for the item fails on that constraint
  whoever tries (a second leader, a retry after a lost commit), and the item adopts the
  operation that exists. The item's state (``launched``) follows the insert; a leader that died
  in between leaves a ``waiting`` item with an operation, which the next advance adopts.
- **At most ``max_concurrent`` children are active**, counted from the operation rows (never
  from memory) while the drain's advisory lock ``(STORE_DRAIN_LOCK_CLASS, drain id)``
  (``duckgres_admin.platform.lockkeys``) is held, so a leader that lost its lease mid-launch and its
  successor never count and launch together; leadership is renewed (``may_act``) before every
  launch and cancel.
- **State changes are compare-and-set** on the drain's current state: pause ``running →
  paused``, resume ``paused → running``, cancel ``running|paused → cancelling``; the advance
  ends a drain ``finished`` (nothing waiting, nothing active) or ``cancelled`` (when none of its
  children is active).
- **A cancel reaches the active children in its own transaction** (:func:`cancel_drain`): the
  compare-and-set, the waiting items marked ``cancelled`` and every active child's reshard
  cancel (refused past its point of no return, and reported so) commit together, under a
  bounded lock wait. It does not take the drain's advisory lock, so the advance is the safety
  net: on a ``cancelling`` drain it marks what is left and asks each active child not yet asked
  and still before its cutoff, once; it stops launching once the drain is no longer
  ``running``; a launch that raced the cancel asks its child at once.
- **An item whose operation exists is launched**, whatever its state says (``waiting``: its
  launcher died before marking it; ``cancelled``: a cancel committed while its insert was in
  flight): the advance adopts it, and only items without an operation are ever cancelled.
- **An org that cannot move now is skipped with the start's own refusal** (Trino-enabled, not
  ready, already moving, a target identity conflict): any 4xx refusal. A 5xx refusal (a store
  unreachable) leaves the item waiting for the next tick.
- **A store being drained accepts no new warehouses**: ``reshard.warehouses.drain_guard`` is checked
by
  the reshard start's target validation and the warehouse binding writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count
from django.db.models.functions import Now

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import (
    ACTIVE_DRAIN_STATES,
    ACTIVE_STATES,
    PROGRESS_KEYS,
    DrainState,
    ItemState,
    MetadataStore,
    ReshardOperation,
    StoreDrain,
    StoreDrainItem,
    StoreKind,
    Warehouse,
    progress_of,
)
from duckgres_admin.platform.lockkeys import STORE_DRAIN_LOCK_CLASS
from reshard.kinds import RESHARD
from reshard.kinds.checks import StartRequest, TargetRequest
from reshard.runner.execute import before_cancel_cutoff
from reshard.start import operations
from reshard.warehouses.drain_guard import draining_refusal

_log = logging.getLogger("duckgres.reshard.drains")

MAX_TARGETS = 16
LIST_LIMIT = 20


# --- the plan -----------------------------------------------------------------------------------
def _cnpg_store(name: str, *, target: bool) -> MetadataStore:
    """The store to drain (404 when unknown) or a target (400 naming ``target_stores``)."""
    where = "invalid body: target_stores: " if target else ""
    store = MetadataStore.objects.filter(name=name).first()
    if store is None:
        raise ServiceError(400 if target else 404, f"{where}no metadata store named {name}")
    if store.kind != StoreKind.CNPG:
        raise ServiceError(
            400,
            f"{where}{name} is an external store: only cnpg stores can be drained and filled",
        )
    return store


def create_drain(
    store_name: str,
    *,
    target_stores: Sequence[str],
    max_concurrent: int,
    drain_timeout_seconds: int,
    actor: str,
) -> StoreDrain:
    """The plan and its items, in one transaction (refusals: ``ServiceError``)."""
    store = _cnpg_store(store_name, target=False)
    where = "invalid body: target_stores: "
    if not target_stores:
        raise ServiceError(400, f"{where}name at least one cnpg store to move to")
    if len(set(target_stores)) != len(target_stores) or len(target_stores) > MAX_TARGETS:
        raise ServiceError(400, f"{where}at most {MAX_TARGETS} distinct store names, each once")
    for name in target_stores:
        if name == store_name:
            raise ServiceError(400, f"{where}{name} is the store being drained")
        _cnpg_store(name, target=True)
        refusal = draining_refusal(name)
        if refusal:
            raise ServiceError(409, f"{where}{refusal}", code="store_draining")
    try:
        with transaction.atomic():
            drain = StoreDrain.objects.create(
                store=store,
                target_stores=list(target_stores),
                max_concurrent=max_concurrent,
                drain_timeout_seconds=drain_timeout_seconds,
                created_by=actor,
            )
            orgs = Warehouse.objects.filter(
                metadata_store_kind=StoreKind.CNPG, metadata_store_id=store_name
            ).values_list("org_id", flat=True)
            StoreDrainItem.objects.bulk_create(
                StoreDrainItem(drain=drain, org_id=org) for org in sorted(orgs)
            )
    except IntegrityError as exc:
        if "store_drain_one_active_per_store" not in str(exc):
            raise
        raise ServiceError(409, draining_refusal(store_name), code="store_draining") from None
    _log.info(
        "drain %s of store %s created by %s: %d warehouse(s), to %s, at most %d at a time",
        drain.id,
        store_name,
        actor,
        drain.items.count(),
        ", ".join(target_stores),
        max_concurrent,
    )
    return drain


_TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "pause": ((DrainState.RUNNING,), DrainState.PAUSED),
    "resume": ((DrainState.PAUSED,), DrainState.RUNNING),
    "cancel": ((DrainState.RUNNING, DrainState.PAUSED), DrainState.CANCELLING),
}


ACTIONS = tuple(_TRANSITIONS)  # pause, resume, cancel


def actions_allowed(state: str) -> list[str]:
    """The actions (pause, resume, cancel) a drain in ``state`` accepts."""
    return [action for action, (allowed, _) in _TRANSITIONS.items() if state in allowed]


def change_drain(drain_id: int, action: str, *, actor: str) -> StoreDrain:
    """Pause, resume or cancel by compare-and-set on the current state (409 otherwise). A
    cancel is :func:`cancel_drain` (its children are asked in the same transaction)."""
    if action == "cancel":
        return cancel_drain(drain_id, actor=actor).drain
    drain = _compare_and_set(drain_id, action)
    _log.info("drain %s: %s by %s", drain_id, action, actor)
    return drain


def _compare_and_set(drain_id: int, action: str) -> StoreDrain:
    """The transition's guarded UPDATE; the drain as it is now (404 unknown, 409 the state)."""
    allowed, to = _TRANSITIONS[action]
    changed = StoreDrain.objects.filter(pk=drain_id, state__in=allowed).update(
        state=to, updated_at=Now()
    )
    drain = StoreDrain.objects.filter(pk=drain_id).first()
    if drain is None:
        raise ServiceError(404, "no such drain")
    if changed != 1:
        raise ServiceError(
            409,
            f"drain {drain_id} is {drain.state}: only a {' or '.join(allowed)} drain can {action}",
            code="drain_state",
        )
    return drain


# --- the cancel ---------------------------------------------------------------------------------
# The cancel's transaction waits at most this long for a row lock (the drain row, an item, a
# child's row that its runner or the janitor is writing: each held for milliseconds).
CANCEL_LOCK_TIMEOUT_MS = 5000
WAITING_CANCELLED_REASON = "the drain was cancelled"


@dataclass(frozen=True)
class ChildCancel:
    """One active child as the cancel left it: ``state`` is the operation's after the request
    (a ``pending`` child is ``cancelled`` outright), ``step`` the step its cutoff was judged on."""

    operation_id: int
    org_id: str
    step: str
    state: str
    honoured: bool  # before its point of no return (or cancelled outright) when it was asked

    def as_json(self) -> dict[str, Any]:
        return {
            "operation_id": self.operation_id,
            "org_id": self.org_id,
            "step": self.step or None,
            "state": self.state,
        }


@dataclass(frozen=True)
class DrainCancel:
    """What a cancel did: the drain (now ``cancelling``), how many waiting items it marked
    ``cancelled``, and each active child it asked to stop."""

    drain: StoreDrain
    waiting_cancelled: int
    children: list[ChildCancel]

    @property
    def asked(self) -> list[ChildCancel]:
        return [c for c in self.children if c.honoured]

    @property
    def past_point_of_no_return(self) -> list[ChildCancel]:
        return [c for c in self.children if not c.honoured]

    def as_json(self) -> dict[str, Any]:
        return {
            "waiting_cancelled": self.waiting_cancelled,
            "asked": [c.as_json() for c in self.asked],
            "past_point_of_no_return": [c.as_json() for c in self.past_point_of_no_return],
        }


def cancel_drain(drain_id: int, *, actor: str) -> DrainCancel:
    """``running|paused → cancelling``, the waiting items ``cancelled`` and every active child's
    reshard cancel requested, all in one transaction: a child is asked the moment the operator
    cancels, not at the janitor's next tick (which stays the safety net: it asks any child this
    transaction did not see)."""
    try:
        with transaction.atomic(), _lock_timeout(CANCEL_LOCK_TIMEOUT_MS):
            drain = _compare_and_set(drain_id, "cancel")
            waiting = _drop_waiting(drain)
            children = [
                child
                for op in _active_children(drain)
                if (child := _ask_child(drain, op, actor=f"drain:{drain.id}")) is not None
            ]
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        raise ServiceError(
            503, f"drain {drain_id} is being written by another session: retry the cancel"
        ) from None
    result = DrainCancel(drain=drain, waiting_cancelled=waiting, children=children)
    _log.info(
        "drain %s: cancel by %s: %d waiting cancelled; asked op(s) %s; past their point of no "
        "return: op(s) %s",
        drain_id,
        actor,
        waiting,
        ", ".join(str(c.operation_id) for c in result.asked) or "none",
        ", ".join(str(c.operation_id) for c in result.past_point_of_no_return) or "none",
    )
    return result


@contextmanager
def _lock_timeout(ms: int) -> Iterator[None]:
    """``lock_timeout`` for the rest of the current transaction, restored after (a caller's
    outer transaction keeps its own; a rolled-back block reverts it by itself)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        row = cursor.fetchone()
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{ms}ms"])
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [row[0] if row else "0"])


def _drop_waiting(drain: StoreDrain) -> int:
    """Mark ``cancelled`` the items never launched (no operation row): an item whose operation
    exists is launched, whatever its state says (the advance adopts it)."""
    return StoreDrainItem.objects.filter(
        drain=drain, state=ItemState.WAITING, operation__isnull=True
    ).update(state=ItemState.CANCELLED, reason=WAITING_CANCELLED_REASON, updated_at=Now())


def _active_children(drain: StoreDrain) -> list[ReshardOperation]:
    """The drain's pending or running operations, from the operation rows (whatever the
    items' state)."""
    return list(
        ReshardOperation.objects.filter(
            drain_item__drain_id=drain.id, state__in=ACTIVE_STATES
        ).order_by("id")
    )


def _ask_child(drain: StoreDrain, op: ReshardOperation, *, actor: str) -> ChildCancel | None:
    """Request ``op``'s cancel through the reshard's own cancel, whose answer says whether it
    is still honoured (a child past its point of no return is refused, and its op log says
    so). A request already recorded is not repeated: it is judged on the row as it is now.
    None when the child ended in between."""
    op.refresh_from_db()
    if op.state not in ACTIVE_STATES:
        return None
    honoured = bool(op.cancel_requested) and before_cancel_cutoff(op)
    if not op.cancel_requested:
        try:
            operations.reshard_op_cancel(op_id=op.id, actor=actor)
            honoured = True
        except ServiceError as exc:
            _log.info("drain %s: cancel of op %s: %s", drain.id, op.id, exc.message)
            if exc.code != operations.PAST_CUTOFF_CODE:
                return None  # it ended meanwhile
        op.refresh_from_db()
    return ChildCancel(
        operation_id=op.id, org_id=op.org_id, step=op.step, state=op.state, honoured=honoured
    )


# --- reads --------------------------------------------------------------------------------------
# How many items show each state: the models' one count (the admin and the outbox use it too).
progress = progress_of


def drain_view(drain: StoreDrain, *, with_items: bool = True) -> dict[str, Any]:
    """The drain as the API and the admin show it. ``created_at``/``finished_at`` are the
    datetimes: each face formats them (the API as RFC 3339 ``Z``, its one ``rfc3339``)."""
    items = drain.items_with_operations()
    body: dict[str, Any] = {
        "id": drain.id,
        "store": drain.store_id,
        "target_stores": list(drain.target_stores),
        "rule": drain.rule,
        "max_concurrent": drain.max_concurrent,
        "drain_timeout_seconds": drain.drain_timeout_seconds,
        "state": drain.state,
        "created_by": drain.created_by,
        "created_at": drain.created_at,
        "finished_at": drain.finished_at,
        "summary": drain.summary,
        "progress": progress(items),
    }
    if with_items:
        body["items"] = [
            {
                "org_id": item.org_id,
                "state": item.shown_state(),
                "reason": item.reason,
                "target_store": item.target_store or None,
                "operation_id": op.id if (op := item.child()) else None,
            }
            for item in items
        ]
    return body


def get_drain(drain_id: int) -> StoreDrain:
    drain = StoreDrain.objects.filter(pk=drain_id).first()
    if drain is None:
        raise ServiceError(404, "no such drain")
    return drain


def drains_of_store(store_name: str) -> list[StoreDrain]:
    if not MetadataStore.objects.filter(name=store_name).exists():
        raise ServiceError(404, f"no metadata store named {store_name}")
    return list(StoreDrain.objects.filter(store_id=store_name).order_by("-id")[:LIST_LIMIT])


# --- the janitor's advance ----------------------------------------------------------------------
@dataclass
class AdvanceReport:
    actions: list[str] = field(default_factory=list)
    skipped_locked: list[int] = field(default_factory=list)


def advance(may_act: Callable[[], None]) -> AdvanceReport:
    """One pass over every active drain (the janitor's leader, every tick). ``may_act`` renews
    leadership and raises to stop; one drain's failure never stops the others."""
    report = AdvanceReport()
    for drain in StoreDrain.objects.filter(state__in=ACTIVE_DRAIN_STATES).order_by("id"):
        if not _try_lock(drain.id):
            report.skipped_locked.append(drain.id)
            continue
        try:
            _advance_one(drain, may_act, report)
        except ServiceError as exc:
            _log.warning("drain %s: %s", drain.id, exc.message)
        finally:
            _unlock(drain.id)
    return report


def _try_lock(drain_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [STORE_DRAIN_LOCK_CLASS, drain_id])
        row = cursor.fetchone()
    return bool(row and row[0])


def _unlock(drain_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [STORE_DRAIN_LOCK_CLASS, drain_id])


def _advance_one(drain: StoreDrain, may_act: Callable[[], None], report: AdvanceReport) -> None:
    drain.refresh_from_db(fields=["state"])  # under the lock: the state this advance acts on
    items = drain.items_with_operations()
    _adopt(drain, items, report)
    active = [i for i in items if i.shown_state() == "running"]
    if drain.state == DrainState.CANCELLING:
        _cancel_children(drain, active, may_act, report)
        return
    if drain.state == DrainState.RUNNING:
        running = len(active)
        for item in (i for i in items if i.state == ItemState.WAITING):
            if running >= drain.max_concurrent or not _is(drain, DrainState.RUNNING):
                break  # a cancel or pause committed meanwhile: launch nothing more
            may_act()
            if _launch(drain, item, report):
                running += 1
        # Nothing launched when none is running: the in-memory items are the rows.
        if running == 0 and not any(i.state == ItemState.WAITING for i in items):
            _end(drain, DrainState.RUNNING, DrainState.FINISHED, items, report)


def _is(drain: StoreDrain, state: str) -> bool:
    """The drain's state as committed now (a cancel commits from the API, outside the lock)."""
    return StoreDrain.objects.filter(pk=drain.id, state=state).exists()


# An item whose operation exists is launched whatever its state says: ``waiting`` (its launcher
# died before marking it) or ``cancelled`` (a cancel committed while its insert was in flight).
_UNMARKED = (ItemState.WAITING, ItemState.CANCELLED)


def _adopt(drain: StoreDrain, items: list[StoreDrainItem], report: AdvanceReport) -> None:
    """A waiting or cancelled item whose operation exists is launched: mark it so
    (compare-and-set on its state); a cancelling drain asks that child next."""
    for item in items:
        op = item.child()
        if (
            item.state in _UNMARKED
            and op is not None
            and StoreDrainItem.objects.filter(pk=item.id, state=item.state).update(
                state=ItemState.LAUNCHED, target_store=op.to_shard, updated_at=Now()
            )
        ):
            item.state, item.target_store = ItemState.LAUNCHED, op.to_shard
            report.actions.append(f"drain {drain.id}: adopted op {op.id} of {item.org_id}")


def choose_target(drain: StoreDrain) -> str:
    """Of the drain's targets, the one with the fewest warehouses bound or moving to it
    (ties: the operator's order)."""
    targets = list(drain.target_stores)
    if len(targets) == 1:
        return str(targets[0])
    bound = dict(
        Warehouse.objects.filter(metadata_store_id__in=targets)
        .values_list("metadata_store_id")
        .annotate(n=Count("id"))
    )
    moving = dict(
        ReshardOperation.objects.filter(to_shard__in=targets, state__in=ACTIVE_STATES)
        .values_list("to_shard")
        .annotate(n=Count("id"))
    )
    return str(min(targets, key=lambda t: (bound.get(t, 0) + moving.get(t, 0), targets.index(t))))


def _launch(drain: StoreDrain, item: StoreDrainItem, report: AdvanceReport) -> bool:
    """Start the item's reshard; True when an operation now exists for it."""
    target = choose_target(drain)
    request = StartRequest(
        target=TargetRequest(type="cnpg", cnpg_shard=target),
        drain_timeout_seconds=drain.drain_timeout_seconds,
    )
    try:
        outcome = operations.op_start(
            RESHARD.start(), org_id=item.org_id, request=request, actor=f"drain:{drain.id}",
            drain_item_id=item.id,
        )  # fmt: skip
    except ServiceError as exc:
        if exc.code == operations.DRAIN_ITEM_LAUNCHED:
            return False  # another advance launched it; the next one adopts it
        if exc.status >= 500:
            _log.warning(
                "drain %s: %s not launched this tick (retried): %s",
                drain.id,
                item.org_id,
                exc.message,
            )
            return False
        if StoreDrainItem.objects.filter(pk=item.id, state=ItemState.WAITING).update(
            state=ItemState.SKIPPED, reason=exc.message, updated_at=Now()
        ):
            item.state, item.reason = ItemState.SKIPPED, exc.message
        report.actions.append(f"drain {drain.id}: skipped {item.org_id}: {exc.message}")
        return False
    if not StoreDrainItem.objects.filter(pk=item.id, state__in=_UNMARKED).update(
        state=ItemState.LAUNCHED, target_store=target, updated_at=Now()
    ):
        _log.warning("drain %s: item of %s no longer waiting", drain.id, item.org_id)
    item.state, item.target_store = ItemState.LAUNCHED, target
    report.actions.append(
        f"drain {drain.id}: launched op {outcome.op.id} moving {item.org_id} to {target}"
    )
    if _is(drain, DrainState.CANCELLING):
        # The cancel committed while this start was in flight and did not see the child: ask
        # it now rather than at the next tick (it may pass its point of no return by then).
        _report_ask(drain, _ask_child(drain, outcome.op, actor=f"drain:{drain.id}"), report)
    return True


def _report_ask(drain: StoreDrain, child: ChildCancel | None, report: AdvanceReport) -> None:
    if child is not None:
        done = "cancel requested" if child.honoured else "cancel refused (past its cutoff)"
        report.actions.append(f"drain {drain.id}: {done} for op {child.operation_id}")


def _cancel_children(
    drain: StoreDrain,
    active: list[StoreDrainItem],
    may_act: Callable[[], None],
    report: AdvanceReport,
) -> None:
    """The safety net of :func:`cancel_drain` (which asks every child it sees in its own
    transaction): waiting items and children it did not see, asked once each (idempotent)."""
    _drop_waiting(drain)
    for item in active:
        op = item.child()
        # Asked already, or past its point of no return (its cancel was refused once: asking
        # again every tick would only repeat the refusal in its op log).
        if op is None or op.cancel_requested or not before_cancel_cutoff(op):
            continue
        may_act()
        _report_ask(drain, _ask_child(drain, op, actor=f"drain:{drain.id}"), report)
    if not active:
        _end(
            drain,
            DrainState.CANCELLING,
            DrainState.CANCELLED,
            drain.items_with_operations(),
            report,
        )


def _end(
    drain: StoreDrain,
    expected: str,
    to: str,
    items: list[StoreDrainItem],
    report: AdvanceReport,
) -> None:
    counts = progress(items)
    summary = ", ".join(f"{counts[k]} {k}" for k in PROGRESS_KEYS if counts[k])
    if StoreDrain.objects.filter(pk=drain.id, state=expected).update(
        state=to, finished_at=Now(), updated_at=Now(), summary=summary or "nothing to move"
    ):
        report.actions.append(f"drain {drain.id}: {to} ({summary or 'nothing to move'})")
        _log.info("drain %s of store %s %s: %s", drain.id, drain.store_id, to, summary)
