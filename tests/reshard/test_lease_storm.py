"""A reshard in the middle of a lease storm (issue 15 item 1; safeguard reshard-83).

The API exactly as deployed (gunicorn with ``duckgres_admin.gunicorn_conf``), a real Celery
worker, the local launcher and a real runner process move a busy org's catalog cnpg → cnpg
while an asyncio client (aiohttp) drives grant / renew / release over that org and 24 others.
One lease of the busy org is held across the block (renewed while resharding, released a few
seconds later) so the drain has something to wait for.

What is asserted, from the database and the answers (never from wall-clock figures):

- **zero** leases granted to the busy org between the block's commit and the unblock. The
  window is stamped by the database itself: a trigger the test installs on the warehouse table
  records ``clock_timestamp()`` inside the block's ``UPDATE`` (the block holds the per-org lock
  from before that statement until its commit, so a grant stamped after it was decided after
  the commit) and inside the unblock's;
- the busy org's grant attempts in the window are answered ``503 warehouse_resharding`` and it
  is granted again after the unblock; the other orgs are granted throughout the window;
- no 5xx other than that 503, no socket error;
- the drain completed after the held lease was released, and the operation succeeded.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from django.conf import settings
from django.db import connection

from duckgres_admin.models import ConnectionLease, ReshardOperation, Warehouse
from tests.fixtures.api_client import ApiClient
from tests.fixtures.gunicorn import run_gunicorn
from tests.fixtures.leases import make_org
from tests.fixtures.processes import process_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

OTHER_ORGS = 24
OTHER_CLIENTS = 4
BUSY_CLIENTS = 3
THINK_SECONDS = 0.01
HOLD_AFTER_BLOCK_SECONDS = 4.0
STORM_STALE_SECONDS = 75

TRIGGER_SQL = """
CREATE TABLE lease_storm_transitions (
    org_id text NOT NULL, old_state text NOT NULL, new_state text NOT NULL,
    stamped_at timestamptz NOT NULL
);
-- SECURITY DEFINER: the runner's own login may not write this test table (reshard-133).
CREATE FUNCTION lease_storm_stamp() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO lease_storm_transitions VALUES
            (NEW.org_id, OLD.state, NEW.state, clock_timestamp());
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER lease_storm_stamp AFTER UPDATE ON duckgres_managed_warehouses
    FOR EACH ROW EXECUTE FUNCTION lease_storm_stamp();
