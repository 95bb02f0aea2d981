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
  (``duckgres_admin.lockkeys``) is held, so a leader that lost its lease mid-launch and its
  successor never count and launch together; leadership is renewed (``may_act``) before every
  launch and cancel.
- **State changes are compare-and-set** on the drain's current state: pause ``running →
  paused``, resume ``paused → running``, cancel ``running|paused → cancelling``; the advance
  ends a drain ``finished`` (nothing waiting, nothing active) or ``cancelled`` (a cancel stops
  launching, marks the waiting items ``cancelled``, requests cancel of the active children and
  ends when none is active).
- **An org that cannot move now is skipped with the start's own refusal** (Trino-enabled, not
  ready, already moving, a target identity conflict): any 4xx refusal. A 5xx refusal (a store
  unreachable) leaves the item waiting for the next tick.
- **A store being drained accepts no new warehouses**: ``reshard.drain_guard`` is checked by
  the reshard start's target validation and the warehouse binding writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.db.models.functions import Now

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lockkeys import STORE_DRAIN_LOCK_CLASS
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
from reshard import operations
from reshard.drain_guard import draining_refusal
from reshard.start_checks import StartRequest, TargetRequest

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
    """Pause, resume or cancel by compare-and-set on the current state (409 otherwise)."""
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
    _log.info("drain %s: %s by %s", drain_id, action, actor)
    return drain


# --- reads --------------------------------------------------------------------------------------
# How many items show each state: the models' one count (the admin and the outbox use it too).
progress = progress_of


def drain_view(drain: StoreDrain, *, with_items: bool = True) -> dict[str, Any]:
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
        "created_at": drain.created_at.isoformat() if drain.created_at else None,
        "finished_at": drain.finished_at.isoformat() if drain.finished_at else None,
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
            if running >= drain.max_concurrent:
                break
            may_act()
            if _launch(drain, item, report):
                running += 1
        # Nothing launched when none is running: the in-memory items are the rows.
        if running == 0 and not any(i.state == ItemState.WAITING for i in items):
            _end(drain, DrainState.RUNNING, DrainState.FINISHED, items, report)


def _adopt(drain: StoreDrain, items: list[StoreDrainItem], report: AdvanceReport) -> None:
    """A waiting item whose operation exists (its launcher died before marking it) is
    launched: mark it so (compare-and-set on ``waiting``)."""
    for item in items:
        op = item.child()
        if (
            item.state == ItemState.WAITING
            and op is not None
            and StoreDrainItem.objects.filter(pk=item.id, state=ItemState.WAITING).update(
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
        outcome = operations.reshard_op_start(
            org_id=item.org_id, request=request, actor=f"drain:{drain.id}", drain_item_id=item.id
        )
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
    StoreDrainItem.objects.filter(pk=item.id, state=ItemState.WAITING).update(
        state=ItemState.LAUNCHED, target_store=target, updated_at=Now()
    )
    report.actions.append(
        f"drain {drain.id}: launched op {outcome.op.id} moving {item.org_id} to {target}"
    )
    return True


def _cancel_children(
    drain: StoreDrain,
    active: list[StoreDrainItem],
    may_act: Callable[[], None],
    report: AdvanceReport,
) -> None:
    StoreDrainItem.objects.filter(drain=drain, state=ItemState.WAITING).update(
        state=ItemState.CANCELLED, reason="the drain was cancelled", updated_at=Now()
    )
    for item in active:
        op = item.child()
        if op is None or op.cancel_requested:
            continue
        may_act()
        try:
            operations.reshard_op_cancel(op_id=op.id, actor=f"drain:{drain.id}")
        except ServiceError as exc:
            _log.info("drain %s: cancel of op %s: %s", drain.id, op.id, exc.message)
            continue
        report.actions.append(f"drain {drain.id}: cancel requested for op {op.id}")
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
