"""Durable external effects: intent before effect (spec trino-pools §1 invariant 5, §4.7).

Every Gateway, Kubernetes or catalog-store mutation of the operator goes through ``run_step``:

1. **Intent.** In a fenced transaction (``authority.fenced``: pool row locked, fence checked) the
   operation row (``duckgres_trino_pool_operations``) and the step row
   (``duckgres_trino_pool_operation_steps``) are written: step id, the exact request body
   (``payload``, canonical JSON including the envelope), the hash of the business body
   (``payload_hash``: the body without the envelope), ``outcome='pending'``, the epoch. Commit.
2. **Effect.** After commit, and never under the row lock, ``call(payload)`` makes the external
   call with exactly the stored text.
3. **Outcome.** A new fenced transaction records ``ok`` (with the result), ``failed`` (a typed
   refusal: nothing was applied) or ``unknown`` (transport error, timeout, 5xx/429/503 without a
   decisive code).
4. **Resolution before anything newer.** A step found ``pending`` or ``unknown`` (a crash or a
   lost response between 1 and 3) is resolved before any other payload is sent for it: first by
   ``read_back`` (the Gateway's operation journal, a Kubernetes GET by name and UID, the catalog
   journal), then -- when the read-back proves the effect never arrived -- by re-sending the
   stored payload byte for byte. In a newer term the stored envelope carries a stale epoch, so
   the envelope is rebuilt with the new epoch (recorded first, fenced) and the business body is
   kept identical; the Gateway hashes the body without the envelope, so this is the same intent.
   A re-send in a newer term happens only after the read-back proved the earlier request never
   arrived or was refused (nothing applied), so it is a fresh attempt of the same intent. A
   read-back showing a ``POOL_STALE_EPOCH`` refusal is no verdict on this term: the step is sent
   again, and a stale term learns it from that answer.
   A caller that now wants a different body for an unsettled step still gets the stored intent
   resolved first (``StepState.intent_changed`` tells it so); a new body is never sent over an
   unsettled step.

A settled ``ok`` step is a replay: it is returned without any call. A ``failed`` step applied
nothing, so calling ``run_step`` again for it is a fresh attempt (a serving-floor refusal is
"final until retried later"). A Gateway ``POOL_STALE_EPOCH`` refusal is a fence refusal: it is
raised as ``PoolConflict`` and leaves the step unsettled for the next term's read-back.

A crash between any two of these steps therefore repeats nothing that already happened.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from django.db import connection

from duckgres_admin.lib.gateway import GatewayRefused
from trino_pools.authority import Authority, PoolConflict, fenced

_log = logging.getLogger("duckgres.trino.effects")

ENVELOPE_KEYS = ("operationId", "stepId", "controllerEpoch", "ownerIdentity")
Outcome = Literal["pending", "ok", "unknown", "failed"]


def canonical(body: Mapping[str, Any]) -> str:
    """The one JSON encoding of a request body (sorted keys, compact, UTF-8 kept)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def envelope(auth: Authority, operation_id: str, step_id: str) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "stepId": step_id,
        "controllerEpoch": auth.epoch,
        "ownerIdentity": auth.owner,
    }


def business_body(payload: str) -> dict[str, Any]:
    """The stored payload without its envelope."""
    data = json.loads(payload)
    return {k: v for k, v in data.items() if k not in ENVELOPE_KEYS}


def business_hash(body: Mapping[str, Any]) -> str:
    return sha256_hex(canonical({k: v for k, v in body.items() if k not in ENVELOPE_KEYS}))


class EffectUnknown(Exception):
    """The external call's outcome is unknown; the step stays pinned until resolved."""

    def __init__(self, operation_id: str, step_id: str, cause: str) -> None:
        super().__init__(f"outcome of {operation_id}/{step_id} is unknown: {cause}")
        self.operation_id = operation_id
        self.step_id = step_id
        self.cause = cause


@dataclass
class StepState:
    operation_id: str
    step_id: str
    outcome: Outcome
    payload: str
    payload_hash: str
    result: Any
    owner_epoch: int
    intent_changed: bool = False
    replayed: bool = False
    fresh: bool = False  # written by this call: nothing can have been sent yet

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def refusal_code(self) -> str:
        if self.outcome != "failed" or not isinstance(self.result, dict):
            return ""
        return str(self.result.get("code") or "")


