"""A protocol-faithful test Gateway (docs/gateway-protocol.md; spec trino-pools §4.8, §4.16).

A real threaded HTTP server on 127.0.0.1 that implements the pooled-member protocol v1: pools by
routing group (created by their first configure), members and their state machine, obligations,
the backend registry, tenants, publications, the per-operation step journal (read-back), the
epoch/owner fence and idempotency by business-body hash. It also offers fault injection and state
readers for tests. The fixture ``gateway`` yields a started double and stops it.

    from tests.trino.gateway_double import gateway  # noqa: F401
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

import pytest

ENVELOPE = ("operationId", "stepId", "controllerEpoch", "ownerIdentity")
REQUIRED_CHECKS = ("image", "workers", "catalog-revision", "operational-connection")
STATUS = {
    "POOL_VALIDATION": 400,
    "POOL_NOT_FOUND": 404,
    "TENANT_IDENTITY_UNVERIFIED": 403,
    "ROUTING_STATE_UNAVAILABLE": 503,
}
MAX_BODY = 1024 * 1024
_SEG = r"([^/]+)"


def canonical(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def intent_hash(body: dict[str, Any]) -> str:
    """SHA-256 of the body minus the envelope and ``expectedGeneration`` (docs §5)."""
    business = {k: v for k, v in body.items() if k not in ENVELOPE and k != "expectedGeneration"}
    return hashlib.sha256(canonical(business).encode("utf-8")).hexdigest()


def binding_revision(principals: list[str]) -> str:
    return hashlib.sha256("".join(p + "\0" for p in principals).encode("utf-8")).hexdigest()[:32]


def publication_id(tenant: str, target_revision: str) -> str:
    digest = hashlib.sha256(f"{tenant}\0{target_revision}".encode()).hexdigest()
    return "pub." + digest[:24]


def publication_payload_hash(tenant: str, target_revision: str, catalog_revision: int) -> str:
    return hashlib.sha256(f"{tenant}\0{target_revision}\0{catalog_revision}".encode()).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Recorded(NamedTuple):
    """One request as the double received it (unpacks as (method, path, headers, body))."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class Refusal(Exception):
    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, 409)


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    drop_response: bool = False
    refuse: str | None = None
    status: int = 409
    unavailable: bool = False
    delay: float = 0.0


@dataclass
class JournalStep:
    step_id: str
    payload_hash: str
    outcome: str  # APPLIED | REFUSED
    code: str = ""
    status: int = 200
    result: Any = None


@dataclass
class Pool:
    name: str
    config: dict[str, Any]
    epoch: int
    owner: str
    membership_generation: int = 1
    members: dict[str, dict[str, Any]] = field(default_factory=dict)
    failure_receipts: dict[str, dict[str, Any]] = field(default_factory=dict)
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)
    publications: dict[str, dict[str, Any]] = field(default_factory=dict)
    journal: dict[str, dict[str, JournalStep]] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "pool": self.name,
            **self.config,
            "membershipGeneration": self.membership_generation,
        }

    def active_eligible(self) -> list[str]:
        return sorted(
            m for m, rec in self.members.items() if rec["state"] == "ACTIVE" and rec["eligible"]
        )


