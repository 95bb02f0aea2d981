"""Pool authority (spec trino-pools §4.3) and durable external effects (§4.7) on the real store."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection

from duckgres_admin.lib.gateway import GatewayRefused
from duckgres_admin.models.trino import TrinoPool, TrinoPoolOperation, TrinoPoolOperationStep
from trino_pools import authority, effects
from trino_pools.authority import Authority, AuthorityHolder, PoolConflict
from trino_pools.effects import EffectUnknown, Settled

pytestmark = pytest.mark.django_db(transaction=True)

POOL = "registered:pool-a"


def Refused(code: str) -> GatewayRefused:
    return GatewayRefused(code, 409, f"refused: {code}")


@pytest.fixture
def pool() -> TrinoPool:
    return TrinoPool.objects.create(pool_id=POOL, public_id="pool-a")


def test_acquire_bumps_epoch_and_sets_owner(pool: TrinoPool) -> None:
    first = authority.acquire(POOL, "a.0000")
    second = authority.acquire(POOL, "b.0000")
    assert (first.epoch, second.epoch) == (1, 2)
    pool.refresh_from_db()
    assert (pool.authority_epoch, pool.authority_owner) == (2, "b.0000")


def test_fenced_write_refused_after_another_acquisition(pool: TrinoPool) -> None:
    mine = authority.acquire(POOL, "a.0000")
    with authority.fenced(mine):
        TrinoPool.objects.filter(pool_id=POOL).update(frozen_reason="mine")
    authority.acquire(POOL, "b.0000")
    with pytest.raises(PoolConflict, match="trino pool conflict"), authority.fenced(mine):
        TrinoPool.objects.filter(pool_id=POOL).update(frozen_reason="stale")
    pool.refresh_from_db()
    assert pool.frozen_reason == "mine"


def test_same_epoch_other_owner_is_refused(pool: TrinoPool) -> None:
    mine = authority.acquire(POOL, "a.0000")
    forged = Authority(POOL, "b.0000", mine.epoch)
    with pytest.raises(PoolConflict), authority.fenced(forged):
        pass


@pytest.mark.safeguard("trino-10")
def test_holder_never_returns_a_torn_authority() -> None:
    holder = AuthorityHolder()
    stop = threading.Event()
    torn: list[Authority] = []

    def writer(n: int) -> None:
        epoch = n
        while not stop.is_set():
            epoch += 4
            holder.install(Authority(POOL, f"owner-{epoch}", epoch))
            holder.clear(POOL, Authority(POOL, "someone-else", -1))  # stale clear: no-op

    def reader() -> None:
        while not stop.is_set():
            auth = holder.get(POOL)
            if auth is not None and auth.owner != f"owner-{auth.epoch}":
                torn.append(auth)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    threading.Event().wait(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert torn == []
    assert holder.get(POOL) is not None


# --- durable effects -------------------------------------------------------------------------


def recorder(sink: list[str], result: Any) -> Any:
    def call(payload: str) -> Any:
        sink.append(payload)
        return result

    return call


def _step(op: str, step: str) -> TrinoPoolOperationStep:
    return TrinoPoolOperationStep.objects.get(operation_id=op, step_id=step)


def _committed_outcome(op: str, step: str) -> str | None:
    """Read through a separate connection: only committed rows are visible there."""
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=db["USER"], autocommit=True
    ) as conn:
        row = conn.execute(
            "SELECT outcome FROM duckgres_trino_pool_operation_steps "
            "WHERE operation_id = %s AND step_id = %s",
            [op, step],
        ).fetchone()
    return None if row is None else str(row[0])


def test_intent_is_committed_before_the_call_and_the_outcome_after(pool: TrinoPool) -> None:
    auth = authority.acquire(POOL, "a.0000")
    seen: list[str | None] = []
    sent: list[str] = []

    def call(payload: str) -> dict[str, Any]:
        seen.append(_committed_outcome("instance:cell-00000001", "register"))
        sent.append(payload)
        return {"state": "PREPARING"}

    state = effects.run_step(
        auth,
        operation_id="instance:cell-00000001",
        kind="scale_up",
        step_id="register",
        body={"memberId": "cell-00000001"},
        call=call,
    )
    assert seen == ["pending"]
    assert state.outcome == "ok"
    assert json.loads(sent[0]) == {
        "memberId": "cell-00000001",
        "operationId": "instance:cell-00000001",
        "stepId": "register",
        "controllerEpoch": auth.epoch,
        "ownerIdentity": "a.0000",
    }
    row = _step("instance:cell-00000001", "register")
    assert (row.outcome, row.result, row.payload) == ("ok", {"state": "PREPARING"}, sent[0])
    assert TrinoPoolOperation.objects.get(operation_id="instance:cell-00000001").pool_id == POOL


def test_settled_step_is_a_replay_without_a_call(pool: TrinoPool) -> None:
    auth = authority.acquire(POOL, "a.0000")
    calls: list[str] = []
    kwargs: dict[str, Any] = {
        "operation_id": "op-1",
        "kind": "retire",
        "step_id": "seal",
        "body": {"expectedGeneration": 3},
        "call": recorder(calls, {"ok": True}),
    }
    effects.run_step(auth, **kwargs)
    again = effects.run_step(auth, **kwargs)
    assert again.replayed
    assert again.outcome == "ok"
    assert len(calls) == 1


def test_unknown_outcome_is_resent_byte_for_byte_in_the_same_term(pool: TrinoPool) -> None:
    auth = authority.acquire(POOL, "a.0000")
    sent: list[str] = []

    def lost(payload: str) -> Any:
        sent.append(payload)
        raise TimeoutError("response lost")

    with pytest.raises(EffectUnknown):
        effects.run_step(
            auth, operation_id="op-2", kind="retire", step_id="drain", body={"a": 1}, call=lost
        )
    assert _step("op-2", "drain").outcome == "unknown"

    def delivered(payload: str) -> Any:
        sent.append(payload)
        return {"state": "DRAINING"}

    # The caller now wants another body: the stored intent is still settled first.
    state = effects.run_step(
        auth,
        operation_id="op-2",
        kind="retire",
        step_id="drain",
        body={"a": 2},
        call=delivered,
        read_back=lambda s: None,  # the Gateway never received it
    )
    assert state.outcome == "ok"
    assert state.intent_changed
    assert sent[0] == sent[1]


def test_unknown_outcome_resolved_by_read_back_without_resending(pool: TrinoPool) -> None:
    auth = authority.acquire(POOL, "a.0000")
    with pytest.raises(EffectUnknown):
        effects.run_step(
            auth,
            operation_id="op-3",
            kind="retire",
            step_id="retire",
            body={"g": 4},
            call=lambda p: (_ for _ in ()).throw(OSError("connection reset")),
        )
    calls: list[str] = []
    state = effects.run_step(
        auth,
        operation_id="op-3",
        kind="retire",
        step_id="retire",
        body={"g": 4},
        call=recorder(calls, None),
        read_back=lambda s: Settled("ok", {"state": "RETIRING"}),
    )
    assert calls == []
    assert (state.outcome, state.result) == ("ok", {"state": "RETIRING"})


def test_new_term_rebuilds_only_the_envelope(pool: TrinoPool) -> None:
    old = authority.acquire(POOL, "a.0000")
    with pytest.raises(EffectUnknown):
        effects.run_step(
            old,
            operation_id="op-4",
            kind="retire",
            step_id="drain",
            body={"reason": "x"},
            call=lambda p: (_ for _ in ()).throw(TimeoutError()),
        )
    new = authority.acquire(POOL, "b.0000")
    sent: list[str] = []
    effects.run_step(
        new,
        operation_id="op-4",
        kind="retire",
        step_id="drain",
        body={"reason": "x"},
        call=recorder(sent, {}),
        read_back=lambda s: None,
    )
    body = json.loads(sent[0])
    assert (body["controllerEpoch"], body["ownerIdentity"], body["reason"]) == (
        new.epoch,
        "b.0000",
        "x",
    )
    assert _step("op-4", "drain").owner_epoch == new.epoch


def test_refusal_is_recorded_and_a_later_attempt_is_fresh(pool: TrinoPool) -> None:
    auth = authority.acquire(POOL, "a.0000")

    def floor(payload: str) -> Any:
        raise Refused("POOL_SERVING_FLOOR")

    state = effects.run_step(
        auth, operation_id="op-5", kind="retire", step_id="drain", body={}, call=floor
    )
    assert (state.outcome, state.refusal_code) == ("failed", "POOL_SERVING_FLOOR")
    later = effects.run_step(
        auth, operation_id="op-5", kind="retire", step_id="drain", body={}, call=lambda p: {}
    )
    assert later.outcome == "ok"


def test_stale_epoch_refusal_is_a_fence_refusal(pool: TrinoPool) -> None:
    auth = authority.acquire(POOL, "a.0000")

    def stale(payload: str) -> Any:
        raise Refused("POOL_STALE_EPOCH")

    with pytest.raises(PoolConflict):
        effects.run_step(
            auth, operation_id="op-6", kind="retire", step_id="drain", body={}, call=stale
        )
    assert _step("op-6", "drain").outcome == "pending"


def test_no_intent_is_written_and_nothing_called_without_the_fence(pool: TrinoPool) -> None:
    stale = authority.acquire(POOL, "a.0000")
    authority.acquire(POOL, "b.0000")
    calls: list[str] = []
    with pytest.raises(PoolConflict):
        effects.run_step(
            stale,
            operation_id="op-7",
            kind="retire",
            step_id="drain",
            body={},
            call=recorder(calls, None),
        )
    assert calls == []
    assert not TrinoPoolOperationStep.objects.filter(operation_id="op-7").exists()


def test_a_blocked_pool_row_fails_the_fenced_write_within_the_lock_timeout(
    pool: TrinoPool,
) -> None:
    auth = authority.acquire(POOL, "a.0000")
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=db["USER"]
    ) as blocker:
        blocker.execute("SELECT 1 FROM duckgres_trino_pools WHERE pool_id = %s FOR UPDATE", [POOL])
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="lock timeout"), authority.fenced(auth):
            pass
        assert time.monotonic() - started < 4
        blocker.rollback()


def test_a_read_back_stale_epoch_refusal_is_sent_again_under_this_term(pool: TrinoPool) -> None:
    old = authority.acquire(POOL, "a.0000")
    with pytest.raises(EffectUnknown):
        effects.run_step(
            old,
            operation_id="op-8",
            kind="retire",
            step_id="seal",
            body={"g": 1},
            call=lambda p: (_ for _ in ()).throw(TimeoutError()),
        )
    new = authority.acquire(POOL, "b.0000")
    sent: list[str] = []
    state = effects.run_step(
        new,
        operation_id="op-8",
        kind="retire",
        step_id="seal",
        body={"g": 1},
        call=recorder(sent, {"state": "SEALED"}),
        read_back=lambda s: Settled("failed", {"code": "POOL_STALE_EPOCH"}),
    )
    assert state.outcome == "ok"
    assert len(sent) == 1
    assert json.loads(sent[0])["controllerEpoch"] == new.epoch