"""
DROP_SQL = """
DROP TRIGGER IF EXISTS lease_storm_stamp ON duckgres_managed_warehouses;
DROP FUNCTION IF EXISTS lease_storm_stamp();
DROP TABLE IF EXISTS lease_storm_transitions;
"""


@dataclass
class Answer:
    org: str
    kind: str
    status: int
    code: str = ""


@dataclass
class Storm:
    base_url: str
    busy: str
    others: list[str]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    answers: list[Answer] = field(default_factory=list)
    socket_errors: list[str] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        return {"X-Duckgres-Dataplane-Secret": settings.DUCKGRES_DATAPLANE_SECRET}

    async def call(
        self, session: aiohttp.ClientSession, org: str, kind: str, method: str, path: str, body: Any
    ) -> tuple[int, Any]:
        url = f"{self.base_url}/api/v1/warehouses/{org}/leases{path}"
        try:
            async with session.request(method, url, json=body, headers=self.headers()) as resp:
                raw = await resp.read()
                parsed = json.loads(raw) if raw else None
                code = parsed.get("code", "") if isinstance(parsed, dict) else ""
                self.answers.append(Answer(org, kind, resp.status, code))
                return resp.status, parsed
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.socket_errors.append(f"{kind} {org}: {exc!r}")
            return 0, None

    async def client(self, session: aiohttp.ClientSession, orgs: list[str], n: int) -> None:
        i = n
        while not self.stop.is_set():
            org = orgs[i % len(orgs)]
            i += 1
            status, body = await self.call(
                session, org, "grant", "POST", "", {"holder": f"storm-{n}", "purpose": "query"}
            )
            if status == 201:
                lease = body["lease_id"]
                if i % 2:
                    await self.call(session, org, "renew", "POST", f"/{lease}/renew", {})
                await asyncio.sleep(THINK_SECONDS)
                await self.call(session, org, "release", "DELETE", f"/{lease}", None)
            await asyncio.sleep(THINK_SECONDS)

    async def held_lease(self, session: aiohttp.ClientSession, blocked: threading.Event) -> None:
        """One lease of the busy org held across the block: renewed while resharding, then
        released, so the drain must wait for it."""
        status, body = 0, None
        while status != 201 and not self.stop.is_set():
            status, body = await self.call(
                session, self.busy, "grant", "POST", "", {"holder": "held", "purpose": "worker"}
            )
            await asyncio.sleep(0.05)
        assert body is not None
        lease = body["lease_id"]
        while not blocked.is_set() and not self.stop.is_set():
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + HOLD_AFTER_BLOCK_SECONDS
        while time.monotonic() < deadline:
            await self.call(session, self.busy, "renew", "POST", f"/{lease}/renew", {})
            await asyncio.sleep(0.5)
        await self.call(session, self.busy, "release", "DELETE", f"/{lease}", None)

    async def run(self, blocked: threading.Event, done: threading.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        connector = aiohttp.TCPConnector(limit=OTHER_CLIENTS + BUSY_CLIENTS + 1)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            tasks = [
                asyncio.create_task(self.client(session, self.others, n))
                for n in range(OTHER_CLIENTS)
            ]
            tasks += [
                asyncio.create_task(self.client(session, [self.busy], n))
                for n in range(BUSY_CLIENTS)
            ]
            tasks.append(asyncio.create_task(self.held_lease(session, blocked)))
            while not done.is_set():
                await asyncio.sleep(0.1)
            self.stop.set()
            await asyncio.gather(*tasks)


def _transitions(org: str) -> list[tuple[str, str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT old_state, new_state, stamped_at FROM lease_storm_transitions "
            "WHERE org_id = %s ORDER BY stamped_at",
            [org],
        )
        return list(cursor.fetchall())


@pytest.fixture
def stamped_transitions(transactional_db: None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(DROP_SQL)
        cursor.execute(TRIGGER_SQL)
    yield
    with connection.cursor() as cursor:
        cursor.execute(DROP_SQL)


@pytest.mark.safeguard("reshard-83")
def test_a_reshard_in_a_lease_storm_grants_nothing_between_block_and_unblock(
    request,
    stamped_transitions,
    store_clusters,
    tenant_catalog,
    make_store,
    make_warehouse,
    s3_bucket,
    tmp_path: Path,
):
    catalog = tenant_catalog(store_clusters.source, rows=3)
    source = make_store(store_clusters.source)
    target = make_store(store_clusters.target)
    busy = make_warehouse(
        store=source,
        catalog=catalog,
        compaction_enabled=True,
        data_bucket=s3_bucket.bucket,
        data_region=s3_bucket.region,
        max_connection_leases=20,
    ).org_id
    others = [make_org(f"storm-{i:02d}", cap=2).org_id for i in range(OTHER_ORGS)]
    # The storm saturates both cores on purpose. The suite's stale window (62 s) makes a runner
    # self-fence after 2 s without a heartbeat, which a starved heartbeat thread can miss here;
    # this test is about admission, not fencing, so its runner gets 15 s (stale 75 s).
    worker = request.getfixturevalue("celery_worker_factory")(
        extra_env={**s3_bucket.env(), "DUCKGRES_RESHARD_STALE_SECONDS": str(STORM_STALE_SECONDS)}
    )
    env = process_env(DUCKGRES_API_METRICS_PORT="0")
    with run_gunicorn(env, tmp_path / "gunicorn.log") as server:
        base_url = f"http://127.0.0.1:{server.port}"
        storm = Storm(base_url, busy, others)
        blocked, done = threading.Event(), threading.Event()
        loop_errors: list[BaseException] = []

        def drive() -> None:
            try:
                asyncio.run(storm.run(blocked, done))
            except BaseException as exc:  # surfaced below
                loop_errors.append(exc)

        driver = threading.Thread(target=drive, name="lease-storm")
        driver.start()
        try:
            time.sleep(2.0)  # the storm is on before the reshard starts
            api = ApiClient.internal(base_url, settings.DUCKGRES_INTERNAL_SECRET)
            resp = api.start_reshard(busy, {"target": {"type": "cnpg", "cnpg_shard": target.name}})
            assert resp.status == 202, resp.raw[:1000]
            op_id = int(resp.body["id"])
            deadline = time.monotonic() + 240
            op: dict[str, Any] = {}
            while time.monotonic() < deadline:
                if not blocked.is_set() and _transitions(busy):
                    blocked.set()
                op = api.op(op_id)
                if op["state"] in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # the storm goes on past the unblock
        finally:
            done.set()
            driver.join(timeout=60)
        log = server.log_text()
        entries = api.log_entries(op_id)
    messages = "\n".join(e["message"] for e in entries)
    context = f"op {op}\n--- op log ---\n{messages}\n--- runner ---\n{worker.runner_logs()}"
    assert not loop_errors, loop_errors
    assert not driver.is_alive()
    assert op.get("state") == "succeeded", context

    # The window, stamped by the database inside the block's and the unblock's UPDATE.
    moves = _transitions(busy)
    assert [(old, new) for old, new, _ in moves] == [
        ("ready", "resharding"),
        ("resharding", "ready"),
    ], moves
    block_stamp, unblock_stamp = moves[0][2], moves[1][2]
    leases = ConnectionLease.objects.filter(org_id=busy)
    assert leases.filter(granted_at__lt=block_stamp).exists()  # the storm was on before
    in_window = leases.filter(granted_at__gte=block_stamp, granted_at__lte=unblock_stamp)
    assert list(in_window.values_list("id", "holder", "granted_at")) == []
    # Every busy-org grant attempt of the window was refused by the barrier, and there were
    # some; after the unblock the org is granted again.
    refused = leases.filter(
        state="refused", requested_at__gte=block_stamp, requested_at__lte=unblock_stamp
    )
    assert refused.exists()
    assert leases.filter(granted_at__gt=unblock_stamp).exists(), "no grant after the unblock"
    assert ConnectionLease.objects.filter(
        org_id__in=others, granted_at__gte=block_stamp, granted_at__lte=unblock_stamp
    ).exists(), "the other orgs were not granted during the window"
    # The op's own window agrees: ``blocked_at`` is stamped (statement time) by a later
    # statement of the block's transaction, ``unblocked_at`` by the finalize's.
    stamped = ReshardOperation.objects.get(pk=op_id)
    assert stamped.blocked_at is not None
    assert stamped.unblocked_at is not None
    assert block_stamp <= stamped.blocked_at < stamped.unblocked_at
    assert not leases.filter(
        granted_at__gte=stamped.blocked_at, granted_at__lte=stamped.unblocked_at
    ).exists()

    # Answers: no socket error, no 5xx but the busy org's 503 warehouse_resharding on a grant.
    assert not storm.socket_errors, storm.socket_errors[:10]
    fives = [
        a
        for a in storm.answers
        if a.status >= 500 and not (a.org == busy and a.kind == "grant" and a.status == 503)
    ]
    assert fives == [], (fives[:10], log[-3000:])
    assert all(a.code == "warehouse_resharding" for a in storm.answers if a.status == 503), (
        storm.answers
    )
    assert any(a.org == busy and a.status == 503 for a in storm.answers)
    # The lease held across the block was renewed while resharding, then released.
    renewals = [a for a in storm.answers if a.org == busy and a.kind == "renew"]
    assert renewals
    assert {a.status for a in renewals} == {200}, renewals
    held = leases.get(holder="held")
    assert held.state == "released"
    assert held.released_at is not None
    assert block_stamp < held.released_at < unblock_stamp
    # The drain waited for it: "drained" is logged after the held lease was released.
    drained = [e for e in entries if e["message"].startswith("drained: 0 active leases")]
    assert len(drained) == 1, context
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT %s::timestamptz > %s::timestamptz", [drained[0]["ts"], held.released_at]
        )
        assert cursor.fetchone() == (True,), context
    assert Warehouse.objects.get(org_id=busy).state == "ready"
