"""Two operator processes on the same pools (issue: authority terms; spec trino-pools §4.3).

Each child runs the real operator loop (``tests/trino/operator_child.py``) with its own ``trino``
lease and owner identity against the same config store, kube-apiserver, Gateway double and
catalog store. The lease is shortened to seconds through the settings, never slept out in full.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from duckgres_admin.lib.gateway import GatewayClient, GatewayRefused
from duckgres_admin.models.trino import TrinoPool
from tests.fixtures.processes import ROOT, process_env
from tests.fixtures.trino import CatalogStore
from tests.trino.gateway_double import GatewayDouble
from tests.trino.operator_harness import PoolWorld, make_world
from trino_pools import authority, catalog_store, config
from trino_pools.authority import Authority, PoolConflict
from trino_pools.catalog_writer import CatalogWriter, WriterFenced

pytestmark = [pytest.mark.kube, pytest.mark.django_db(transaction=True)]

POOLS = ("pool-a", "pool-b")
LEASE_SECONDS = 4
RENEW_DEADLINE_SECONDS = 3


@pytest.fixture
def two_pools(
    kube_api: Any,
    gateway: GatewayDouble,
    tmp_path: Path,
    settings: Any,
    catalog_store: CatalogStore,
    trino_lease_row: None,
) -> Iterator[PoolWorld]:
    with psycopg.connect(catalog_store.dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {catalog_store.schema}")
        conn.execute(catalog_store_ddl())
    world = make_world(
        kube_api, gateway, tmp_path, settings, pools=POOLS, catalog_store=catalog_store
    )
    try:
        yield world
    finally:
        world.close()
        config.install_for_tests(None)


def catalog_store_ddl() -> str:
    return catalog_store.BOOTSTRAP_DDL


class Child:
    def __init__(self, world: PoolWorld, name: str) -> None:
        spec_path = world.tmp / f"{name}.json"
        fields = {
            f.name: getattr(world.settings, f.name)
            for f in dataclasses.fields(world.settings)
            if f.name not in ("cells", "warnings")
        }
        spec_path.write_text(
            json.dumps(
                {
                    "settings": fields,
                    "registry": (world.tmp / "cells.json").read_text(encoding="utf-8"),
                    "gateway_token": world.gateway.token,
                    "interval": 0.3,
                }
            ),
            encoding="utf-8",
        )
        env = process_env(
            POD_NAME=name,
            PYTHONWARNINGS="ignore",
            DUCKGRES_JANITOR_LEASE_SECONDS=str(LEASE_SECONDS),
            DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS=str(RENEW_DEADLINE_SECONDS),
            **world.kube.env(),
        )
        self.log = world.tmp / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/trino/operator_child.py"), str(spec_path)],
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            if raw.startswith('{"leader"'):
                out.append(json.loads(raw))
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def authorities() -> dict[str, tuple[int, str]]:
    return {p.pool_id: (int(p.authority_epoch), p.authority_owner) for p in TrinoPool.objects.all()}


def test_one_authority_per_pool_takeover_after_kill_and_old_term_fenced_everywhere(
    two_pools: PoolWorld, catalog_store: CatalogStore
) -> None:
    world = two_pools
    a = Child(world, "operator-a")
    b: Child | None = None
    try:
        wait_for(
            lambda: (
                len(authorities()) == len(POOLS)
                and all(owner.startswith("operator-a.") for _, owner in authorities().values())
            ),
            "operator-a to hold both pools",
        )
        b = Child(world, "operator-b")
        wait_for(lambda: len(b.lines()) >= 5, "operator-b to tick five times")
        held = authorities()
        assert all(epoch == 1 for epoch, _ in held.values()), held  # one authority, no fights
        assert not any(line["terms"] for line in b.lines())  # the follower has no terms

        a.kill()
        old = {pool: Authority(pool, owner, epoch) for pool, (epoch, owner) in held.items()}
        wait_for(
            lambda: (
                all(
                    epoch == 2 and owner.startswith("operator-b.")
                    for epoch, owner in authorities().values()
                )
                and len(authorities()) == len(POOLS)
            ),
            "operator-b to take both pools over with a new epoch",
            timeout=LEASE_SECONDS * 6,
        )
        # Operator-b reconfigures each pool at its new epoch before anything else.
        wait_for(
            lambda: all(
                (world.gateway.pool(world.routing_group(p)) or {}).get("epoch") == 2 for p in POOLS
            ),
            "the Gateway to record epoch 2 for both pools",
        )

        for pool_id, stale in old.items():
            # The config store refuses the old term.
            with pytest.raises(PoolConflict), authority.fenced(stale):
                pass
            # The Gateway refuses the old term's envelope.
            cell = world.settings.cell_by_stored_id(pool_id)
            assert cell is not None
            client = GatewayClient(world.gateway.url, world.gateway.token, allow_http=True)
            body = json.dumps(
                {
                    "operationId": f"pool-config:{cell.id}",
                    "stepId": "configure.e1.s99",
                    "controllerEpoch": stale.epoch,
                    "ownerIdentity": stale.owner,
                    "apiMode": "POOLED",
                    "minServing": 1,
                    "desiredMembers": 1,
                    "maxSurge": 1,
                    "maxRepair": 1,
                    "desiredRevision": "stale",
                    "tenantAdmissionEnabled": False,
                }
            )
            with pytest.raises(GatewayRefused) as refused:
                client.send("PUT", GatewayClient.pool_path(cell.routing_group), body)
            assert refused.value.code == "POOL_STALE_EPOCH"
            # The catalog store refuses the old term's writer.
            writer = CatalogWriter(
                catalog_store.dsn, catalog_store.schema, pool_id, stale.epoch, stale.owner
            )
            try:
                with pytest.raises(WriterFenced):
                    writer.apply("org_stale", {"connector.name": "x"}, "0" * 64)
            finally:
                writer.close()
    finally:
        a.kill()
        if b is not None:
            b.kill()
