"""Tenant admission (spec trino-pools §4.11; safeguards 28, 29, 30) on a real config store, a real
catalog store, the protocol-faithful Gateway double and stand-in coordinators.

Instances are inserted as SERVING rows and registered in the Gateway double as ACTIVE members
through the real client; receipts probe the coordinator doubles through the test DNS seam
(``probes.CONNECT_OVERRIDES``) with a fixed observer credential (the term's
``observer_credentials`` hook).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from django.db import connection

from duckgres_admin.lib.gateway import GatewayClient, GatewayRefused
from duckgres_admin.models import WarehouseTrino
from duckgres_admin.models.trino import (
    InstancePhase,
    PublicationState,
    TrinoPool,
    TrinoPoolInstance,
    TrinoPoolPublication,
)
from tests.trino.coordinator_double import CoordinatorDouble
from tests.trino.gateway_double import GatewayDouble, gateway  # noqa: F401
from tests.trino.helpers import cell, full_env, registry, with_pool, write
from trino_pools import authority, catalog_writer, effects, reconcile, term_metrics
from trino_pools.authority import PoolConflict
from trino_pools.catalog_store import BOOTSTRAP_DDL
from trino_pools.catalogs import binding_revision, catalog_name, payload_hash
from trino_pools.config import load
from trino_pools.desired import Desired
from trino_pools.lease import TrinoLease
from trino_pools.operator import (
    AdmissionMemory,
    Operator,
    PoolContext,
    PoolTerm,
    admission,
    seed_pool,
)

pytestmark = pytest.mark.django_db

OWNER = "duckgres-admin-0.admissiontest"
CRED = ("observer-a", "pw-a-" + "9" * 8)


@dataclass
class Env:
    ctx: PoolContext
    gw: GatewayDouble
    client: GatewayClient
    writer: catalog_writer.CatalogWriter
    make_warehouse: Any
    coordinators: list[CoordinatorDouble] = field(default_factory=list)
    seq: int = 0

    @property
    def rg(self) -> str:
        return self.ctx.cell.routing_group

    @property
    def pool_id(self) -> str:
        return self.ctx.auth.pool_id

    def tick(self) -> Exception | None:
        """One admission pass; returns the exception it raised (counted by the operator)."""
        self.ctx.pool = TrinoPool.objects.get(pool_id=self.pool_id)
        try:
            admission.run(self.ctx)
        except PoolConflict:
            raise
        except Exception as exc:  # the operator counts these
            return exc
        return None

    def mutation(self, op: str, step: str, **body: Any) -> str:
        return effects.canonical({**body, **effects.envelope(self.ctx.auth, op, step)})

    def org(self, org_id: str, db_name: str, *, publish_catalog: bool = True) -> None:
        warehouse = self.make_warehouse(org_id=org_id, database_name=db_name)
        name = catalog_name(db_name)
        WarehouseTrino.objects.create(
            warehouse=warehouse, enabled=True, trino_cell_id=self.pool_id, catalog_name=name
        )
        if publish_catalog:
            definition = {"catalog": name, "org_id": org_id}
            self.writer.apply(name, definition, payload_hash(definition))

    def member(self) -> tuple[str, CoordinatorDouble]:
        """A SERVING instance row, ACTIVE at the Gateway, backed by a coordinator double."""
        self.seq += 1
        instance_id = f"cell-{secrets.token_hex(4)}"
        coordinator = CoordinatorDouble(applied_revision=self.writer.revision())
        self.coordinators.append(coordinator)
        ns = self.ctx.cell.namespace
        endpoint = coordinator.host_alias(instance_id, ns)
        backend = f"{self.rg}-{instance_id}"
        op = f"instance:{instance_id}"
        self.client.send(
            "POST",
            GatewayClient.BACKEND_ADD,
            effects.canonical(
                {"name": backend, "proxyTo": endpoint, "active": False, "routingGroup": self.rg}
            ),
        )
        registered = self.client.send(
            "POST",
            GatewayClient.pool_path(self.rg, "members"),
            self.mutation(
                op,
                "register",
                memberId=instance_id,
                backendName=backend,
                podUid=f"pod-{instance_id}",
                bootId=coordinator.process_id,
                configRevision="rel-1",
                repairFor="",
            ),
        )
        self.client.send(
            "POST",
            GatewayClient.pool_path(self.rg, "members", instance_id, "admit"),
            self.mutation(
                op,
                "admit",
                expectedGeneration=registered["generation"],
                receipt={
                    "certificateHash": "c" * 64,
                    "configRevision": "rel-1",
                    "authRevision": "",
                    "podUid": registered["podUid"],
                    "bootId": registered["bootId"],
                    "nodeId": registered["nodeId"],
                    "coordinatorId": registered["coordinatorId"],
                    "readyWorkers": 2,
                    "checks": ["image", "workers", "catalog-revision", "operational-connection"],
                },
            ),
        )
        TrinoPoolInstance.objects.create(
            instance_id=instance_id,
            pool_id=self.pool_id,
            phase=InstancePhase.SERVING,
            endpoint_url=endpoint,
            coordinator_boot_id=coordinator.process_id,
            blueprint_snapshot={"namespace": ns},
        )
        return instance_id, coordinator

    def tenant(self, org_id: str) -> dict[str, Any]:
        found = self.gw.tenant(self.rg, org_id)
        assert found is not None, org_id
        return found

    def publication(self, pub: str) -> dict[str, Any]:
        found = self.gw.publication(self.rg, pub)
        assert found is not None, pub
        return found

    def row(self, org_id: str) -> admission.Row:
        return admission.load_rows(self.pool_id)[org_id]

    def unblock(self) -> None:
        """Time passes: every tenant's backoff is over."""
        TrinoPoolPublication.objects.filter(pool_id=self.pool_id).update(next_attempt_at=None)

    def steps(self, method: str, path_regex: str) -> list[str]:
        return [
            str(body.get("stepId"))
            for _m, _p, _h, body in self.gw.requests_to(method, path_regex)
            if isinstance(body, dict)
        ]


