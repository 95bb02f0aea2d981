"""Connection leases (spec §5.4) and the grant-path barrier (§1.5, safeguard 27)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.dataplane import leases
from duckgres_admin.models import AuditRecord, ConnectionLease, Warehouse
from duckgres_admin.platform.orglock import lock_org
from tests.fixtures.api import error
from tests.fixtures.leases import block, make_org, post, unblock
from tests.fixtures.rows import new_warehouse
from tests.fixtures.stores import TEST_SSLMODE


def _dt(value: Any) -> Any:
    assert value is not None
    return value


def test_grant_returns_the_binding_with_the_pooler(clients):
    make_org("pooled", pooler=True)
    response = post(clients, "pooled", ttl_seconds=120)
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "granted"
    assert body["expires_at"].endswith("Z")
    assert body["binding"] == {
        "kind": "cnpg",
        "host": "pool.example",
        "port": 6432,
        "sslmode": TEST_SSLMODE,  # the store's (verify-full unless the test CA is missing)
        "database": "pooled_db",
        "user": "pooled_user",
        "password_secret_ref": "env:TENANT_PW",
    }
    lease = ConnectionLease.objects.get(pk=body["lease_id"])
    assert lease.state == "granted"
    assert 119 <= (_dt(lease.expires_at) - _dt(lease.granted_at)).total_seconds() <= 121
    # Lease traffic is the data plane's, not an operator mutation: not audited.
    assert AuditRecord.objects.count() == 0


@pytest.mark.safeguard("reshard-37")
def test_external_binding_keeps_its_port(clients):
    new_warehouse(
        org_id="ext-lease",
        metadata_store_kind="external",
        metadata_store_host="rds.example",
        metadata_store_port=6543,
        metadata_store_sslmode="verify-full",
        metadata_store_database="cat",
        metadata_store_user="u",
        metadata_store_password_ref="env:P",
    )
    binding = post(clients, "ext-lease").json()["binding"]
    assert (binding["host"], binding["port"], binding["sslmode"]) == (
        "rds.example",
        6543,
        "verify-full",
    )


@pytest.mark.safeguard("reshard-68")
def test_an_external_binding_without_an_sslmode_is_handed_out_as_verify_full(clients):
    """Empty means the default, verify-full: never silently "require" (no server check)."""
    new_warehouse(
        org_id="ext-default-tls",
        metadata_store_kind="external",
        metadata_store_host="rds.example",
        metadata_store_port=5432,
        metadata_store_sslmode="",
        metadata_store_database="cat",
        metadata_store_user="u",
        metadata_store_password_ref="env:P",
    )
    binding = post(clients, "ext-default-tls").json()["binding"]
    assert binding["sslmode"] == "verify-full"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"holder": ""}, "invalid body: holder: must not be empty"),
        ({"holder": "h" * 201}, "invalid body: holder: must be at most 200 characters"),
        ({"purpose": "fun"}, "invalid body: purpose: must be one of"),
        ({"ttl_seconds": 14}, "invalid body: ttl_seconds: must be >= 15"),
        ({"ttl_seconds": 601}, "invalid body: ttl_seconds: must be <= 600"),
        ({"wait_seconds": 61}, "invalid body: wait_seconds: must be <= 60"),
        ({"wait_seconds": -1}, "invalid body: wait_seconds: must be >= 0"),
        ({"password": "x"}, "invalid body: password: unknown field"),
    ],
)
def test_invalid_body_is_400_and_inserts_nothing(clients, body, message):
    make_org("bodies")
    response = post(clients, "bodies", **body)
    assert response.status_code == 400
    assert error(response).startswith(message)
    assert ConnectionLease.objects.count() == 0


def test_unknown_org_is_404(clients):
    response = post(clients, "nobody")
    assert response.status_code == 404
    assert error(response) == "org has no managed warehouse"
    assert ConnectionLease.objects.count() == 0


def test_resharding_is_503_with_retry_after(clients):
    make_org("blocked", state="resharding")
    response = post(clients, "blocked")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json() == {
        "code": "warehouse_resharding",
        "error": "metadata-store reshard in progress for this organization; retry shortly",
    }
    assert ConnectionLease.objects.get().state == "refused"


def test_not_ready_is_409(clients):
    make_org("provisioning", state="provisioning")
    response = post(clients, "provisioning")
    assert response.status_code == 409
    assert response.json()["code"] == "warehouse_not_ready"
    assert ConnectionLease.objects.get().state == "refused"


def test_cap_queue_and_regrant(clients):
    make_org("capped", cap=1)
    first = post(clients, "capped").json()
    assert first["state"] == "granted"
    response = post(clients, "capped")
    assert response.status_code == 429
    assert response.json()["code"] == "lease_cap_reached"
    response = post(clients, "capped", wait_seconds=30)
    assert response.status_code == 202
    queued = response.json()
    assert queued["state"] == "queued"
    assert queued["queue_deadline"].endswith("Z")
    path = f"/api/v1/warehouses/capped/leases/{queued['lease_id']}"
    assert clients.dataplane.get(path).status_code == 202
    # Releasing the first lease lets the queued request through on its next GET.
    assert (
        clients.dataplane.delete(
            f"/api/v1/warehouses/capped/leases/{first['lease_id']}"
        ).status_code
        == 204
    )
    response = clients.dataplane.get(path)
    assert response.status_code == 201
    assert response.json()["binding"]["database"] == "capped_db"
    assert clients.dataplane.get(path).status_code == 200


def test_queued_past_its_deadline_expires(clients):
    make_org("late", cap=0)
    queued = post(clients, "late", wait_seconds=10).json()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_connection_leases SET requested_at = now() - interval '20 seconds',"
            " queue_deadline = now() - interval '10 seconds' WHERE id = %s",
            [queued["lease_id"]],
        )
    response = clients.dataplane.get(f"/api/v1/warehouses/late/leases/{queued['lease_id']}")
    assert response.status_code == 410
    assert ConnectionLease.objects.get(pk=queued["lease_id"]).state == "expired"


def test_renew_release_and_expiry(clients):
    make_org("renew")
    lease_id = post(clients, "renew", ttl_seconds=15).json()["lease_id"]
    base = f"/api/v1/warehouses/renew/leases/{lease_id}"
    response = clients.dataplane.post(f"{base}/renew", {"ttl_seconds": 600}, format="json")
    assert response.status_code == 200
    lease = ConnectionLease.objects.get(pk=lease_id)
    assert (_dt(lease.expires_at) - _dt(lease.granted_at)).total_seconds() >= 590
    # Renewal is allowed while resharding: the drain waits for release.
    assert block("renew") == 1
    assert clients.dataplane.post(f"{base}/renew", {}, format="json").status_code == 200
    # Expired (aged with the database clock) → GET and renew are 410.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE duckgres_connection_leases SET expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            [lease_id],
        )
    assert clients.dataplane.post(f"{base}/renew", {}, format="json").status_code == 410
    assert clients.dataplane.get(base).status_code == 410
    assert ConnectionLease.objects.get(pk=lease_id).state == "expired"
    # DELETE is idempotent; unknown ids are 404.
    assert clients.dataplane.delete(base).status_code == 204
    assert clients.dataplane.delete(base).status_code == 204
    assert clients.dataplane.delete("/api/v1/warehouses/renew/leases/999999").status_code == 404


def test_release_marks_released(clients):
    make_org("release")
    lease_id = post(clients, "release").json()["lease_id"]
    base = f"/api/v1/warehouses/release/leases/{lease_id}"
    assert clients.dataplane.delete(base).status_code == 204
    lease = ConnectionLease.objects.get(pk=lease_id)
    assert lease.state == "released"
    assert lease.released_at is not None
    assert clients.dataplane.delete(base).status_code == 204
    assert clients.dataplane.get(base).status_code == 410
    assert clients.dataplane.post(f"{base}/renew", {}, format="json").status_code == 410


@pytest.mark.safeguard("reshard-27")
def test_threads_racing_grants_never_grant_after_the_block_commits(transactional_db):
    make_org("race")
    make_org("bystander")
    stop = threading.Event()
    outcomes: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def hammer(org: str) -> None:
        try:
            while not stop.is_set():
                request = leases.LeaseRequest(
                    holder=threading.current_thread().name, purpose="query"
                )
                try:
                    status = leases.lease_request(org_id=org, request=request).status
                except ServiceError as exc:
                    status = exc.status
                with lock:
                    outcomes.append(status)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hammer, args=("race",), name=f"t{i}") for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with transaction.atomic():
        lock_org("race")
        assert (
            Warehouse.objects.filter(org_id="race", state="ready").update(state="resharding") == 1
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            blocked_at = cursor.fetchone()[0]
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert 201 in outcomes
    assert 503 in outcomes
    assert set(outcomes) <= {201, 503}
    granted = ConnectionLease.objects.filter(org_id="race", state="granted")
    assert granted.exists()
    assert not granted.filter(granted_at__gte=blocked_at).exists()
    assert ConnectionLease.objects.filter(org_id="race", state="queued").count() == 0
    # A second block is a state mismatch.
    assert block("race") == 0
    # The drain sees the leases granted before the block.
    assert ConnectionLease.objects.filter(org_id="race", state="granted").count() == granted.count()
    # Other orgs are unaffected; grants resume after unblocking.
    request = leases.LeaseRequest(holder="h", purpose="query")
    assert leases.lease_request(org_id="bystander", request=request).status == 201
    with pytest.raises(ServiceError) as refused:
        leases.lease_request(org_id="race", request=request)
    assert refused.value.status == 503
    assert unblock("race") == 1
    assert leases.lease_request(org_id="race", request=request).status == 201


@pytest.mark.safeguard("reshard-27")
def test_block_leaves_granted_and_queued_visible_to_the_drain(clients):
    make_org("drain", cap=1)
    granted = post(clients, "drain").json()
    queued = post(clients, "drain", wait_seconds=60).json()
    assert queued["state"] == "queued"
    assert block("drain") == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE state = 'granted' AND expires_at > now()),"
            " count(*) FILTER (WHERE state = 'queued' AND queue_deadline > now())"
            " FROM duckgres_connection_leases WHERE org_id = 'drain'"
        )
        assert cursor.fetchone() == (1, 1)
    # The queued request's next poll is refused by the barrier, and the holder can still renew.
    response = clients.dataplane.get(f"/api/v1/warehouses/drain/leases/{queued['lease_id']}")
    assert response.status_code == 503
    assert ConnectionLease.objects.get(pk=queued["lease_id"]).state == "refused"
    base = f"/api/v1/warehouses/drain/leases/{granted['lease_id']}"
    assert clients.dataplane.post(f"{base}/renew", {}, format="json").status_code == 200
    assert clients.dataplane.delete(base).status_code == 204