class Settled(NamedTuple):
    """A read-back verdict: the effect is known to have happened (ok) or been refused."""

    outcome: Literal["ok", "failed"]
    result: Any


Verdict = Literal["failed", "unknown", "fenced"]


def default_classify(exc: BaseException) -> Verdict:
    """A Gateway refusal applied nothing (a stale epoch is a fence); anything else is unknown."""
    if isinstance(exc, GatewayRefused):
        return "fenced" if exc.code == "POOL_STALE_EPOCH" else "failed"
    return "unknown"


def _stale_epoch_refusal(verdict: Settled) -> bool:
    result = verdict.result if isinstance(verdict.result, dict) else {}
    return verdict.outcome == "failed" and result.get("code") == "POOL_STALE_EPOCH"


def _load(operation_id: str, step_id: str, *, lock: bool) -> StepState | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT outcome, payload, payload_hash, result, owner_epoch "
            "FROM duckgres_trino_pool_operation_steps WHERE operation_id = %s AND step_id = %s"
            + (" FOR UPDATE" if lock else ""),
            [operation_id, step_id],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    result = row[3]
    if isinstance(result, str):
        result = json.loads(result)
    return StepState(
        operation_id=operation_id,
        step_id=step_id,
        outcome=row[0],
        payload=row[1],
        payload_hash=row[2],
        result=result,
        owner_epoch=int(row[4]),
    )


def load_step(operation_id: str, step_id: str) -> StepState | None:
    return _load(operation_id, step_id, lock=False)


def _ensure_operation(auth: Authority, operation_id: str, kind: str, intent_hash: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO duckgres_trino_pool_operations "
            "(operation_id, pool_id, kind, intent_hash, owner_epoch, step, phase, receipts, "
            " attempts, created_at, updated_at) "
            "VALUES (%s, %s, %s, %s, %s, '', 'pending', '{}'::jsonb, 0, now(), now()) "
            "ON CONFLICT (operation_id) DO NOTHING",
            [operation_id, auth.pool_id, kind, intent_hash, auth.epoch],
        )


def _record(auth: Authority, state: StepState, outcome: Outcome, result: Any) -> StepState:
    with fenced(auth), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_trino_pool_operation_steps SET outcome = %s, result = %s::jsonb, "
            "updated_at = now() WHERE operation_id = %s AND step_id = %s AND payload = %s",
            [outcome, json.dumps(result), state.operation_id, state.step_id, state.payload],
        )
        if cursor.rowcount != 1:
            raise PoolConflict(f"step {state.operation_id}/{state.step_id} changed under this term")
        cursor.execute(
            "UPDATE duckgres_trino_pool_operations SET step = %s, owner_epoch = %s, "
            "attempts = attempts + 1, updated_at = now() WHERE operation_id = %s",
            [state.step_id, auth.epoch, state.operation_id],
        )
    state.outcome = outcome
    state.result = result
    return state