@pytest.fixture
def env(
    tmp_path: Any,
    gateway: GatewayDouble,  # noqa: F811
    catalog_store: Any,
    make_warehouse: Any,
    trino_settings_reset: None,
) -> Iterator[Env]:
    doc = with_pool(cell("pool-a"), desired_instances=2, min_serving=1)
    settings = load(
        full_env(tmp_path, DUCKGRES_TRINO_CELLS_FILE=write(tmp_path, "c.json", registry(doc))),
        service_account_token="/nonexistent",
    )
    pool_cell = settings.cells[0]
    seed_pool(pool_cell)
    auth = authority.acquire(pool_cell.stored_id, OWNER)
    authority.HOLDER.install(auth)
    with psycopg.connect(
        catalog_store.dsn, options=f"-c search_path={catalog_store.schema}", autocommit=True
    ) as conn:
        conn.execute(BOOTSTRAP_DDL)
    writer = catalog_writer.CatalogWriter(
        catalog_store.dsn, catalog_store.schema, auth.pool_id, auth.epoch, auth.owner
    )
    writer.takeover()
    catalog_writer.install(auth.pool_id, writer)
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    term = PoolTerm(
        pool_id=auth.pool_id,
        auth=auth,
        metrics_token=term_metrics.begin_term(pool_cell.id),
        started_mono=0.0,
    )
    term.observer_credentials = lambda _ns: CRED
    # The tick renews the trino lease before every effect: this test's operator holds it.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO duckgres_leases (name, holder, epoch, expires_at) "
            "VALUES ('trino', '', 0, '-infinity') ON CONFLICT (name) DO UPDATE "
            "SET expires_at = '-infinity'"
        )
    leader = TrinoLease(holder=OWNER)
    assert leader.acquire()
    ctx = PoolContext(
        Operator(leader_lease=leader).ensure_leading,
        settings,
        pool_cell,
        Desired(cell=pool_cell, blueprint=None),
        term,
        client,
        TrinoPool.objects.get(pool_id=auth.pool_id),
    )
    e = Env(ctx, gateway, client, writer, make_warehouse)
    client.send(
        "PUT",
        GatewayClient.pool_path(e.rg),
        e.mutation(
            "pool-config:pool-a",
            "configure.test",
            apiMode="POOLED",
            minServing=1,
            desiredMembers=2,
            maxSurge=1,
            maxRepair=1,
            desiredRevision="rel-1",
            tenantAdmissionEnabled=True,
        ),
    )
    try:
        yield e
    finally:
        for coordinator in e.coordinators:
            coordinator.close()
        catalog_writer.uninstall(auth.pool_id)
        authority.HOLDER.clear(auth.pool_id)
        term_metrics.end_term(pool_cell.id, term.metrics_token)


