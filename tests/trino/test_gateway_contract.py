"""The client and the test Gateway pinned to spec §4.16 (safeguards trino-45, trino-26, trino-27).

Every §4.16 request is transcribed below as a dict (placeholders replaced by concrete values),
sent through ``GatewayClient`` to the double, compared key by key with what the double received,
and the answer compared with the §4.16 response and parsed with the client's parsers. The
examples' refusals are provoked for real and must come back as typed ``GatewayRefused``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from duckgres_admin.lib import gateway as gw
from duckgres_admin.lib.gateway import GatewayClient, GatewayRefused
from tests.trino.gateway_double import (  # noqa: F401
    GatewayDouble,
    binding_revision,
    gateway,
    publication_id,
    publication_payload_hash,
)

RG = "rg-a"
POOL = "pool-a"
INSTANCE = "cell-1a2b3c4d"
EPOCH = 7
OWNER = "duckgres-admin-0.4be1c0a7f39d2e11"
TENANT = "org-42"
LOGIN = "acme_wh"
POD_UID = "5f0e6c1a-7b2d-4c1e-9f3a-2d4b6c8e0a11"
BOOT_ID = "0b7c4d2e9a1f4e3b8c5d6e7f8a9b0ce1"
NODE_ID = "trino-a-cell-1a2b3c4d-coordinator-7d9f"
COORDINATOR_ID = "k3x9q"
RELEASE = "rel-2026.08.1"
BACKEND = "rg-a-cell-1a2b3c4d"
PROXY = "http://cell-1a2b3c4d.trino-a.svc.cluster.local:8080"
CERT_HASH = "9c41" + "0" * 60
BINDING = binding_revision([LOGIN])
TARGET = f"b{BINDING}.a3"
PUB = publication_id(TENANT, TARGET)
PAYLOAD_HASH = publication_payload_hash(TENANT, TARGET, 118)
OTHERS = ("cell-5e6f7a8b", "cell-9c0d1e2f")
SURGE = "cell-0f1e2d3c"
OBSERVED_AT = "2026-08-01T12:00:00Z"

ENVELOPE = {"controllerEpoch": EPOCH, "ownerIdentity": OWNER}


def env(operation_id: str, step_id: str) -> dict[str, Any]:
    return {"operationId": operation_id, "stepId": step_id, **ENVELOPE}


# -- §4.16 requests, transcribed ---------------------------------------------------------------

CONFIGURE = {
    **env("pool-config:pool-a", "configure.e7.s1"),
    "apiMode": "POOLED",
    "minServing": 3,
    "desiredMembers": 3,
    "maxSurge": 1,
    "maxRepair": 1,
    "desiredRevision": RELEASE,
    "tenantAdmissionEnabled": True,
}
POOL_BODY = {
    "pool": "rg-a",
    "apiMode": "POOLED",
    "minServing": 3,
    "desiredMembers": 3,
    "maxSurge": 1,
    "maxRepair": 1,
    "desiredRevision": RELEASE,
    "tenantAdmissionEnabled": True,
    "membershipGeneration": 41,
}
BACKEND_RECORD = {"name": BACKEND, "proxyTo": PROXY, "active": False, "routingGroup": "rg-a"}
REGISTER = {
    **env(f"instance:{INSTANCE}", "register"),
    "memberId": INSTANCE,
    "backendName": BACKEND,
    "podUid": POD_UID,
    "bootId": BOOT_ID,
    "configRevision": RELEASE,
    "repairFor": "",
}
MEMBER = {
    "memberId": INSTANCE,
    "backendName": BACKEND,
    "state": "PREPARING",
    "eligible": False,
    "incarnation": 1,
    "generation": 1,
    "podUid": POD_UID,
    "bootId": BOOT_ID,
    "nodeId": NODE_ID,
    "coordinatorId": COORDINATOR_ID,
    "configRevision": RELEASE,
    "repairFor": "",
}
RECEIPT = {
    "certificateHash": CERT_HASH,
    "configRevision": RELEASE,
    "authRevision": "",
    "podUid": POD_UID,
    "bootId": BOOT_ID,
    "nodeId": NODE_ID,
    "coordinatorId": COORDINATOR_ID,
    "readyWorkers": 4,
    "checks": ["image", "workers", "catalog-revision", "operational-connection"],
}
ADMIT = {**env(f"instance:{INSTANCE}", "admit"), "expectedGeneration": 1, "receipt": RECEIPT}
DRAIN = env(f"instance:{INSTANCE}", "drain")
OBLIGATIONS = {
    "memberId": INSTANCE,
    "generation": 3,
    "pendingRequests": 0,
    "openTransactions": 1,
    "activeQueries": 2,
    "readyToSeal": False,
    "drained": False,
}
SEAL = {**env(f"instance:{INSTANCE}", "seal"), "expectedGeneration": 3}
RETIRE = {**env(f"instance:{INSTANCE}", "retire"), "expectedGeneration": 4}
RETIRED = {**env(f"instance:{INSTANCE}", "retired"), "resourcesAbsent": True}
EVIDENCE = {
    "podUid": POD_UID,
    "bootId": BOOT_ID,
    "nodeId": NODE_ID,
    "coordinatorId": COORDINATOR_ID,
    "observation": "coordinator container terminated: OOMKilled",
    "observedAt": OBSERVED_AT,
}
SUSPECT = {**env(f"instance:{INSTANCE}", "suspect"), "evidence": EVIDENCE}
LOST = {**env(f"instance:{INSTANCE}", "lost"), "evidence": EVIDENCE}
FAILURE_RECEIPT = {
    "memberId": INSTANCE,
    "state": "LOST",
    "kind": "FAILED",
    "generation": 7,
    "evidence": EVIDENCE,
    "recordedAt": "2026-08-01T12:01:00Z",
}
OPERATION: dict[str, Any] = {
    "operationId": f"instance:{INSTANCE}",
    "steps": [
        {
            "stepId": "register",
            "payloadHash": "3e1a" + "0" * 60,
            "outcome": "APPLIED",
            "result": MEMBER,
        },
        {
            "stepId": "admit",
            "payloadHash": "77c0" + "0" * 60,
            "outcome": "REFUSED",
            "code": "POOL_PUBLICATION_BARRIER",
        },
    ],
}
TENANT_BODY = {
    "tenant": TENANT,
    "bindingRevision": BINDING,
    "principals": [LOGIN],
    "state": "ADMITTED",
    "admittedTargetRevision": TARGET,
}
PRINCIPALS = {
    **env(f"tenant:{TENANT}", "principals.a3"),
    "bindingRevision": BINDING,
    "principals": [LOGIN],
}
REVOKE = {
    **env(f"tenant:{TENANT}", "revoke.a4"),
    "reason": "the warehouse is no longer served by this pool",
}
REVOKED = {"tenant": TENANT, "state": "REVOKED"}
OPEN = {
    **env(f"tenant:{TENANT}", f"open.{PUB}"),
    "publicationId": PUB,
    "tenant": TENANT,
    "targetRevision": TARGET,
    "catalogRevision": 118,
    "payloadHash": PAYLOAD_HASH,
}
PUBLICATION = {
    "publicationId": PUB,
    "tenant": TENANT,
    "targetRevision": TARGET,
    "catalogRevision": 118,
    "state": "OPEN",
    "membershipGeneration": 41,
    "requiredMembers": [INSTANCE, *OTHERS],
    "receipts": [],
}
RECEIPT_STEP = {
    **env(f"tenant:{TENANT}", f"receipt.{PUB}.{INSTANCE}"),
    "memberId": INSTANCE,
    "bootId": BOOT_ID,
    "appliedRevision": 118,
}
COMMIT = env(f"tenant:{TENANT}", f"commit.{PUB}")
ABANDON = {
    **env(f"tenant:{TENANT}", f"abandon.{PUB}"),
    "reason": "a candidate is waiting to join",
}
STALE = {"code": "POOL_STALE_EPOCH", "message": "controllerEpoch 6 < 7"}


# -- helpers -------------------------------------------------------------------------------------


def client_for(double: GatewayDouble) -> GatewayClient:
    return GatewayClient(double.url, double.token, allow_http=True)


def send(
    client: GatewayClient, double: GatewayDouble, method: str, path: str, body: dict[str, Any]
) -> Any:
    """Send through the client; assert the wire carried exactly the example request."""
    before = len(double.requests)
    try:
        return client.send(method, path, json.dumps(body))
    finally:
        got_method, got_path, headers, got_body = double.requests[before]
        assert (got_method, got_path) == (method, path)
        assert got_body == body
        assert sorted(got_body) == sorted(body)
        assert headers["authorization"] == f"Bearer {double.token}"
        assert headers["x-gateway-transaction-admin-token"] == double.token


def refused(code: str, fn: Any, *args: Any, **kwargs: Any) -> GatewayRefused:
    with pytest.raises(GatewayRefused) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, str(info.value)
    return info.value


def assert_like(actual: dict[str, Any], example: dict[str, Any], **overrides: Any) -> None:
    """Same keys as the example; every value equal except the named overrides."""
    assert sorted(actual) == sorted(example)
    expected = {**example, **overrides}
    for key, value in expected.items():
        if value is ...:
            continue
        assert actual[key] == value, key


def other_member(client, double, member_id: str, *, admit: bool = True) -> dict[str, Any]:
    backend = f"rg-a-{member_id}"
    client.send(
        "POST",
        GatewayClient.BACKEND_ADD,
        json.dumps({**BACKEND_RECORD, "name": backend, "proxyTo": f"http://{member_id}:8080"}),
    )
    boot = f"boot-{member_id}"
    member = gw.parse_member(
        client.send(
            "POST",
            GatewayClient.pool_path(RG, "members"),
            json.dumps(
                {
                    **env(f"instance:{member_id}", "register"),
                    "memberId": member_id,
                    "backendName": backend,
                    "podUid": f"pod-{member_id}",
                    "bootId": boot,
                    "configRevision": RELEASE,
                    "repairFor": "",
                }
            ),
        )
    )
    if admit:
        client.send(
            "POST",
            GatewayClient.pool_path(RG, "members", member_id, "admit"),
            json.dumps(
                {
                    **env(f"instance:{member_id}", "admit"),
                    "expectedGeneration": member.generation,
                    "receipt": {
                        **RECEIPT,
                        "podUid": member.pod_uid,
                        "bootId": member.boot_id,
                        "nodeId": member.node_id,
                        "coordinatorId": member.coordinator_id,
                    },
                }
            ),
        )
    current: dict[str, Any] = client.get(GatewayClient.pool_path(RG, "members", member_id))
    return current


# -- the examples ---------------------------------------------------------------------------------


@pytest.mark.safeguard("trino-45")
def test_every_example_response_parses_with_the_client():
    assert gw.parse_pool(POOL_BODY).membership_generation == 41
    assert gw.parse_backends([BACKEND_RECORD])[0].active is False
    assert gw.parse_backend(BACKEND_RECORD).routing_group == "rg-a"
    assert gw.parse_members({"membershipGeneration": 41, "members": [MEMBER]})[0] == 41
    member = gw.parse_member(MEMBER)
    assert (member.node_id, member.coordinator_id, member.boot_id) == (
        NODE_ID,
        COORDINATOR_ID,
        BOOT_ID,
    )
    retiring = gw.parse_member(
        {
            **MEMBER,
            "state": "RETIRING",
            "generation": 5,
            "retirementReceipt": {"kind": "DRAINED", "generation": 5, "claimedAt": OBSERVED_AT},
        }
    )
    assert retiring.retirement_receipt == {
        "kind": "DRAINED",
        "generation": 5,
        "claimedAt": OBSERVED_AT,
    }
    obligations = gw.parse_obligations(OBLIGATIONS)
    assert (obligations.open_transactions, obligations.active_queries) == (1, 2)
    assert not obligations.sealable
    assert gw.parse_failure_receipt(FAILURE_RECEIPT).kind == "FAILED"
    op = gw.parse_operation(OPERATION)
    assert [(s.step_id, s.outcome, s.code) for s in op.steps] == [
        ("register", "APPLIED", ""),
        ("admit", "REFUSED", "POOL_PUBLICATION_BARRIER"),
    ]
    assert gw.parse_member(op.steps[0].result) == member
    assert gw.parse_tenant(TENANT_BODY).admitted_target_revision == TARGET
    assert gw.parse_tenant(REVOKED).state == "REVOKED"
    pub = gw.parse_publication(PUBLICATION)
    assert pub.required_members == [INSTANCE, *OTHERS]
    assert pub.admitted_target_revision == ""
    admitted = gw.parse_publication(
        {**PUBLICATION, "state": "ADMITTED", "admittedTargetRevision": TARGET}
    )
    assert admitted.admitted_target_revision == TARGET
    with pytest.raises(gw.GatewayProtocolError):
        gw.parse_obligations({k: v for k, v in OBLIGATIONS.items() if k != "activeQueries"})


@pytest.mark.safeguard("trino-45")
def test_every_example_refusal_code_parses_as_typed_refusal(gateway):  # noqa: F811
    client = client_for(gateway)
    for code in sorted(gw.KNOWN_CODES):
        status = {"POOL_VALIDATION": 400, "POOL_NOT_FOUND": 404}.get(code, 409)
        gateway.fail_next("POST", r"/members$", refuse=code, status=status)
        error = refused(code, client.send, "POST", GatewayClient.pool_path(RG, "members"), "{}")
        assert error.status == status
        assert gateway.token not in str(error)
    gateway.fail_next("GET", r".", refuse="ROUTING_STATE_UNAVAILABLE", status=503)
    assert refused("ROUTING_STATE_UNAVAILABLE", client.get, "/gateway/backend/all").status == 503


@pytest.mark.safeguard("trino-45")
def test_every_example_request_through_the_client_to_the_double(gateway):  # noqa: F811
    client = client_for(gateway)
    gateway.set_identity(RG, INSTANCE, node_id=NODE_ID, coordinator_id=COORDINATOR_ID)
    gateway.set_process_id(RG, INSTANCE, BOOT_ID)
    base = GatewayClient.pool_path(RG)
    members = GatewayClient.pool_path(RG, "members")
    member = GatewayClient.pool_path(RG, "members", INSTANCE)
    assert base == "/gateway/v1/pools/rg-a"

    # Pool: configure echoes every setting; GET is the example body.
    configured = send(client, gateway, "PUT", base, CONFIGURE)
    assert_like(configured, POOL_BODY, membershipGeneration=...)
    gateway.set_membership_generation(RG, 38)

    # Backend registry.
    assert (
        send(client, gateway, "POST", GatewayClient.BACKEND_ADD, BACKEND_RECORD) == BACKEND_RECORD
    )
    assert client.get(GatewayClient.BACKEND_ALL) == [BACKEND_RECORD]
    assert gw.parse_backends(client.get(GatewayClient.BACKEND_ALL))[0].name == BACKEND

    # Register: 201 with the Gateway's recorded node and coordinator ids.
    assert send(client, gateway, "POST", members, REGISTER) == MEMBER
    assert client.get(member) == MEMBER
    listed = client.get(members)
    assert listed == {"membershipGeneration": 38, "members": [MEMBER]}

    # Admit (and two more serving members, as in the example's publication).
    admitted = send(client, gateway, "POST", f"{member}/admit", ADMIT)
    assert_like(admitted, MEMBER, state="ACTIVE", eligible=True, generation=2)
    for other in OTHERS:
        other_member(client, gateway, other)
    assert client.get(base) == POOL_BODY
    assert gw.parse_pool(client.get(base)) == gw.parse_pool(POOL_BODY)

    # Tenant principals, whole-set replace.
    tenant = send(
        client,
        gateway,
        "PUT",
        GatewayClient.pool_path(RG, "tenants", TENANT, "principals"),
        PRINCIPALS,
    )
    assert_like(tenant, TENANT_BODY, state="PENDING", admittedTargetRevision="")
    refused(
        "POOL_PRINCIPAL_CONFLICT",
        client.send,
        "PUT",
        GatewayClient.pool_path(RG, "tenants", "org-43", "principals"),
        json.dumps({**PRINCIPALS, "operationId": "tenant:org-43", "stepId": "principals.a1"}),
    )

    # Open the barrier: 201 <publication>.
    pubs = GatewayClient.pool_path(RG, "publications")
    pub_path = GatewayClient.pool_path(RG, "publications", PUB)
    assert send(client, gateway, "POST", pubs, OPEN) == PUBLICATION
    assert client.get(pub_path) == PUBLICATION

    # A candidate registered under the barrier is refused at admit; the journal shows both steps.
    surge = other_member(client, gateway, SURGE, admit=False)
    surge_admit = {
        **env(f"instance:{SURGE}", "admit"),
        "expectedGeneration": 1,
        "receipt": {
            **RECEIPT,
            "podUid": surge["podUid"],
            "bootId": surge["bootId"],
            "nodeId": surge["nodeId"],
            "coordinatorId": surge["coordinatorId"],
        },
    }
    surge_path = GatewayClient.pool_path(RG, "members", SURGE)
    refused(
        "POOL_PUBLICATION_BARRIER",
        client.send,
        "POST",
        f"{surge_path}/admit",
        json.dumps(surge_admit),
    )
    op_path = GatewayClient.pool_path(RG, "operations", f"instance:{SURGE}")
    assert op_path == "/gateway/v1/pools/rg-a/operations/instance%3Acell-0f1e2d3c"
    op = client.get(op_path)
    assert sorted(op) == sorted(OPERATION)
    assert [sorted(s) for s in op["steps"]] == [sorted(s) for s in OPERATION["steps"]]
    assert op["steps"][0]["result"] == surge
    assert [s["outcome"] for s in op["steps"]] == ["APPLIED", "REFUSED"]
    assert op["steps"][1]["code"] == "POOL_PUBLICATION_BARRIER"
    assert all(len(s["payloadHash"]) == 64 for s in op["steps"])
    gw.parse_operation(op)

    # Receipts, one member per call; then commit.
    with_receipt = send(client, gateway, "POST", f"{pub_path}/receipts", RECEIPT_STEP)
    assert with_receipt == {**PUBLICATION, "receipts": [INSTANCE]}
    refused("POOL_RECEIPTS_INCOMPLETE", send, client, gateway, "POST", f"{pub_path}/commit", COMMIT)
    for other in OTHERS:
        client.send(
            "POST",
            f"{pub_path}/receipts",
            json.dumps(
                {
                    **env(f"tenant:{TENANT}", f"receipt.{PUB}.{other}"),
                    "memberId": other,
                    "bootId": f"boot-{other}",
                    "appliedRevision": 118,
                }
            ),
        )
    committed = send(client, gateway, "POST", f"{pub_path}/commit", COMMIT)
    assert committed == {
        **PUBLICATION,
        "state": "ADMITTED",
        "admittedTargetRevision": TARGET,
        "receipts": sorted([INSTANCE, *OTHERS]),
    }
    tenant_path = GatewayClient.pool_path(RG, "tenants", TENANT)
    assert client.get(tenant_path) == TENANT_BODY

    # The surge candidate joins once the barrier is gone (a refused step is re-evaluated).
    assert client.send("POST", f"{surge_path}/admit", json.dumps(surge_admit))["state"] == "ACTIVE"

    # Drain → obligations → seal → retire → retired.
    drained = send(client, gateway, "POST", f"{member}/drain", DRAIN)
    assert_like(drained, MEMBER, state="DRAINING", eligible=False, generation=3)
    gateway.set_obligations(
        RG, INSTANCE, open_transactions=1, active_queries=2, ready_to_seal=False, drained=False
    )
    assert client.get(f"{member}/obligations") == OBLIGATIONS
    refused("POOL_NOT_DRAINED", send, client, gateway, "POST", f"{member}/seal", SEAL)
    gateway.set_obligations(RG, INSTANCE, open_transactions=0, active_queries=0, ready_to_seal=True)
    sealed = send(client, gateway, "POST", f"{member}/seal", SEAL)
    assert_like(sealed, MEMBER, state="SEALED", generation=4)
    retiring = send(client, gateway, "POST", f"{member}/retire", RETIRE)
    receipt = retiring.pop("retirementReceipt")
    assert_like(retiring, MEMBER, state="RETIRING", generation=5)
    assert sorted(receipt) == ["claimedAt", "generation", "kind"]
    assert (receipt["kind"], receipt["generation"]) == ("DRAINED", 5)
    for step in ("admit", "drain"):
        refused(
            "POOL_IRREVERSIBLE",
            client.send,
            "POST",
            f"{member}/{step}",
            json.dumps({**ADMIT, "stepId": f"{step}.again"}),
        )
    retired = send(client, gateway, "POST", f"{member}/retired", RETIRED)
    assert retired["state"] == "RETIRED"
    gw.parse_member(retired)

    # Serving floor: 3 active members left with minServing 3.
    other_path = GatewayClient.pool_path(RG, "members", OTHERS[0])
    refused(
        "POOL_SERVING_FLOOR",
        send,
        client,
        gateway,
        "POST",
        f"{other_path}/drain",
        env(f"instance:{OTHERS[0]}", "drain"),
    )

    # A second barrier: membership changes under it, then it is abandoned.
    target4 = f"b{BINDING}.a4"
    pub4 = publication_id(TENANT, target4)
    pub4_path = GatewayClient.pool_path(RG, "publications", pub4)
    client.send(
        "POST",
        pubs,
        json.dumps(
            {
                **OPEN,
                "stepId": f"open.{pub4}",
                "publicationId": pub4,
                "targetRevision": target4,
                "payloadHash": publication_payload_hash(TENANT, target4, 118),
            }
        ),
    )

    # Suspect / lost / failure receipt on a serving member (a loss ignores the floor).
    serving = gw.parse_member(client.get(other_path))
    evidence = {
        **EVIDENCE,
        "podUid": serving.pod_uid,
        "bootId": serving.boot_id,
        "nodeId": serving.node_id,
        "coordinatorId": serving.coordinator_id,
    }
    suspect_body = {**SUSPECT, "operationId": f"instance:{OTHERS[0]}", "evidence": evidence}
    refused(
        "POOL_EVIDENCE_REQUIRED",
        client.send,
        "POST",
        f"{other_path}/suspect",
        json.dumps({**suspect_body, "evidence": {**evidence, "nodeId": serving.coordinator_id}}),
    )
    suspected = send(client, gateway, "POST", f"{other_path}/suspect", suspect_body)
    assert (suspected["state"], suspected["eligible"]) == ("SUSPECT", False)
    lost_body = {**LOST, "operationId": f"instance:{OTHERS[0]}", "evidence": evidence}
    assert send(client, gateway, "POST", f"{other_path}/lost", lost_body)["state"] == "LOST"
    failure = client.get(f"{other_path}/failure-receipt")
    assert_like(
        failure,
        FAILURE_RECEIPT,
        memberId=OTHERS[0],
        generation=...,
        recordedAt=...,
        evidence=evidence,
    )
    gw.parse_failure_receipt(failure)

    refused(
        "POOL_MEMBERSHIP_CHANGED",
        client.send,
        "POST",
        f"{pub4_path}/receipts",
        json.dumps(
            {**RECEIPT_STEP, "stepId": f"receipt.{pub4}.{OTHERS[1]}", "memberId": OTHERS[1]}
        ),
    )
    refused(
        "POOL_MEMBERSHIP_CHANGED",
        client.send,
        "POST",
        f"{pub4_path}/commit",
        json.dumps({**COMMIT, "stepId": f"commit.{pub4}"}),
    )
    abandoned = send(
        client, gateway, "POST", f"{pub4_path}/abandon", {**ABANDON, "stepId": f"abandon.{pub4}"}
    )
    assert abandoned["state"] == "ABANDONED"
    refused("POOL_PHASE", send, client, gateway, "POST", f"{pub_path}/abandon", ABANDON)

    # Revoke, then the tenant GET 404 for an unknown tenant.
    assert send(client, gateway, "DELETE", tenant_path, REVOKE) == REVOKED
    assert client.get(tenant_path)["state"] == "REVOKED"
    refused("POOL_NOT_FOUND", client.get, GatewayClient.pool_path(RG, "tenants", "org-99"))

    # Backend delete, text/plain, empty 200 body.
    before = len(gateway.requests)
    assert (
        client.send("POST", GatewayClient.BACKEND_DELETE, BACKEND, content_type="text/plain")
        is None
    )
    _, _, headers, body = gateway.requests[before]
    assert body == BACKEND
    assert headers["content-type"].startswith("text/plain")
    assert gateway.backend(BACKEND) is None

    # Stale epoch: the example refusal body, keyed on the header.
    error = refused(
        "POOL_STALE_EPOCH",
        send,
        client,
        gateway,
        "POST",
        f"{other_path}/retired",
        {**RETIRED, "controllerEpoch": 6},
    )
    assert error.status == 409
    assert error.message.endswith(STALE["message"])


# -- protocol semantics of the double (what the operator's tests rely on) ------------------------


class Pool:
    """A configured pool on the double, driven through the client."""

    def __init__(self, double: GatewayDouble, *, epoch: int = EPOCH, owner: str = OWNER, **cfg):
        self.double = double
        self.client = client_for(double)
        self.epoch = epoch
        self.owner = owner
        self.config = {
            "apiMode": "POOLED",
            "minServing": 1,
            "desiredMembers": 2,
            "maxSurge": 1,
            "maxRepair": 1,
            "desiredRevision": RELEASE,
            "tenantAdmissionEnabled": True,
            **cfg,
        }
        self.seq = 0
        self.put(GatewayClient.pool_path(RG), "pool-config:pool-a", "configure.e7.s1", self.config)

    def env(self, op: str, step: str) -> dict[str, Any]:
        return {
            "operationId": op,
            "stepId": step,
            "controllerEpoch": self.epoch,
            "ownerIdentity": self.owner,
        }

    def put(self, path: str, op: str, step: str, body: dict[str, Any]) -> Any:
        return self.client.send("PUT", path, json.dumps({**self.env(op, step), **body}))

    def post(self, path: str, op: str, step: str, body: dict[str, Any] | None = None) -> Any:
        return self.client.send("POST", path, json.dumps({**self.env(op, step), **(body or {})}))

    def member_path(self, member_id: str, *rest: str) -> str:
        return GatewayClient.pool_path(RG, "members", member_id, *rest)

    def register(self, member_id: str, *, boot_id: str = "", repair_for: str = "") -> Any:
        backend = f"rg-a-{member_id}"
        if self.double.backend(backend) is None:
            self.client.send(
                "POST",
                GatewayClient.BACKEND_ADD,
                json.dumps({**BACKEND_RECORD, "name": backend, "proxyTo": f"http://{member_id}"}),
            )
        return self.post(
            GatewayClient.pool_path(RG, "members"),
            f"instance:{member_id}",
            "register",
            {
                "memberId": member_id,
                "backendName": backend,
                "podUid": f"pod-{member_id}",
                "bootId": boot_id or f"boot-{member_id}",
                "configRevision": RELEASE,
                "repairFor": repair_for,
            },
        )

    def admit_body(self, member_id: str, **receipt: Any) -> dict[str, Any]:
        m = self.double.member(RG, member_id)
        assert m is not None
        return {
            "expectedGeneration": m["generation"],
            "receipt": {
                **RECEIPT,
                "podUid": m["podUid"],
                "bootId": m["bootId"],
                "nodeId": m["nodeId"],
                "coordinatorId": m["coordinatorId"],
                **receipt,
            },
        }

    def admit(self, member_id: str) -> Any:
        return self.post(
            self.member_path(member_id, "admit"),
            f"instance:{member_id}",
            "admit",
            self.admit_body(member_id),
        )

    def evidence(self, member_id: str) -> dict[str, Any]:
        m = self.double.member(RG, member_id)
        assert m is not None
        return {
            "podUid": m["podUid"],
            "bootId": m["bootId"],
            "nodeId": m["nodeId"],
            "coordinatorId": m["coordinatorId"],
            "observation": "pod deleted",
            "observedAt": OBSERVED_AT,
        }


MUTATIONS = [
    ("PUT", GatewayClient.pool_path(RG)),
    ("POST", GatewayClient.pool_path(RG, "members")),
    *[
        ("POST", GatewayClient.pool_path(RG, "members", "cell-a", step))
        for step in ("admit", "drain", "seal", "suspect", "lost", "retire", "retired")
    ],
    ("POST", GatewayClient.pool_path(RG, "publications")),
    *[
        ("POST", GatewayClient.pool_path(RG, "publications", PUB, step))
        for step in ("receipts", "commit", "abandon")
    ],
    ("PUT", GatewayClient.pool_path(RG, "tenants", TENANT, "principals")),
    ("DELETE", GatewayClient.pool_path(RG, "tenants", TENANT)),
]


@pytest.mark.safeguard("trino-26")
def test_every_mutation_lacking_epoch_or_owner_is_refused(gateway):  # noqa: F811
    pool = Pool(gateway)
    pool.register("cell-a")
    before = (gateway.pool(RG), gateway.member(RG, "cell-a"), gateway.tenant(RG, TENANT))
    for method, path in MUTATIONS:
        for missing in ("controllerEpoch", "ownerIdentity"):
            body = {**pool.env("instance:cell-a", f"probe.{missing}"), **CONFIGURE, **ADMIT}
            body.update(operationId="instance:cell-a", stepId=f"probe.{missing}")
            del body[missing]
            error = refused("POOL_VALIDATION", pool.client.send, method, path, json.dumps(body))
            assert error.status == 400
            assert missing in error.message
    assert (gateway.pool(RG), gateway.member(RG, "cell-a"), gateway.tenant(RG, TENANT)) == before
    assert (
        gw.parse_operation(pool.client.get(GatewayClient.pool_path(RG, "operations", "x"))).steps
        == []
    )


@pytest.mark.safeguard("trino-26")
def test_a_full_member_lifecycle_through_the_client(gateway):  # noqa: F811
    pool = Pool(gateway)
    member = gw.parse_member(pool.register("cell-a"))
    assert (member.state, member.generation) == ("PREPARING", 1)
    assert member.node_id != member.coordinator_id
    pool.register("cell-b")
    assert gw.parse_member(pool.admit("cell-a")).eligible
    assert gateway.backend("rg-a-cell-a")["active"] is True
    pool.admit("cell-b")
    drained = gw.parse_member(
        pool.post(pool.member_path("cell-a", "drain"), "instance:cell-a", "drain")
    )
    assert (drained.state, drained.eligible, drained.generation) == ("DRAINING", False, 3)
    gateway.set_obligations(RG, "cell-a", active_queries=1)
    obligations = gw.parse_obligations(pool.client.get(pool.member_path("cell-a", "obligations")))
    assert not obligations.sealable
    gateway.set_obligations(RG, "cell-a", active_queries=0)
    obligations = gw.parse_obligations(pool.client.get(pool.member_path("cell-a", "obligations")))
    assert obligations.sealable
    seal = {"expectedGeneration": drained.generation}
    sealed = gw.parse_member(
        pool.post(pool.member_path("cell-a", "seal"), "instance:cell-a", "seal", seal)
    )
    assert sealed.state == "SEALED"
    retire = {"expectedGeneration": sealed.generation}
    retiring = gw.parse_member(
        pool.post(pool.member_path("cell-a", "retire"), "instance:cell-a", "retire", retire)
    )
    assert retiring.state == "RETIRING"
    assert retiring.retirement_receipt is not None
    retired = pool.post(
        pool.member_path("cell-a", "retired"),
        "instance:cell-a",
        "retired",
        {"resourcesAbsent": True},
    )
    assert gw.parse_member(retired).state == "RETIRED"
    pool.client.send("POST", GatewayClient.BACKEND_DELETE, "rg-a-cell-a", content_type="text/plain")
    assert gateway.backend("rg-a-cell-a") is None
    mutations = [r for r in gateway.requests if r[0] != "GET" and "/gateway/v1/" in r[1]]
    assert len(mutations) == 9
    for _, _, _, body in mutations:
        assert (body["controllerEpoch"], body["ownerIdentity"]) == (EPOCH, OWNER)


@pytest.mark.safeguard("trino-27")
def test_principals_are_routed_only_for_put_and_publication_works(gateway):  # noqa: F811
    pool = Pool(gateway)
    for member_id in ("cell-a", "cell-b"):
        pool.register(member_id)
        pool.admit(member_id)
    principals_path = GatewayClient.pool_path(RG, "tenants", TENANT, "principals")
    body = json.dumps(PRINCIPALS)
    for method in ("POST", "DELETE"):
        error = refused("", pool.client.send, method, principals_path, body)
        assert error.status == 405
    assert gateway.tenant(RG, TENANT) is None
    tenant = gw.parse_tenant(pool.client.send("PUT", principals_path, body))
    assert (tenant.state, tenant.principals) == ("PENDING", [LOGIN])
    pubs = GatewayClient.pool_path(RG, "publications")
    opened = gw.parse_publication(pool.client.send("POST", pubs, json.dumps(OPEN)))
    assert (opened.state, opened.required_members) == ("OPEN", ["cell-a", "cell-b"])
    pub_path = GatewayClient.pool_path(RG, "publications", PUB)
    for member_id in opened.required_members:
        pool.post(
            f"{pub_path}/receipts",
            f"tenant:{TENANT}",
            f"receipt.{PUB}.{member_id}",
            {"memberId": member_id, "bootId": f"boot-{member_id}", "appliedRevision": 118},
        )
    committed = gw.parse_publication(
        pool.client.send("POST", f"{pub_path}/commit", json.dumps(COMMIT))
    )
    assert (committed.state, committed.admitted_target_revision) == ("ADMITTED", TARGET)
    admitted = gw.parse_tenant(pool.client.get(GatewayClient.pool_path(RG, "tenants", TENANT)))
    assert (admitted.state, admitted.admitted_target_revision) == ("ADMITTED", TARGET)


def test_fence_refuses_older_epochs_and_other_owners_and_adopts_newer(gateway):  # noqa: F811
    pool = Pool(gateway)
    configure = GatewayClient.pool_path(RG)
    for epoch, owner in ((6, OWNER), (7, "duckgres-admin-1.ffff")):
        pool.epoch, pool.owner = epoch, owner
        error = refused(
            "POOL_STALE_EPOCH", pool.put, configure, "pool-config:pool-a", "c", pool.config
        )
        assert error.status == 409
    pool.epoch, pool.owner = 8, "duckgres-admin-1.ffff"
    pool.put(configure, "pool-config:pool-a", "configure.e8.s1", pool.config)
    assert (gateway.pool(RG)["epoch"], gateway.pool(RG)["owner"]) == (8, "duckgres-admin-1.ffff")
    pool.epoch, pool.owner = 7, OWNER
    message = refused("POOL_STALE_EPOCH", pool.register, "cell-a").message
    assert message.endswith("controllerEpoch 7 < 8")
    assert gateway.member(RG, "cell-a") is None


def test_same_step_same_intent_replays_and_another_intent_is_refused(gateway):  # noqa: F811
    pool = Pool(gateway)
    first = pool.register("cell-a")
    assert pool.register("cell-a") == first
    pool.epoch = 9  # a later term re-sends the same business body: still a replay
    assert pool.register("cell-a") == first
    refused("POOL_INTENT_CHANGED", pool.register, "cell-a", boot_id="another-boot")
    assert gateway.member(RG, "cell-a")["bootId"] == "boot-cell-a"
    refused(
        "POOL_IDENTITY_CONFLICT",
        pool.post,
        GatewayClient.pool_path(RG, "members"),
        "instance:cell-a",
        "register.again",
        {
            **{k: v for k, v in REGISTER.items() if k not in pool.env("", "")},
            "memberId": "cell-a",
            "backendName": "rg-a-cell-a",
        },
    )


def test_admit_after_a_lost_response_settles_with_a_reread_generation(gateway):  # noqa: F811
    pool = Pool(gateway)
    pool.register("cell-a")
    body = pool.admit_body("cell-a")
    gateway.fail_next("POST", r"/admit$", drop_response=True)
    with pytest.raises(gw.UnknownOutcome):
        pool.post(pool.member_path("cell-a", "admit"), "instance:cell-a", "admit", body)
    assert gateway.member(RG, "cell-a")["state"] == "ACTIVE"
    op = gw.parse_operation(
        pool.client.get(GatewayClient.pool_path(RG, "operations", "instance:cell-a"))
    )
    assert [(s.step_id, s.outcome) for s in op.steps] == [
        ("register", "APPLIED"),
        ("admit", "APPLIED"),
    ]
    retry = {**body, "expectedGeneration": 2}
    replay = gw.parse_member(
        pool.post(pool.member_path("cell-a", "admit"), "instance:cell-a", "admit", retry)
    )
    assert (replay.state, replay.generation) == ("ACTIVE", 2)
    assert gateway.member(RG, "cell-a")["generation"] == 2


def test_a_lost_registration_is_adopted_with_the_recorded_identity(gateway):  # noqa: F811
    pool = Pool(gateway)
    gateway.fail_next("POST", r"/members$", drop_response=True)
    with pytest.raises(gw.UnknownOutcome):
        pool.register("cell-a")
    member = gw.parse_member(pool.client.get(pool.member_path("cell-a")))
    assert member.node_id
    assert member.coordinator_id
    assert member.node_id != member.coordinator_id
    wrong = {**pool.evidence("cell-a"), "coordinatorId": member.node_id}
    refused(
        "POOL_EVIDENCE_REQUIRED",
        pool.post,
        pool.member_path("cell-a", "suspect"),
        "instance:cell-a",
        "suspect",
        {"evidence": wrong},
    )
    pool.post(
        pool.member_path("cell-a", "suspect"),
        "instance:cell-a",
        "suspect",
        {"evidence": pool.evidence("cell-a")},
    )
    lost = pool.post(
        pool.member_path("cell-a", "lost"),
        "instance:cell-a",
        "lost",
        {"evidence": pool.evidence("cell-a")},
    )
    assert lost["state"] == "LOST"


def test_boot_id_must_be_the_coordinator_process_id(gateway):  # noqa: F811
    pool = Pool(gateway)
    gateway.set_process_id(RG, "cell-a", "proc-1")
    refused("POOL_NOT_CERTIFIED", pool.register, "cell-a", boot_id="pod-cell-a")
    pool.register("cell-a", boot_id="proc-1")
    bad = pool.admit_body("cell-a", bootId="pod-cell-a")
    refused(
        "POOL_NOT_CERTIFIED",
        pool.post,
        pool.member_path("cell-a", "admit"),
        "instance:cell-a",
        "admit",
        bad,
    )
    assert pool.admit("cell-a")["state"] == "ACTIVE"


def test_seal_checks_the_member_generation_not_the_obligations(gateway):  # noqa: F811
    pool = Pool(gateway)
    for member_id in ("cell-a", "cell-b"):
        pool.register(member_id)
        pool.admit(member_id)
    drained = pool.post(pool.member_path("cell-a", "drain"), "instance:cell-a", "drain")
    gateway.set_obligations(RG, "cell-a", generation=99)
    assert pool.client.get(pool.member_path("cell-a", "obligations"))["generation"] == 99
    refused(
        "POOL_STALE_GENERATION",
        pool.post,
        pool.member_path("cell-a", "seal"),
        "instance:cell-a",
        "seal.x",
        {"expectedGeneration": 99},
    )
    sealed = pool.post(
        pool.member_path("cell-a", "seal"),
        "instance:cell-a",
        "seal",
        {"expectedGeneration": drained["generation"]},
    )
    assert sealed["state"] == "SEALED"


def test_surge_and_repair_budgets(gateway):  # noqa: F811
    pool = Pool(gateway, desiredMembers=1, minServing=1, maxSurge=1, maxRepair=1)
    pool.register("cell-a")
    pool.register("cell-b")
    refused("POOL_SURGE_BUDGET", pool.register, "cell-c")
    for step in ("suspect", "lost"):
        pool.post(
            pool.member_path("cell-a", step),
            "instance:cell-a",
            step,
            {"evidence": pool.evidence("cell-a")},
        )
    refused("POOL_SURGE_BUDGET", pool.register, "cell-c")
    assert pool.register("cell-c", repair_for="cell-a")["repairFor"] == "cell-a"
    refused("POOL_REPAIR_BUDGET", pool.register, "cell-d", repair_for="cell-a")


def test_backend_registry_rules(gateway):  # noqa: F811
    client = client_for(gateway)
    add = GatewayClient.BACKEND_ADD
    error = refused(
        "POOL_VALIDATION", client.send, "POST", add, json.dumps({**BACKEND_RECORD, "active": True})
    )
    assert error.status == 400
    assert client.send("POST", add, json.dumps(BACKEND_RECORD)) == BACKEND_RECORD
    assert client.send("POST", add, json.dumps(BACKEND_RECORD)) == BACKEND_RECORD
    refused(
        "POOL_IDENTITY_CONFLICT",
        client.send,
        "POST",
        add,
        json.dumps({**BACKEND_RECORD, "proxyTo": "http://elsewhere"}),
    )
    for _ in range(2):
        assert (
            client.send("POST", GatewayClient.BACKEND_DELETE, BACKEND, content_type="text/plain")
            is None
        )
    assert client.get(GatewayClient.BACKEND_ALL) == []


def test_requests_without_the_token_are_unauthorized(gateway):  # noqa: F811
    client = GatewayClient(gateway.url, "not-the-token-" + "x" * 20, allow_http=True)
    error = refused("", client.get, GatewayClient.BACKEND_ALL)
    assert error.status == 401