def _prepare(
    auth: Authority, operation_id: str, kind: str, step_id: str, body: Mapping[str, Any]
) -> StepState:
    """Phase 1: the fenced intent row (or the existing one, possibly re-enveloped)."""
    wanted_hash = business_hash(body)
    payload = canonical({**body, **envelope(auth, operation_id, step_id)})
    with fenced(auth):
        _ensure_operation(auth, operation_id, kind, wanted_hash)
        existing = _load(operation_id, step_id, lock=True)
        if existing is None or (
            existing.outcome == "failed" and existing.payload_hash != wanted_hash
        ):
            # New intent, or a new attempt after a refusal (a refusal applied nothing).
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO duckgres_trino_pool_operation_steps "
                    "(operation_id, step_id, payload_hash, payload, outcome, result, "
                    " owner_epoch, created_at, updated_at) "
                    "VALUES (%s, %s, %s, %s, 'pending', NULL, %s, now(), now()) "
                    "ON CONFLICT (operation_id, step_id) DO UPDATE SET "
                    "payload_hash = EXCLUDED.payload_hash, payload = EXCLUDED.payload, "
                    "outcome = 'pending', result = NULL, owner_epoch = EXCLUDED.owner_epoch, "
                    "updated_at = now()",
                    [operation_id, step_id, wanted_hash, payload, auth.epoch],
                )
            return StepState(
                operation_id, step_id, "pending", payload, wanted_hash, None, auth.epoch, fresh=True
            )
        existing.intent_changed = existing.payload_hash != wanted_hash
        if existing.outcome == "ok":
            existing.replayed = True
            return existing
        if existing.outcome == "failed":
            # Same intent, a fresh attempt (the refusal applied nothing); pinned as pending so a
            # crash during the call is resolved by read-back like any other.
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE duckgres_trino_pool_operation_steps SET outcome = 'pending', "
                    "updated_at = now() WHERE operation_id = %s AND step_id = %s",
                    [operation_id, step_id],
                )
            existing.outcome = "pending"
            existing.fresh = True
        if existing.owner_epoch != auth.epoch:
            # A newer term: same business body, new envelope, recorded before the call.
            rebuilt = canonical(
                {**business_body(existing.payload), **envelope(auth, operation_id, step_id)}
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE duckgres_trino_pool_operation_steps SET payload = %s, "
                    "owner_epoch = %s, updated_at = now() "
                    "WHERE operation_id = %s AND step_id = %s AND payload = %s",
                    [rebuilt, auth.epoch, operation_id, step_id, existing.payload],
                )
                if cursor.rowcount != 1:
                    raise PoolConflict(f"step {operation_id}/{step_id} changed under this term")
            existing.payload, existing.owner_epoch = rebuilt, auth.epoch
        return existing


def run_step(
    auth: Authority,
    *,
    operation_id: str,
    kind: str,
    step_id: str,
    body: Mapping[str, Any],
    call: Callable[[str], Any],
    read_back: Callable[[StepState], Settled | None] | None = None,
    classify: Callable[[BaseException], Verdict] = default_classify,
) -> StepState:
    """Journal, call after commit, record; see the module docstring. Raises EffectUnknown."""
    state = _prepare(auth, operation_id, kind, step_id, body)
    if state.replayed:
        return state
    if read_back is not None and not state.fresh:
        # Pending or unknown from an earlier attempt: the call may have happened.
        try:
            verdict = read_back(state)
        except Exception as exc:  # noqa: BLE001 - a failed read-back keeps the step unknown
            raise EffectUnknown(operation_id, step_id, f"read-back failed: {exc}") from None
        if verdict is not None and _stale_epoch_refusal(verdict):
            # The Gateway refused an earlier attempt as stale: nothing was applied. Send it again
            # under this term; if this term is stale too, that answer raises PoolConflict.
            verdict = None
        if verdict is not None:
            _log.info("resolved %s/%s by read-back: %s", operation_id, step_id, verdict.outcome)
            return _record(auth, state, verdict.outcome, verdict.result)
    try:
        result = call(state.payload)
    except Exception as exc:  # noqa: BLE001 - classified below; unknown ones are re-raised typed
        verdict_kind = classify(exc)
        if verdict_kind == "fenced":
            raise PoolConflict(f"{operation_id}/{step_id} refused: {exc}") from None
        if verdict_kind == "failed":
            refusal = {
                "code": str(getattr(exc, "code", "") or ""),
                "status": getattr(exc, "status", None),
                "message": str(exc)[:1000],
            }
            return _record(auth, state, "failed", refusal)
        _record(auth, state, "unknown", {"error": str(exc)[:1000]})
        raise EffectUnknown(operation_id, step_id, str(exc)) from None
    return _record(auth, state, "ok", result)


def close_operation(auth: Authority, operation_id: str, phase: str = "done") -> None:
    """Mark an operation terminal (fenced; idempotent)."""
    with fenced(auth), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_trino_pool_operations SET phase = %s, terminal_at = now(), "
            "updated_at = now() WHERE operation_id = %s AND terminal_at IS NULL",
            [phase, operation_id],
        )