# --- identities ----------------------------------------------------------------------------------


def test_identities_follow_the_spec_formulas() -> None:
    binding = binding_revision(["acme_wh"])
    target = admission.target_revision(binding, 3)
    assert target == f"b{binding}.a3"
    assert admission.binding_of(target) == binding
    pub = admission.publication_id("org-42", target)
    import hashlib

    assert pub == "pub." + hashlib.sha256(f"org-42\x00{target}".encode()).hexdigest()[:24]
    assert (
        admission.open_payload_hash("org-42", target, 118)
        == hashlib.sha256(f"org-42\x00{target}\x00118".encode()).hexdigest()
    )
    assert admission.operation_id("org-42") == "tenant:org-42"
    assert admission.receipt_step(pub, "cell-1a2b3c4d") == f"receipt.{pub}.cell-1a2b3c4d"


def test_step_ids_overflow_keeps_the_leading_part_and_a_digest() -> None:
    import hashlib

    short = "receipt.pub.0123456789abcdef01234567.cell-1a2b3c4d"
    assert admission.step_id(short) == short
    exactly = "x" * 64
    assert admission.step_id(exactly) == exactly
    long = "receipt.pub.0123456789abcdef01234567." + "member-with-a-very-long-name-" * 2
    got = admission.step_id(long)
    assert len(got) == 64
    assert got == long[:39] + "." + hashlib.sha256(long.encode()).hexdigest()[:24]
    other = admission.step_id(long + "x")
    assert other != got
    assert other[:39] == got[:39]


def test_backoff_is_full_jitter_doubling_from_half_a_second_capped_at_thirty() -> None:
    assert admission.backoff_delay(1, lambda: 0.0) == 0.5
    assert admission.backoff_delay(1, lambda: 0.999) == pytest.approx(0.5 + 0.4995)
    assert admission.backoff_delay(2, lambda: 0.999) == pytest.approx(0.5 + 0.999)
    assert admission.backoff_delay(4, lambda: 0.5) == pytest.approx(0.5 + 2.0)
    assert admission.backoff_delay(30, lambda: 0.999) == pytest.approx(0.5 + 29.97)
    assert admission.backoff_delay(1000, lambda: 0.999) <= 30.5


# --- the full path -------------------------------------------------------------------------------


def test_full_admission_path_and_the_ready_gate(env: Env) -> None:
    env.org("org-1", "acme_wh")
    instance_id, coordinator = env.member()
    assert reconcile._gate("org-1", env.ctx.cell)[0] == "provisioning"

    assert env.tick() is None  # publish the binding
    row = env.row("org-1")
    assert row.state == PublicationState.PUBLISHED
    assert row.principal_revision == binding_revision(["acme_wh"])
    assert env.steps("PUT", r"/tenants/org-1/principals$") == ["principals.a1"]
    assert env.tenant("org-1")["principals"] == ["acme_wh"]
    state, message = reconcile._gate("org-1", env.ctx.cell)
    assert (state, message) == (
        "provisioning",
        "waiting for the pool to admit this warehouse: published",
    )

    assert env.tick() is None  # open the barrier
    row = env.row("org-1")
    target = admission.target_revision(row.principal_revision, 1)
    pub = admission.publication_id("org-1", target)
    assert row.state == PublicationState.ADMITTING
    assert row.publication_id == pub
    assert row.target_revision == target
    opened = env.publication(pub)
    assert opened["state"] == "OPEN"
    assert opened["requiredMembers"] == [instance_id]
    assert opened["catalogRevision"] == env.writer.revision()

    assert env.tick() is None  # one receipt, after probing the member
    assert env.publication(pub)["receipts"] == [instance_id]
    assert "/v1/catalog/sync" in coordinator.paths()
    assert env.steps("POST", r"/receipts$") == [f"receipt.{pub}.{instance_id}"]

    assert env.tick() is None  # commit
    row = env.row("org-1")
    assert row.state == PublicationState.ADMITTED
    assert row.admitted_target_revision == target
    assert row.publication_id == ""
    assert env.tenant("org-1")["admittedTargetRevision"] == target
    assert reconcile._gate("org-1", env.ctx.cell) == ("ready", "")

    calls = len(env.gw.requests)
    assert env.tick() is None  # nothing left to do
    assert all(m == "GET" for m, *_ in env.gw.requests[calls:])