class GatewayDouble:
    """See the module docstring and docs/gateway-protocol.md §9."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or "gw-" + secrets.token_hex(24)
        self.requests: list[Recorded] = []
        self._lock = threading.RLock()
        self._pools: dict[str, Pool] = {}
        self._backends: dict[str, dict[str, Any]] = {}
        self._obligations: dict[tuple[str, str], dict[str, Any]] = {}
        self._process_ids: dict[tuple[str, str], str] = {}
        self._identities: dict[tuple[str, str], tuple[str, str]] = {}
        self._faults: list[Fault] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, tls: ssl.SSLContext | None = None) -> GatewayDouble:
        """Serve on 127.0.0.1:<ephemeral>; with ``tls`` (a server context) over HTTPS."""
        double = self

        class Handler(_Handler):
            gateway = double

        class Server(ThreadingHTTPServer):
            def get_request(self) -> tuple[Any, Any]:
                conn, addr = super().get_request()
                if tls is not None:  # handshake in the handler thread, not the accept loop
                    conn = tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                return conn, addr

        self._tls = tls is not None
        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if getattr(self, "_tls", False) else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    # -- test conveniences ---------------------------------------------------------------------

    def set_obligations(self, rg: str, member_id: str, **fields: Any) -> None:
        names = {
            "pending_requests": "pendingRequests",
            "open_transactions": "openTransactions",
            "active_queries": "activeQueries",
            "ready_to_seal": "readyToSeal",
            "drained": "drained",
            "generation": "generation",
        }
        with self._lock:
            current = self._obligations.setdefault((rg, member_id), {})
            for key, value in fields.items():
                current[names[key]] = value

    def set_process_id(self, rg: str, member_id: str, process_id: str) -> None:
        with self._lock:
            self._process_ids[(rg, member_id)] = process_id

    def set_identity(self, rg: str, member_id: str, *, node_id: str, coordinator_id: str) -> None:
        with self._lock:
            self._identities[(rg, member_id)] = (node_id, coordinator_id)

    def set_membership_generation(self, rg: str, value: int) -> None:
        with self._lock:
            self._pools[rg].membership_generation = value

    def fail_next(
        self,
        method: str,
        path_regex: str,
        *,
        drop_response: bool = False,
        refuse: str | None = None,
        status: int = 409,
        unavailable: bool = False,
        delay: float = 0.0,
    ) -> None:
        with self._lock:
            self._faults.append(
                Fault(
                    method.upper(),
                    re.compile(path_regex),
                    drop_response,
                    refuse,
                    status,
                    unavailable,
                    delay,
                )
            )

    def pool(self, rg: str) -> dict[str, Any] | None:
        with self._lock:
            p = self._pools.get(rg)
            return None if p is None else {**p.body(), "epoch": p.epoch, "owner": p.owner}

    def member(self, rg: str, member_id: str) -> dict[str, Any] | None:
        with self._lock:
            p = self._pools.get(rg)
            rec = None if p is None else p.members.get(member_id)
            return copy.deepcopy(rec)

    def tenant(self, rg: str, tenant: str) -> dict[str, Any] | None:
        with self._lock:
            p = self._pools.get(rg)
            rec = None if p is None else p.tenants.get(tenant)
            return copy.deepcopy(rec)

    def publication(self, rg: str, pub: str) -> dict[str, Any] | None:
        with self._lock:
            p = self._pools.get(rg)
            rec = None if p is None else p.publications.get(pub)
            return copy.deepcopy(rec)

    def backend(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self._backends.get(name))

    def requests_to(
        self, method: str, path_regex: str
    ) -> list[tuple[str, str, dict[str, str], Any]]:
        rx = re.compile(path_regex)
        return [r for r in list(self.requests) if r[0] == method and rx.search(r[1])]

    # -- dispatch ------------------------------------------------------------------------------

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method in (method, "*") and fault.path.search(path):
                    self._faults.remove(fault)
                    return fault
        return None

    def record(self, method: str, raw_path: str, headers: dict[str, str], raw: bytes) -> Any:
        """Parse the body (JSON, or text for text/plain) and append the request to the log."""
        parsed: Any = None
        if raw:
            if headers.get("content-type", "").startswith("text/plain"):
                parsed = raw.decode("utf-8", "replace")
            else:
                try:
                    parsed = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    parsed = raw.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(Recorded(method, raw_path.split("?", 1)[0], dict(headers), parsed))
        return parsed

    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], parsed: Any
    ) -> tuple[int, Any, str]:
        """(status, JSON body or None, error code) of one recorded request."""
        path = raw_path.split("?", 1)[0]
        authz = headers.get("authorization", "")
        admin = headers.get("x-gateway-transaction-admin-token", "")
        if authz != f"Bearer {self.token}" or admin != self.token:
            return 401, {"message": "unauthorized"}, ""
        route = self._route(method, path)
        if route is None:
            return 404, {"message": "no route"}, ""
        if isinstance(route, int):
            return route, {"message": "method not allowed"}, ""
        handler, args = route
        try:
            with self._lock:
                status, body = handler(self, *args, body=parsed)
        except Refusal as refusal:
            return refusal.status, {"code": refusal.code, "message": refusal.message}, refusal.code
        except Exception as exc:  # a bug in the double: visible as a 500, never a hang
            return 500, {"message": f"gateway double error: {type(exc).__name__}: {exc}"}, ""
        return status, body, ""

    def _route(self, method: str, path: str) -> tuple[Any, list[str]] | int | None:
        for pattern, methods in _ROUTES:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            if method not in methods:
                return 405
            return methods[method], [urllib.parse.unquote(g) for g in m.groups()]
        return None

    # -- envelope, fence, journal -----------------------------------------------------------------

    def _mutation(
        self, rg: str, body: Any, apply: Any, *, create_pool: bool = False
    ) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise Refusal("POOL_VALIDATION", "the request body must be a JSON object")
        for key in ("operationId", "stepId", "ownerIdentity"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise Refusal("POOL_VALIDATION", f"{key} is required")
        epoch = body.get("controllerEpoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise Refusal("POOL_VALIDATION", "controllerEpoch is required (integer >= 1)")
        pool = self._pools.get(rg)
        if pool is None and not create_pool:
            raise Refusal("POOL_NOT_FOUND", f"pool {rg} is not configured")
        if pool is not None:
            if epoch < pool.epoch:
                raise Refusal("POOL_STALE_EPOCH", f"controllerEpoch {epoch} < {pool.epoch}")
            if epoch == pool.epoch and body["ownerIdentity"] != pool.owner:
                raise Refusal(
                    "POOL_STALE_EPOCH", f"controllerEpoch {epoch} is held by another owner"
                )
            pool.epoch, pool.owner = epoch, body["ownerIdentity"]
            steps = pool.journal.get(body["operationId"], {})
            known = steps.get(body["stepId"])
            digest = intent_hash(body)
            if known is not None and known.outcome == "APPLIED":
                if known.payload_hash == digest:
                    return known.status, copy.deepcopy(known.result)
                raise Refusal(
                    "POOL_INTENT_CHANGED",
                    f"{body['operationId']}/{body['stepId']} was applied with another body",
                )
        try:
            status, result = apply(pool, body, epoch)
        except Refusal as refusal:
            if pool is not None:
                self._journal(pool, body, "REFUSED", refusal.status, None, refusal.code)
            raise
        pool = self._pools[rg]
        self._journal(pool, body, "APPLIED", status, result, "")
        return status, copy.deepcopy(result)

    @staticmethod
    def _journal(
        pool: Pool, body: dict[str, Any], outcome: str, status: int, result: Any, code: str
    ) -> None:
        steps = pool.journal.setdefault(body["operationId"], {})
        steps[body["stepId"]] = JournalStep(
            body["stepId"], intent_hash(body), outcome, code, status, copy.deepcopy(result)
        )

    def _pool(self, rg: str) -> Pool:
        pool = self._pools.get(rg)
        if pool is None:
            raise Refusal("POOL_NOT_FOUND", f"pool {rg} is not configured")
        return pool

    def _member(self, pool: Pool, member_id: str) -> dict[str, Any]:
        rec = pool.members.get(member_id)
        if rec is None:
            raise Refusal("POOL_NOT_FOUND", f"member {member_id} is not registered")
        return rec

    # -- pool ------------------------------------------------------------------------------------

    def get_pool(self, rg: str, **_: Any) -> tuple[int, Any]:
        return 200, self._pool(rg).body()

    def put_pool(self, rg: str, *, body: Any, **_: Any) -> tuple[int, Any]:
        def apply(pool: Pool | None, b: dict[str, Any], epoch: int) -> tuple[int, Any]:
            if b.get("apiMode") != "POOLED":
                raise Refusal("POOL_APIMODE", f"apiMode must be POOLED, not {b.get('apiMode')!r}")
            ints = {}
            for key in ("minServing", "desiredMembers", "maxSurge", "maxRepair"):
                v = b.get(key)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise Refusal("POOL_VALIDATION", f"{key} must be a non-negative integer")
                ints[key] = v
            if ints["desiredMembers"] < 1 or not 1 <= ints["minServing"] <= ints["desiredMembers"]:
                raise Refusal("POOL_VALIDATION", "need 1 <= minServing <= desiredMembers")
            if not isinstance(b.get("desiredRevision"), str) or not b["desiredRevision"]:
                raise Refusal("POOL_VALIDATION", "desiredRevision is required")
            if not isinstance(b.get("tenantAdmissionEnabled"), bool):
                raise Refusal("POOL_VALIDATION", "tenantAdmissionEnabled must be a boolean")
            config = {
                "apiMode": "POOLED",
                "minServing": ints["minServing"],
                "desiredMembers": ints["desiredMembers"],
                "maxSurge": ints["maxSurge"],
                "maxRepair": ints["maxRepair"],
                "desiredRevision": b["desiredRevision"],
                "tenantAdmissionEnabled": b["tenantAdmissionEnabled"],
            }
            if pool is None:
                pool = Pool(rg, config, epoch, b["ownerIdentity"])
                self._pools[rg] = pool
            else:
                pool.config = config
            return 200, pool.body()

        return self._mutation(rg, body, apply, create_pool=True)

    # -- members ---------------------------------------------------------------------------------

    def list_members(self, rg: str, **_: Any) -> tuple[int, Any]:
        pool = self._pool(rg)
        members = [copy.deepcopy(pool.members[m]) for m in sorted(pool.members)]
        return 200, {"membershipGeneration": pool.membership_generation, "members": members}

    def get_member(self, rg: str, member_id: str, **_: Any) -> tuple[int, Any]:
        return 200, self._member(self._pool(rg), member_id)

    def register(self, rg: str, *, body: Any, **_: Any) -> tuple[int, Any]:
        def apply(pool: Pool, b: dict[str, Any], _epoch: int) -> tuple[int, Any]:
            fields = {}
            for key in ("memberId", "backendName", "podUid", "bootId", "configRevision"):
                if not isinstance(b.get(key), str) or not b[key]:
                    raise Refusal("POOL_VALIDATION", f"{key} is required")
                fields[key] = b[key]
            repair_for = b.get("repairFor")
            if not isinstance(repair_for, str):
                raise Refusal("POOL_VALIDATION", 'repairFor is required ("" when not a repair)')
            member_id = fields["memberId"]
            if member_id in pool.members:
                raise Refusal("POOL_IDENTITY_CONFLICT", f"member {member_id} is already registered")
            backend = self._backends.get(fields["backendName"])
            if backend is None or backend["routingGroup"] != rg:
                raise Refusal(
                    "POOL_VALIDATION",
                    f"backend {fields['backendName']} is not registered for routing group {rg}",
                )
            if backend["active"]:
                raise Refusal("POOL_VALIDATION", f"backend {fields['backendName']} is active")
            expected = self._process_ids.get((rg, member_id))
            if expected is not None and fields["bootId"] != expected:
                raise Refusal("POOL_NOT_CERTIFIED", "bootId is not the coordinator's processId")
            live = [m for m in pool.members.values() if m["state"] != "RETIRED"]
            if repair_for:
                target = pool.members.get(repair_for)
                if target is None or target["state"] not in ("SUSPECT", "LOST"):
                    raise Refusal("POOL_VALIDATION", f"repairFor {repair_for} is not SUSPECT/LOST")
                if sum(1 for m in live if m["repairFor"]) >= pool.config["maxRepair"]:
                    raise Refusal("POOL_REPAIR_BUDGET", "the repair budget is exhausted")
            elif len(live) >= pool.config["desiredMembers"] + pool.config["maxSurge"]:
                raise Refusal("POOL_SURGE_BUDGET", "desiredMembers + maxSurge members exist")
            node_id, coordinator_id = self._identities.get(
                (rg, member_id), _default_identity(member_id, fields["backendName"])
            )
            record = {
                "memberId": member_id,
                "backendName": fields["backendName"],
                "state": "PREPARING",
                "eligible": False,
                "incarnation": 1,
                "generation": 1,
                "podUid": fields["podUid"],
                "bootId": fields["bootId"],
                "nodeId": node_id,
                "coordinatorId": coordinator_id,
                "configRevision": fields["configRevision"],
                "repairFor": repair_for,
            }
            pool.members[member_id] = record
            return 201, record

        return self._mutation(rg, body, apply)

    def _transition(
        self, pool: Pool, rec: dict[str, Any], state: str, *, eligible: bool = False
    ) -> None:
        was_eligible = rec["eligible"]
        rec["state"] = state
        rec["eligible"] = eligible
        rec["generation"] += 1
        backend = self._backends.get(rec["backendName"])
        if backend is not None:
            backend["active"] = eligible
        if was_eligible != eligible:
            pool.membership_generation += 1

    @staticmethod
    def _expect_state(rec: dict[str, Any], allowed: tuple[str, ...], action: str) -> None:
        if rec["state"] in ("RETIRING", "RETIRED"):
            raise Refusal(
                "POOL_IRREVERSIBLE", f"member {rec['memberId']} is {rec['state']}: cannot {action}"
            )
        if rec["state"] not in allowed:
            raise Refusal(
                "POOL_PHASE", f"member {rec['memberId']} is {rec['state']}: cannot {action}"
            )

    @staticmethod
    def _expect_generation(rec: dict[str, Any], b: dict[str, Any]) -> None:
        gen = b.get("expectedGeneration")
        if isinstance(gen, bool) or not isinstance(gen, int):
            raise Refusal("POOL_VALIDATION", "expectedGeneration is required")
        if gen != rec["generation"]:
            raise Refusal(
                "POOL_STALE_GENERATION",
                f"expectedGeneration {gen} != member generation {rec['generation']}",
            )

    def member_action(
        self, rg: str, member_id: str, action: str, *, body: Any, **_: Any
    ) -> tuple[int, Any]:
        def apply(pool: Pool, b: dict[str, Any], _epoch: int) -> tuple[int, Any]:
            rec = self._member(pool, member_id)
            getattr(self, f"_{action}")(pool, rec, b)
            return 200, rec

        return self._mutation(rg, body, apply)

    def _admit(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        self._expect_state(rec, ("PREPARING",), "admit")
        receipt = b.get("receipt")
        if not isinstance(receipt, dict):
            raise Refusal("POOL_VALIDATION", "receipt is required")
        self._expect_generation(rec, b)
        if any(p["state"] == "OPEN" for p in pool.publications.values()):
            raise Refusal("POOL_PUBLICATION_BARRIER", "a tenant publication barrier is open")
        for key in ("bootId", "podUid", "nodeId", "coordinatorId", "configRevision"):
            if receipt.get(key) != rec[key]:
                raise Refusal(
                    "POOL_NOT_CERTIFIED", f"receipt {key} does not match the registered member"
                )
        expected = self._process_ids.get((pool.name, rec["memberId"]))
        if expected is not None and receipt.get("bootId") != expected:
            raise Refusal("POOL_NOT_CERTIFIED", "bootId is not the coordinator's processId")
        cert = receipt.get("certificateHash")
        if not isinstance(cert, str) or re.fullmatch(r"[0-9a-f]{64}", cert) is None:
            raise Refusal("POOL_NOT_CERTIFIED", "certificateHash must be 64 lowercase hex")
        checks = receipt.get("checks")
        if not isinstance(checks, list) or not set(REQUIRED_CHECKS) <= set(checks):
            raise Refusal("POOL_NOT_CERTIFIED", f"checks must include {', '.join(REQUIRED_CHECKS)}")
        workers = receipt.get("readyWorkers")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise Refusal("POOL_NOT_CERTIFIED", "readyWorkers must be >= 1")
        self._transition(pool, rec, "ACTIVE", eligible=True)

    def _drain(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        self._expect_state(rec, ("ACTIVE", "SUSPECT"), "drain")
        if rec["eligible"] and len(pool.active_eligible()) - 1 < pool.config["minServing"]:
            raise Refusal(
                "POOL_SERVING_FLOOR",
                f"draining {rec['memberId']} would leave fewer than "
                f"{pool.config['minServing']} serving members",
            )
        self._transition(pool, rec, "DRAINING")

    def _seal(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        self._expect_state(rec, ("DRAINING",), "seal")
        self._expect_generation(rec, b)
        ob = self._obligation_body(pool.name, rec)
        busy = ob["pendingRequests"] + ob["openTransactions"] + ob["activeQueries"]
        if busy or not (ob["readyToSeal"] or ob["drained"]):
            raise Refusal("POOL_NOT_DRAINED", f"member {rec['memberId']} still has obligations")
        self._transition(pool, rec, "SEALED")

    def _retire(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        self._expect_state(rec, ("SEALED",), "retire")
        self._expect_generation(rec, b)
        self._transition(pool, rec, "RETIRING")
        rec["retirementReceipt"] = {
            "kind": "DRAINED",
            "generation": rec["generation"],
            "claimedAt": _now(),
        }

    def _retired(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        if rec["state"] not in ("RETIRING", "LOST"):
            raise Refusal(
                "POOL_PHASE", f"member {rec['memberId']} is {rec['state']}: cannot retired"
            )
        if b.get("resourcesAbsent") is not True:
            raise Refusal("POOL_VALIDATION", "resourcesAbsent must be true")
        self._transition(pool, rec, "RETIRED")

    def _check_evidence(self, rec: dict[str, Any], b: dict[str, Any]) -> None:
        evidence = b.get("evidence")
        if not isinstance(evidence, dict):
            raise Refusal("POOL_EVIDENCE_REQUIRED", "evidence is required")
        for key in ("podUid", "bootId", "nodeId", "coordinatorId"):
            if evidence.get(key) != rec[key]:
                raise Refusal(
                    "POOL_EVIDENCE_REQUIRED", f"evidence {key} does not match the registered member"
                )
        if not isinstance(evidence.get("observation"), str) or not evidence["observation"]:
            raise Refusal("POOL_EVIDENCE_REQUIRED", "evidence observation is required")

    def _suspect(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        self._expect_state(rec, ("PREPARING", "ACTIVE", "DRAINING", "SEALED"), "suspect")
        self._check_evidence(rec, b)
        self._transition(pool, rec, "SUSPECT")

    def _lost(self, pool: Pool, rec: dict[str, Any], b: dict[str, Any]) -> None:
        self._expect_state(rec, ("SUSPECT",), "lost")
        self._check_evidence(rec, b)
        self._transition(pool, rec, "LOST")
        pool.failure_receipts[rec["memberId"]] = {
            "memberId": rec["memberId"],
            "state": "LOST",
            "kind": "FAILED",
            "generation": rec["generation"],
            "evidence": copy.deepcopy(b["evidence"]),
            "recordedAt": _now(),
        }

    def _obligation_body(self, rg: str, rec: dict[str, Any]) -> dict[str, Any]:
        departing = rec["state"] not in ("PREPARING", "ACTIVE", "SUSPECT")
        body = {
            "memberId": rec["memberId"],
            "generation": rec["generation"],
            "pendingRequests": 0,
            "openTransactions": 0,
            "activeQueries": 0,
            "readyToSeal": departing,
            "drained": departing,
        }
        body.update(self._obligations.get((rg, rec["memberId"]), {}))
        return body

    def get_obligations(self, rg: str, member_id: str, **_: Any) -> tuple[int, Any]:
        rec = self._member(self._pool(rg), member_id)
        return 200, self._obligation_body(rg, rec)

    def get_failure_receipt(self, rg: str, member_id: str, **_: Any) -> tuple[int, Any]:
        pool = self._pool(rg)
        self._member(pool, member_id)
        receipt = pool.failure_receipts.get(member_id)
        if receipt is None:
            raise Refusal("POOL_NOT_FOUND", f"member {member_id} has no failure receipt")
        return 200, receipt

    def get_operation(self, rg: str, op: str, **_: Any) -> tuple[int, Any]:
        pool = self._pool(rg)
        steps = []
        for step in pool.journal.get(op, {}).values():
            entry: dict[str, Any] = {
                "stepId": step.step_id,
                "payloadHash": step.payload_hash,
                "outcome": step.outcome,
            }
            if step.outcome == "APPLIED":
                entry["result"] = step.result
            else:
                entry["code"] = step.code
            steps.append(entry)
        return 200, {"operationId": op, "steps": steps}

    # -- tenants ---------------------------------------------------------------------------------

    @staticmethod
    def _tenant_admission(pool: Pool) -> None:
        if not pool.config["tenantAdmissionEnabled"]:
            raise Refusal("POOL_DISABLED", f"tenant admission is disabled on pool {pool.name}")

    def get_tenant(self, rg: str, tenant: str, **_: Any) -> tuple[int, Any]:
        rec = self._pool(rg).tenants.get(tenant)
        if rec is None:
            raise Refusal("POOL_NOT_FOUND", f"tenant {tenant} is unknown")
        return 200, rec

    def put_principals(self, rg: str, tenant: str, *, body: Any, **_: Any) -> tuple[int, Any]:
        def apply(pool: Pool, b: dict[str, Any], _epoch: int) -> tuple[int, Any]:
            self._tenant_admission(pool)
            principals = b.get("principals")
            if (
                not isinstance(principals, list)
                or not principals
                or not all(isinstance(p, str) and p for p in principals)
            ):
                raise Refusal("POOL_VALIDATION", "principals must be a non-empty list of names")
            wanted = sorted(set(principals))
            revision = b.get("bindingRevision")
            if revision != binding_revision(wanted):
                raise Refusal("POOL_VALIDATION", "bindingRevision does not match the principals")
            for other, bound in pool.tenants.items():
                if other != tenant and bound["state"] != "REVOKED":
                    clash = set(bound["principals"]) & set(wanted)
                    if clash:
                        raise Refusal(
                            "POOL_PRINCIPAL_CONFLICT",
                            f"principal {sorted(clash)[0]} is bound to tenant {other}",
                        )
            rec = pool.tenants.get(tenant)
            if rec is None or rec["state"] == "REVOKED":
                rec = {
                    "tenant": tenant,
                    "bindingRevision": revision,
                    "principals": wanted,
                    "state": "PENDING",
                    "admittedTargetRevision": "",
                }
                pool.tenants[tenant] = rec
            else:
                rec["bindingRevision"] = revision
                rec["principals"] = wanted
            return 200, rec

        return self._mutation(rg, body, apply)

    def revoke(self, rg: str, tenant: str, *, body: Any, **_: Any) -> tuple[int, Any]:
        def apply(pool: Pool, b: dict[str, Any], _epoch: int) -> tuple[int, Any]:
            self._tenant_admission(pool)
            if not isinstance(b.get("reason"), str) or not b["reason"]:
                raise Refusal("POOL_VALIDATION", "reason is required")
            for pub in pool.publications.values():
                if pub["tenant"] == tenant and pub["state"] == "OPEN":
                    pub["state"] = "ABANDONED"
            pool.tenants[tenant] = {
                "tenant": tenant,
                "bindingRevision": "",
                "principals": [],
                "state": "REVOKED",
                "admittedTargetRevision": "",
            }
            return 200, {"tenant": tenant, "state": "REVOKED"}

        return self._mutation(rg, body, apply)

    # -- publications ----------------------------------------------------------------------------

    def _publication(self, pool: Pool, pub: str) -> dict[str, Any]:
        rec = pool.publications.get(pub)
        if rec is None:
            raise Refusal("POOL_NOT_FOUND", f"publication {pub} is unknown")
        return rec

    def get_publication(self, rg: str, pub: str, **_: Any) -> tuple[int, Any]:
        return 200, self._publication(self._pool(rg), pub)

    def open_publication(self, rg: str, *, body: Any, **_: Any) -> tuple[int, Any]:
        def apply(pool: Pool, b: dict[str, Any], _epoch: int) -> tuple[int, Any]:
            self._tenant_admission(pool)
            for key in ("publicationId", "tenant", "targetRevision", "payloadHash"):
                if not isinstance(b.get(key), str) or not b[key]:
                    raise Refusal("POOL_VALIDATION", f"{key} is required")
            catalog_revision = b.get("catalogRevision")
            if isinstance(catalog_revision, bool) or not isinstance(catalog_revision, int):
                raise Refusal("POOL_VALIDATION", "catalogRevision must be an integer")
            tenant, target = b["tenant"], b["targetRevision"]
            if b["payloadHash"] != publication_payload_hash(tenant, target, catalog_revision):
                raise Refusal("POOL_VALIDATION", "payloadHash does not match")
            if b["publicationId"] != publication_id(tenant, target):
                raise Refusal("POOL_VALIDATION", "publicationId does not match tenant and target")
            rec = pool.tenants.get(tenant)
            if rec is None or rec["state"] == "REVOKED":
                raise Refusal("POOL_NOT_FOUND", f"tenant {tenant} has no published principals")
            if not target.startswith(f"b{rec['bindingRevision']}."):
                raise Refusal("POOL_VALIDATION", "targetRevision does not extend the binding")
            if b["publicationId"] in pool.publications:
                raise Refusal("POOL_IDENTITY_CONFLICT", f"publication {b['publicationId']} exists")
            if any(p["state"] == "OPEN" for p in pool.publications.values()):
                raise Refusal("POOL_PUBLICATION_BARRIER", "another publication barrier is open")
            pub = {
                "publicationId": b["publicationId"],
                "tenant": tenant,
                "targetRevision": target,
                "catalogRevision": catalog_revision,
                "state": "OPEN",
                "membershipGeneration": pool.membership_generation,
                "requiredMembers": pool.active_eligible(),
                "receipts": [],
            }
            pool.publications[b["publicationId"]] = pub
            return 201, pub

        return self._mutation(rg, body, apply)

    def publication_action(
        self, rg: str, pub_id: str, action: str, *, body: Any, **_: Any
    ) -> tuple[int, Any]:
        def apply(pool: Pool, b: dict[str, Any], _epoch: int) -> tuple[int, Any]:
            self._tenant_admission(pool)
            pub = self._publication(pool, pub_id)
            if action == "abandon":
                if pub["state"] == "ADMITTED":
                    raise Refusal("POOL_PHASE", f"publication {pub_id} is ADMITTED")
                pub["state"] = "ABANDONED"
                return 200, pub
            if pub["state"] != "OPEN":
                raise Refusal("POOL_PHASE", f"publication {pub_id} is {pub['state']}")
            if pool.membership_generation != pub["membershipGeneration"]:
                raise Refusal(
                    "POOL_MEMBERSHIP_CHANGED",
                    f"membership generation {pool.membership_generation} != "
                    f"{pub['membershipGeneration']}",
                )
            if action == "receipts":
                member_id = b.get("memberId")
                if member_id not in pub["requiredMembers"]:
                    raise Refusal("POOL_VALIDATION", f"member {member_id} is not required")
                rec = self._member(pool, str(member_id))
                applied = b.get("appliedRevision")
                if b.get("bootId") != rec["bootId"]:
                    raise Refusal("POOL_NOT_CERTIFIED", "bootId does not match the member")
                if isinstance(applied, bool) or not isinstance(applied, int):
                    raise Refusal("POOL_VALIDATION", "appliedRevision must be an integer")
                if applied < pub["catalogRevision"]:
                    raise Refusal("POOL_NOT_CERTIFIED", "appliedRevision is behind the publication")
                if member_id not in pub["receipts"]:
                    pub["receipts"] = sorted([*pub["receipts"], member_id])
                return 200, pub
            missing = sorted(set(pub["requiredMembers"]) - set(pub["receipts"]))
            if missing:
                raise Refusal("POOL_RECEIPTS_INCOMPLETE", f"missing receipts: {', '.join(missing)}")
            pub["state"] = "ADMITTED"
            pub["admittedTargetRevision"] = pub["targetRevision"]
            tenant = pool.tenants.get(pub["tenant"])
            if tenant is not None and tenant["state"] != "REVOKED":
                tenant["state"] = "ADMITTED"
                tenant["admittedTargetRevision"] = pub["targetRevision"]
            return 200, pub

        return self._mutation(rg, body, apply)

    # -- backend registry ------------------------------------------------------------------------

    def backend_all(self, **_: Any) -> tuple[int, Any]:
        return 200, [copy.deepcopy(self._backends[n]) for n in sorted(self._backends)]

    def backend_add(self, *, body: Any, **_: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise Refusal("POOL_VALIDATION", "the backend must be a JSON object")
        record = {}
        for key in ("name", "proxyTo", "routingGroup"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise Refusal("POOL_VALIDATION", f"{key} is required")
            record[key] = body[key]
        if body.get("active") is not False:
            raise Refusal("POOL_VALIDATION", "a backend is always added inactive")
        record = {
            "name": record["name"],
            "proxyTo": record["proxyTo"],
            "active": False,
            "routingGroup": record["routingGroup"],
        }
        existing = self._backends.get(record["name"])
        if existing is not None:
            if existing != record:
                raise Refusal("POOL_IDENTITY_CONFLICT", f"backend {record['name']} exists")
            return 200, existing
        self._backends[record["name"]] = record
        return 200, record

    def backend_delete(self, *, body: Any, **_: Any) -> tuple[int, Any]:
        if not isinstance(body, str) or not body.strip():
            raise Refusal("POOL_VALIDATION", "the body is the backend name (text/plain)")
        name = body.strip()
        existing = self._backends.get(name)
        if existing is not None:
            if existing["active"]:
                raise Refusal("POOL_PHASE", f"backend {name} is active")
            del self._backends[name]
        return 200, None


def _default_identity(member_id: str, backend_name: str) -> tuple[str, str]:
    digest = hashlib.sha256(member_id.encode()).hexdigest()
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    coordinator = "".join(alphabet[int(digest[i * 2 : i * 2 + 2], 16) % 36] for i in range(5))
    return f"{backend_name}-coordinator-{digest[10:14]}", coordinator


def _member_action(action: str) -> Any:
    def handler(g: GatewayDouble, rg: str, member_id: str, **kw: Any) -> tuple[int, Any]:
        return g.member_action(rg, member_id, action, **kw)

    return handler


def _publication_action(action: str) -> Any:
    def handler(g: GatewayDouble, rg: str, pub: str, **kw: Any) -> tuple[int, Any]:
        return g.publication_action(rg, pub, action, **kw)

    return handler


_B = r"/gateway/v1/pools/" + _SEG
_ROUTES: list[tuple[re.Pattern[str], dict[str, Any]]] = [
    (re.compile(_B), {"GET": GatewayDouble.get_pool, "PUT": GatewayDouble.put_pool}),
    (
        re.compile(_B + "/members"),
        {"GET": GatewayDouble.list_members, "POST": GatewayDouble.register},
    ),
    (re.compile(_B + "/members/" + _SEG), {"GET": GatewayDouble.get_member}),
    (re.compile(_B + "/members/" + _SEG + "/obligations"), {"GET": GatewayDouble.get_obligations}),
    (
        re.compile(_B + "/members/" + _SEG + "/failure-receipt"),
        {"GET": GatewayDouble.get_failure_receipt},
    ),
    *[
        (re.compile(_B + "/members/" + _SEG + "/" + action), {"POST": _member_action(action)})
        for action in ("admit", "drain", "seal", "suspect", "lost", "retire", "retired")
    ],
    (re.compile(_B + "/operations/" + _SEG), {"GET": GatewayDouble.get_operation}),
    (re.compile(_B + "/publications"), {"POST": GatewayDouble.open_publication}),
    (re.compile(_B + "/publications/" + _SEG), {"GET": GatewayDouble.get_publication}),
    *[
        (
            re.compile(_B + "/publications/" + _SEG + "/" + action),
            {"POST": _publication_action(action)},
        )
        for action in ("receipts", "commit", "abandon")
    ],
    (
        re.compile(_B + "/tenants/" + _SEG),
        {"GET": GatewayDouble.get_tenant, "DELETE": GatewayDouble.revoke},
    ),
    (re.compile(_B + "/tenants/" + _SEG + "/principals"), {"PUT": GatewayDouble.put_principals}),
    (re.compile(r"/gateway/backend/all"), {"GET": GatewayDouble.backend_all}),
    (re.compile(r"/gateway/backend/modify/add"), {"POST": GatewayDouble.backend_add}),
    (re.compile(r"/gateway/backend/modify/delete"), {"POST": GatewayDouble.backend_delete}),
]


class _Handler(BaseHTTPRequestHandler):
    gateway: GatewayDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _serve(self) -> None:
        method = self.command
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(413, {"message": "body too large"}, "")
            return
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        parsed = self.gateway.record(method, self.path, headers, raw)
        fault = self.gateway.take_fault(method, self.path)
        if fault is not None:
            if fault.delay:
                time.sleep(fault.delay)
            if fault.unavailable:
                self._answer(503, {"message": "unavailable"}, "")
                return
            if fault.refuse is not None:
                self._answer(
                    fault.status,
                    {"code": fault.refuse, "message": "injected refusal"},
                    fault.refuse,
                )
                return
        status, body, code = self.gateway.handle(method, self.path, headers, parsed)
        if fault is not None and fault.drop_response:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._answer(status, body, code)

    def _answer(self, status: int, body: Any, code: str) -> None:
        payload = b"" if body is None else json.dumps(body).encode("utf-8")
        self.send_response(status)
        if code:
            self.send_header("X-Trino-Gateway-Error", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (timeouts under test)
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve


@pytest.fixture
def gateway() -> Iterator[GatewayDouble]:
    double = GatewayDouble().start()
    try:
        yield double
    finally:
        double.stop()