def test_a_member_whose_process_restarted_gives_no_receipt(env: Env) -> None:
    env.org("org-1", "acme_wh")
    _instance_id, coordinator = env.member()
    env.tick()
    env.tick()
    coordinator.restart()
    error = env.tick()
    assert isinstance(error, admission.AdmissionError)
    assert "restarted" in str(error)
    assert env.steps("POST", r"/receipts$") == []
    row = env.row("org-1")
    assert row.next_attempt_at is not None
    assert "restarted" in row.last_error
    # in backoff: the barrier is released (it must not block member joins), nothing raised
    env.tick()
    assert env.row("org-1").publication_id == ""
    assert env.gw.requests_to("POST", r"/abandon$")


def test_no_admission_without_revision_evidence(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.member()
    catalog_writer.uninstall(env.pool_id)  # no writer in this process: the watermark is unproven
    error = env.tick()
    assert isinstance(error, authority.NotThisReplica)
    assert env.gw.requests_to("PUT", r"/principals$") == []
    assert not TrinoPoolPublication.objects.filter(pool_id=env.pool_id).exists()


def test_a_barrier_is_not_opened_before_the_catalog_is_in_the_store(env: Env) -> None:
    env.org("org-1", "acme_wh", publish_catalog=False)
    env.member()
    env.tick()  # publish the binding
    env.tick()
    assert env.gw.requests_to("POST", r"/publications$") == []
    definition = {"catalog": catalog_name("acme_wh")}
    env.writer.apply(catalog_name("acme_wh"), definition, payload_hash(definition))
    env.tick()
    assert len(env.gw.requests_to("POST", r"/publications$")) == 1


# --- safeguard 30 --------------------------------------------------------------------------------


@pytest.mark.safeguard("trino-30")
def test_publish_revoke_publish_each_reaches_the_gateway_under_its_own_step(env: Env) -> None:
    env.org("org-1", "acme_wh")  # no members: serving < min_serving, no barrier is opened
    assert env.tick() is None
    WarehouseTrino.objects.filter(warehouse_id="org-1").update(enabled=False)
    assert env.tick() is None
    assert env.row("org-1").state == PublicationState.REVOKED
    assert env.tenant("org-1")["state"] == "REVOKED"
    WarehouseTrino.objects.filter(warehouse_id="org-1").update(enabled=True)
    assert env.tick() is None
    sent = [
        (method, body["stepId"])
        for method, path, _h, body in env.gw.requests
        if "/tenants/org-1" in path and method in ("PUT", "DELETE")
    ]
    assert sent == [("PUT", "principals.a1"), ("DELETE", "revoke.a2"), ("PUT", "principals.a3")]
    revoke = env.gw.requests_to("DELETE", r"/tenants/org-1$")[0][3]
    assert revoke["reason"] == "the warehouse is no longer served by this pool"
    assert env.tenant("org-1")["state"] != "REVOKED"
    assert env.row("org-1").state == PublicationState.PUBLISHED


def test_a_lost_response_is_settled_by_the_stored_body_under_the_same_occurrence(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.gw.fail_next("PUT", r"/principals$", drop_response=True)
    error = env.tick()
    assert isinstance(error, effects.EffectUnknown)
    row = env.row("org-1")
    assert row.pending_intent == "principals"
    assert row.attempt == 1
    # The binding changes meanwhile: the pinned intent is still settled first, byte for byte.
    from duckgres_admin.models import Warehouse

    Warehouse.objects.filter(org_id="org-1").update(database_name="acme_wh2")
    env.unblock()
    assert env.tick() is None
    row = env.row("org-1")
    assert row.pending_intent == ""
    assert row.attempt == 1
    assert row.principal_revision == binding_revision(["acme_wh"])
    assert env.steps("PUT", r"/principals$") == ["principals.a1"]  # resolved by read-back
    env.tick()  # now the new binding, as a new occurrence
    assert env.steps("PUT", r"/principals$") == ["principals.a1", "principals.a2"]
    assert env.tenant("org-1")["principals"] == ["acme_wh2"]


def test_a_refusal_closes_the_occurrence_and_backs_off(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.gw.fail_next("PUT", r"/principals$", refuse="POOL_PRINCIPAL_CONFLICT")
    error = env.tick()
    assert isinstance(error, GatewayRefused)
    assert error.code == "POOL_PRINCIPAL_CONFLICT"
    row = env.row("org-1")
    assert row.pending_intent == ""
    assert row.state == PublicationState.FAILED
    assert row.next_attempt_at is not None
    assert row.attempts == 1
    calls = len(env.gw.requests)
    assert env.tick() is None  # in backoff: nothing sent, nothing raised
    assert len(env.gw.requests) == calls
    env.unblock()
    assert env.tick() is None
    assert env.steps("PUT", r"/principals$") == ["principals.a1", "principals.a2"]
    assert env.row("org-1").attempts == 0


def test_a_stale_epoch_ends_the_term(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.gw.fail_next("PUT", r"/principals$", refuse="POOL_STALE_EPOCH")
    with pytest.raises(PoolConflict):
        env.tick()


# --- safeguard 29 --------------------------------------------------------------------------------


@pytest.mark.safeguard("trino-29")
def test_one_live_barrier_released_for_a_candidate_and_receipts_per_publication(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.org("org-2", "bravo_wh")
    env.tick()  # no member serves yet: both bindings are published, no barrier opens
    env.tick()
    assert env.gw.requests_to("POST", r"/publications$") == []
    instance_id, _ = env.member()
    assert env.tick() is None  # one barrier opens
    live = [r for r in admission.load_rows(env.pool_id).values() if r.publication_id]
    assert len(live) == 1
    first = live[0]
    assert env.tick() is None  # services that barrier (a receipt); the other tenant waits
    assert len([r for r in admission.load_rows(env.pool_id).values() if r.publication_id]) == 1
    assert env.steps("POST", r"/receipts$") == [f"receipt.{first.publication_id}.{instance_id}"]
    assert len(env.gw.requests_to("POST", r"/publications$")) == 1

    # A candidate is waiting to join: compute wins.
    candidate = TrinoPoolInstance.objects.create(
        instance_id=f"cell-{secrets.token_hex(4)}",
        pool_id=env.pool_id,
        phase=InstancePhase.VALIDATING,
    )
    assert env.tick() is None
    abandon = env.gw.requests_to("POST", r"/abandon$")
    assert abandon[-1][3]["reason"] == "a candidate is waiting to join"
    assert env.publication(first.publication_id)["state"] == "ABANDONED"
    assert env.row(first.org_id).publication_id == ""
    calls = len(env.gw.requests_to("POST", r"/publications$"))
    env.tick()  # no barrier opens while the candidate validates
    assert len(env.gw.requests_to("POST", r"/publications$")) == calls

    # The candidate joined; the tenant gets a new barrier and its receipt reaches the Gateway
    # again under a step id that carries the new publication id.
    candidate.delete()
    for _ in range(8):
        env.tick()
        env.unblock()
    receipts = env.steps("POST", r"/receipts$")
    assert receipts[0] == f"receipt.{first.publication_id}.{instance_id}"
    assert len(set(receipts)) == len(receipts) >= 3
    assert all(s.startswith("receipt.pub.") and s.endswith(instance_id) for s in receipts)
    rows = admission.load_rows(env.pool_id)
    assert all(r.state == PublicationState.ADMITTED for r in rows.values())
    assert rows[first.org_id].admitted_target_revision != first.target_revision


def test_release_barrier_is_public_for_the_instance_steps(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.member()
    env.tick()
    env.tick()
    assert env.row("org-1").publication_id
    assert admission.release_barrier(env.ctx, "a candidate is waiting to join") is True
    assert env.row("org-1").publication_id == ""
    assert env.row("org-1").state == PublicationState.PUBLISHED
    assert admission.release_barrier(env.ctx, "a candidate is waiting to join") is False


def test_a_barrier_of_an_earlier_term_is_released_not_committed(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.member()
    env.tick()
    env.tick()
    pub = env.row("org-1").publication_id
    # A new term: the barrier basis is unknown to this process.
    env.ctx.term.admission = AdmissionMemory()
    env.ctx.term.observer_credentials = lambda _ns: CRED
    env.tick()
    assert env.publication(pub)["state"] == "ABANDONED"
    assert env.gw.requests_to("POST", r"/commit$") == []


# --- safeguard 28 --------------------------------------------------------------------------------


@pytest.mark.safeguard("trino-28")
def test_a_permanently_failing_tenant_does_not_stop_other_tenants(env: Env) -> None:
    env.org("org-a", "alpha_wh")
    env.org("org-b", "bravo_wh")
    env.org("org-c", "charlie_wh")
    for _ in range(6):
        env.gw.fail_next("PUT", r"/tenants/org-a/principals$", refuse="POOL_PRINCIPAL_CONFLICT")
    errors = []
    for _ in range(3):
        errors.append(env.tick())
        env.unblock()  # time passes: backoff alone would not let the others through
    rows = admission.load_rows(env.pool_id)
    assert rows["org-b"].state == PublicationState.PUBLISHED
    assert rows["org-c"].state == PublicationState.PUBLISHED
    assert rows["org-a"].state == PublicationState.FAILED
    assert any(isinstance(e, GatewayRefused) for e in errors)


def test_departed_tenant_without_gateway_state_is_revoked_without_a_call(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.gw.fail_next("PUT", r"/principals$", refuse="POOL_PRINCIPAL_CONFLICT")
    env.tick()
    WarehouseTrino.objects.filter(warehouse_id="org-1").update(trino_cell_id="registered:pool-b")
    env.unblock()
    assert env.tick() is None
    assert env.row("org-1").state == PublicationState.REVOKED
    assert env.gw.requests_to("DELETE", r"/tenants/") == []
    assert reconcile._gate("org-1", env.ctx.cell)[1] == "this warehouse's admission was revoked"


def test_rows_are_kept_after_revoke(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.tick()
    WarehouseTrino.objects.filter(warehouse_id="org-1").update(enabled=False)
    env.tick()
    assert TrinoPoolPublication.objects.filter(pool_id=env.pool_id, org_id="org-1").exists()


def test_pool_without_tenant_admission_does_nothing(env: Env) -> None:
    spec = dataclasses.replace(env.ctx.cell.pool, tenant_admission=False)
    env.ctx.cell = dataclasses.replace(env.ctx.cell, pool=spec)
    env.org("org-1", "acme_wh")
    assert env.tick() is None
    assert env.gw.requests_to("PUT", r"/principals$") == []


# --- revision evidence, lost answers, membership -------------------------------------------------


@pytest.mark.safeguard("trino-18")
def test_every_pass_recovers_the_revision_watermark_first(env: Env) -> None:
    env.org("org-1", "acme_wh")  # the catalog write bumps the store, not the pool row
    assert TrinoPool.objects.get(pool_id=env.pool_id).publication_revision == 0
    assert env.tick() is None
    assert TrinoPool.objects.get(pool_id=env.pool_id).publication_revision == env.writer.revision()


def test_a_lost_open_answer_is_read_back_not_opened_twice(env: Env) -> None:
    env.org("org-1", "acme_wh")
    instance_id, _ = env.member()
    env.tick()  # principals
    env.gw.fail_next("POST", r"/publications$", drop_response=True)
    assert isinstance(env.tick(), effects.EffectUnknown)
    row = env.row("org-1")
    assert row.publication_id
    assert row.state == PublicationState.ADMITTING
    env.unblock()
    for _ in range(3):
        assert env.tick() is None
    assert len(env.gw.requests_to("POST", r"/publications$")) == 1
    assert env.row("org-1").state == PublicationState.ADMITTED
    assert env.steps("POST", r"/receipts$") == [f"receipt.{row.publication_id}.{instance_id}"]


def test_a_membership_change_releases_the_barrier(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.member()
    leaving, _ = env.member()
    env.tick()
    env.tick()
    pub = env.row("org-1").publication_id
    assert leaving in env.publication(pub)["requiredMembers"]
    env.client.send(  # a member drains: the membership generation moves
        "POST",
        GatewayClient.pool_path(env.rg, "members", leaving, "drain"),
        env.mutation(f"instance:{leaving}", "drain"),
    )
    assert env.tick() is None
    assert env.publication(pub)["state"] == "ABANDONED"
    assert env.gw.requests_to("POST", r"/abandon$")[-1][3]["reason"] == admission.MEMBERSHIP_REASON
    assert env.gw.requests_to("POST", r"/receipts$") == []


def test_a_departing_tenant_releases_its_barrier_then_is_revoked(env: Env) -> None:
    env.org("org-1", "acme_wh")
    env.member()
    env.tick()
    env.tick()
    pub = env.row("org-1").publication_id
    WarehouseTrino.objects.filter(warehouse_id="org-1").update(enabled=False)
    assert env.tick() is None
    assert env.publication(pub)["state"] == "ABANDONED"
    assert env.gw.requests_to("DELETE", r"/tenants/org-1$") == []
    assert env.tick() is None
    assert env.steps("DELETE", r"/tenants/org-1$") == ["revoke.a2"]
    row = env.row("org-1")
    assert row.state == PublicationState.REVOKED
    assert row.admitted_target_revision == ""
    assert reconcile._gate("org-1", env.ctx.cell)[0] == "provisioning"


def test_an_admitted_tenant_stays_ready_while_a_new_binding_is_admitted(env: Env) -> None:
    from duckgres_admin.models import Warehouse

    env.org("org-1", "acme_wh")
    env.member()
    for _ in range(4):
        env.tick()
    first = env.row("org-1").admitted_target_revision
    assert first
    Warehouse.objects.filter(org_id="org-1").update(database_name="acme_wh_v2")
    seen = []
    for _ in range(4):
        assert env.tick() is None
        seen.append(reconcile._gate("org-1", env.ctx.cell)[0])
    assert seen == ["ready"] * 4
    row = env.row("org-1")
    assert row.admitted_target_revision != first
    assert admission.binding_of(row.admitted_target_revision) == binding_revision(["acme_wh_v2"])
    assert env.steps("PUT", r"/principals$") == ["principals.a1", "principals.a2"]


# --- the operator's real tick --------------------------------------------------------------------


@pytest.mark.kube
def test_the_operator_tick_admits_a_tenant_end_to_end(
    kube_api: Any,
    gateway: GatewayDouble,  # noqa: F811
    tmp_path: Any,
    settings: Any,
    catalog_store: Any,
    make_warehouse: Any,
    trino_settings_reset: None,
) -> None:
    """Real ticks: an instance reaches SERVING through validation (no barrier is ever in its
    way), then a tenant is published, admitted through one barrier and the org's gate opens;
    the receipt probe reads the pool's real observer Secret."""
    from tests.trino.operator_harness import make_world

    world = make_world(
        kube_api, gateway, tmp_path, settings, tenant_admission=True, catalog_store=catalog_store
    )
    try:
        world.tick(2)
        (instance,) = world.rows()
        world.make_ready(instance.instance_id)
        for _ in range(40):
            if world.row(instance.instance_id).phase == InstancePhase.SERVING:
                break
            world.tick()
        assert world.row(instance.instance_id).phase == InstancePhase.SERVING

        pool_cell = world.cell()
        warehouse = make_warehouse(org_id="org-e2e", database_name="e2e_wh")
        name = catalog_name("e2e_wh")
        WarehouseTrino.objects.create(
            warehouse=warehouse, enabled=True, trino_cell_id=pool_cell.stored_id, catalog_name=name
        )
        definition = {"catalog": name, "org_id": "org-e2e"}
        catalog_writer.client_for(pool_cell.stored_id).create(
            name, definition, payload_hash(definition)
        )
        for _ in range(8):
            world.tick()
            rows = admission.load_rows(pool_cell.stored_id)
            if rows["org-e2e"].state == PublicationState.ADMITTED:
                break
        row = admission.load_rows(pool_cell.stored_id)["org-e2e"]
        assert row.state == PublicationState.ADMITTED, row.last_error
        assert reconcile._gate("org-e2e", pool_cell) == ("ready", "")
        tenant = gateway.tenant(pool_cell.routing_group, "org-e2e")
        assert tenant is not None
        assert tenant["admittedTargetRevision"] == row.admitted_target_revision
        assert world.row(instance.instance_id).phase == InstancePhase.SERVING
    finally:
        world.operator.end_all_terms("test teardown")
        world.close()
