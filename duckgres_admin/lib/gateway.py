"""The only module that speaks HTTP to the Trino Gateway (trino-pools §4.8, gateway-protocol.md).

Invariants:

* **HTTPS only**, TLS ≥ 1.2, certificate and host name verified against the pinned
  ``server_name`` (or the URL host). Plain HTTP only when the caller passes ``allow_http=True``
  (tests). No proxy is ever used: the client speaks ``http.client`` directly and never reads the
  proxy environment.
* **Redirects are never followed.** A 3xx is a refusal; nothing is sent to its ``Location``, so
  the token cannot leak to a redirect target.
* **Bounded**: one request has a 10 s budget (connect, send, headers, body) and 5 s for the
  response headers; request and response bodies are at most 1 MiB.
* **Auth** on every request: ``Authorization: Bearer <t>`` and
  ``X-Gateway-Transaction-Admin-Token: <t>``. The token is never part of an exception message, a
  ``repr`` or a log line (messages echoed by the Gateway are scrubbed of it as well).
* **Outcomes are typed and keyed on the header only.** 200/201 → parsed JSON. A non-2xx answer with
  a known ``X-Trino-Gateway-Error`` code → :class:`GatewayRefused` (decisive: nothing applied).
  Without a known code: 5xx/429 → :class:`GatewayUnavailable` (retryable, outcome unknown), any
  other status → :class:`GatewayRefused` with code ``''`` (no header) or ``'UNKNOWN'``. A
  transport error, timeout, closed connection, other 2xx, oversize or malformed success body →
  :class:`UnknownOutcome`: the request may have been applied; resolve it by read-back.
* Requests that cannot be sent as asked (bad scheme, oversize body, bad path) raise
  :class:`GatewayUsageError` before any byte leaves the process.

The ``parse_*`` functions turn response bodies into dataclasses and raise
:class:`GatewayProtocolError` (a ``ValueError``) on a body that does not have the protocol's shape.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from duckgres_admin.base.scrub import Scrubber

MAX_BODY = 1024 * 1024
ERROR_HEADER = "X-Trino-Gateway-Error"
POOL_BASE = "/gateway/v1/pools"

KNOWN_CODES = frozenset(
    {
        "POOL_DISABLED",
        "POOL_STALE_EPOCH",
        "POOL_INTENT_CHANGED",
        "POOL_STALE_GENERATION",
        "POOL_PHASE",
        "POOL_IRREVERSIBLE",
        "POOL_SERVING_FLOOR",
        "POOL_SURGE_BUDGET",
        "POOL_NOT_CERTIFIED",
        "POOL_PUBLICATION_BARRIER",
        "POOL_MEMBERSHIP_CHANGED",
        "POOL_RECEIPTS_INCOMPLETE",
        "POOL_EVIDENCE_REQUIRED",
        "POOL_VALIDATION",
        "POOL_NOT_FOUND",
        "POOL_IDENTITY_CONFLICT",
        "POOL_APIMODE",
        "POOL_NOT_DRAINED",
        "POOL_REPAIR_BUDGET",
        "POOL_PRINCIPAL_CONFLICT",
        "TENANT_NOT_ADMITTED",
        "TENANT_IDENTITY_UNVERIFIED",
        "ROUTING_STATE_UNAVAILABLE",
    }
)
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE"})
_MESSAGE_LIMIT = 300


class GatewayError(Exception):
    """Any failure of a Gateway call."""


class GatewayRefused(GatewayError):
    """A non-2xx answer with a decisive outcome: the Gateway applied nothing."""

    def __init__(self, code: str, status: int, message: str) -> None:
        self.code = code
        self.status = status
        self.message = message
        super().__init__(f"Gateway refused ({status} {code or 'no code'}): {message}")


class GatewayUnavailable(GatewayError):
    """5xx/429/503 without a decisive code: retryable, the outcome is unknown."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"Gateway unavailable ({status}): {message}")


class UnknownOutcome(GatewayError):
    """No usable answer (transport error, timeout, bad success body): resolve by read-back."""


class GatewayUsageError(GatewayError, ValueError):
    """The request was not sent: the URL, method, path or body is not allowed."""


class GatewayProtocolError(ValueError):
    """A response body does not have the shape of the protocol."""


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS connection whose TLS server name (SNI and certificate check) is pinned."""

    def __init__(
        self, host: str, port: int, *, timeout: float, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._ctx = context
        self._server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            self.sock = self._ctx.wrap_socket(sock, server_hostname=self._server_name)
        except BaseException:
            sock.close()
            raise


class _Watchdog:
    """Hard deadlines: when a phase overruns, the socket is shut down so no read blocks past it."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self._conn = conn
        self._timer: threading.Timer | None = None
        self.fired = ""

    def arm(self, seconds: float, reason: str) -> None:
        self.cancel()
        timer = threading.Timer(max(seconds, 0.0), self._fire, (reason,))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, reason: str) -> None:
        self.fired = reason
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class GatewayClient:
    """Typed calls to one Gateway; see the module docstring for the rules."""

    BACKEND_ALL = "/gateway/backend/all"
    BACKEND_ADD = "/gateway/backend/modify/add"
    BACKEND_DELETE = "/gateway/backend/modify/delete"

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        server_name: str = "",
        allow_http: bool = False,
        timeout: float = 10.0,
        header_timeout: float = 5.0,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "https" and not (allow_http and parts.scheme == "http"):
            raise GatewayUsageError("the Gateway URL must use https")
        if parts.username is not None or parts.password is not None:
            raise GatewayUsageError("the Gateway URL must not carry credentials")
        if parts.query or parts.fragment or parts.path not in ("", "/"):
            raise GatewayUsageError(
                "the Gateway URL must be an origin (no path, query or fragment)"
            )
        if not parts.hostname:
            raise GatewayUsageError("the Gateway URL has no host")
        if not token or any(ord(c) < 0x21 or ord(c) == 0x7F for c in token):
            raise GatewayUsageError("the Gateway token is empty or contains control characters")
        try:
            port = parts.port
        except ValueError:
            raise GatewayUsageError("the Gateway URL has an invalid port") from None
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = port or (443 if parts.scheme == "https" else 80)
        self._server_name = server_name or parts.hostname
        self._token = token
        self._scrubber = Scrubber(token, min_length=1)
        self._timeout = timeout
        self._header_timeout = header_timeout
        self._context: ssl.SSLContext | None = None
        if self._scheme == "https":
            ctx = ssl.create_default_context()
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = True
            ctx.verify_mode = ssl.CERT_REQUIRED
            self._context = ctx

    def __repr__(self) -> str:
        origin = f"{self._scheme}://{self._host}:{self._port}"
        return f"GatewayClient({origin}, server_name={self._server_name!r})"

    @staticmethod
    def pool_path(routing_group: str, *segments: str) -> str:
        """``/gateway/v1/pools/<rg>/<seg>/…`` with every segment percent-escaped."""
        parts = [routing_group, *segments]
        if any(not isinstance(p, str) or not p for p in parts):
            raise GatewayUsageError("Gateway path segments must be non-empty strings")
        return POOL_BASE + "/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)

    def get(self, path: str) -> Any:
        return self._request("GET", path, None, "")

    def send(
        self, method: str, path: str, body: str, *, content_type: str = "application/json"
    ) -> Any:
        return self._request(method, path, body.encode("utf-8"), content_type)

    # -- internals ---------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return self._scrubber.scrub(text)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._context is not None:
            return _PinnedHTTPSConnection(
                self._host,
                self._port,
                timeout=timeout,
                context=self._context,
                server_name=self._server_name,
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _request(self, method: str, path: str, body: bytes | None, content_type: str) -> Any:
        if method not in _METHODS:
            raise GatewayUsageError(f"method {method!r} is not used by the Gateway protocol")
        if (
            not path.startswith("/")
            or path.startswith("//")
            or any(c in path for c in "?# \r\n\t")
            or any(ord(c) < 0x20 or ord(c) > 0x7E for c in path)
        ):
            raise GatewayUsageError("the Gateway path must be an escaped absolute path")
        if body is not None and len(body) > MAX_BODY:
            raise GatewayUsageError(
                f"request body of {len(body)} bytes exceeds the 1 MiB limit; nothing was sent"
            )
        headers = {
            "Authorization": f"Bearer {self._token}",
            "X-Gateway-Transaction-Admin-Token": self._token,
            "Accept": "application/json",
            "User-Agent": "duckgres-admin-gateway/1",
        }
        if body is not None:
            headers["Content-Type"] = (
                f"{content_type}; charset=utf-8" if "charset" not in content_type else content_type
            )
        what = f"{method} {path}"
        deadline = time.monotonic() + self._timeout
        conn = self._connection(min(self._header_timeout, self._timeout))
        watchdog = _Watchdog(conn)
        try:
            try:
                watchdog.arm(
                    min(self._header_timeout, self._timeout),
                    "no response headers within the header timeout",
                )
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                watchdog.arm(deadline - time.monotonic(), "the request budget is exhausted")
                status = response.status
                code = (response.getheader(ERROR_HEADER) or "").strip()
                raw = self._read_body(conn, response, deadline)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                detail = watchdog.fired or self._scrub(f"{type(exc).__name__}: {exc}")
                if not watchdog.fired and time.monotonic() >= deadline:
                    detail = "the request budget is exhausted"
                raise UnknownOutcome(
                    f"{what}: no answer from the Gateway ({detail[:_MESSAGE_LIMIT]})"
                ) from None
            if watchdog.fired:
                raise UnknownOutcome(f"{what}: no answer from the Gateway ({watchdog.fired})")
        finally:
            watchdog.cancel()
            conn.close()
        if status in (200, 201):
            if raw is None:
                raise UnknownOutcome(f"{what}: the Gateway's {status} answer exceeds 1 MiB")
            if not raw.strip():
                return None
            try:
                return json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                raise UnknownOutcome(f"{what}: the Gateway's {status} answer is not JSON") from None
        if 200 <= status < 300:
            raise UnknownOutcome(f"{what}: unexpected success status {status}")
        message = self._message(raw, status)
        if code in KNOWN_CODES:
            raise GatewayRefused(code, status, f"{what}: {message}")
        if status >= 500 or status == 429:
            raise GatewayUnavailable(status, f"{what}: {message}")
        if 300 <= status < 400:
            message = "redirect refused (never followed)"
        return_code = "UNKNOWN" if code else ""
        raise GatewayRefused(return_code, status, f"{what}: {message}")

    def _read_body(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, deadline: float
    ) -> bytes | None:
        """At most 1 MiB of the body within the request budget; ``None`` when longer."""
        chunks: list[bytes] = []
        total = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the Gateway request budget is exhausted")
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            chunk = response.read1(64 * 1024)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > MAX_BODY:
                return None
            chunks.append(chunk)

    def _message(self, raw: bytes | None, status: int) -> str:
        if raw is None:
            return f"HTTP {status} (body over 1 MiB)"
        text = ""
        try:
            doc = json.loads(raw.decode("utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("message"), str):
                text = doc["message"]
        except (UnicodeDecodeError, ValueError):
            text = ""
        text = self._scrub(text or f"HTTP {status}")
        return "".join(c if c.isprintable() else " " for c in text)[:_MESSAGE_LIMIT]


# -- response parsers ----------------------------------------------------------------------------


def _obj(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise GatewayProtocolError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _str(doc: dict[str, Any], key: str, what: str, *, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise GatewayProtocolError(f"{what}: field {key!r} must be a string")
    return value


def _int(doc: dict[str, Any], key: str, what: str, *, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GatewayProtocolError(f"{what}: field {key!r} must be an integer")
    return value


def _bool(doc: dict[str, Any], key: str, what: str) -> bool:
    value = doc.get(key)
    if not isinstance(value, bool):
        raise GatewayProtocolError(f"{what}: field {key!r} must be a boolean")
    return value


def _strs(
    doc: dict[str, Any], key: str, what: str, *, default: list[str] | None = None
) -> list[str]:
    value = doc.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GatewayProtocolError(f"{what}: field {key!r} must be a list of strings")
    return list(value)


@dataclass(frozen=True)
class PoolConfig:
    pool: str
    api_mode: str
    min_serving: int
    desired_members: int
    max_surge: int
    max_repair: int
    desired_revision: str
    tenant_admission_enabled: bool
    membership_generation: int


@dataclass(frozen=True)
class Member:
    member_id: str
    backend_name: str
    state: str
    eligible: bool
    incarnation: int
    generation: int
    pod_uid: str
    boot_id: str
    node_id: str
    coordinator_id: str
    config_revision: str
    repair_for: str
    retirement_receipt: dict[str, Any] | None = None


@dataclass(frozen=True)
class Obligations:
    member_id: str
    generation: int
    pending_requests: int
    open_transactions: int
    active_queries: int
    ready_to_seal: bool
    drained: bool

    @property
    def sealable(self) -> bool:
        """Drained by obligations only: zero counters and (readyToSeal or drained)."""
        zero = self.pending_requests + self.open_transactions + self.active_queries == 0
        return zero and (self.ready_to_seal or self.drained)


@dataclass(frozen=True)
class FailureReceipt:
    member_id: str
    state: str
    kind: str
    generation: int
    evidence: dict[str, Any]
    recorded_at: str


@dataclass(frozen=True)
class Publication:
    publication_id: str
    tenant: str
    target_revision: str
    catalog_revision: int
    state: str
    membership_generation: int
    required_members: list[str] = field(default_factory=list)
    receipts: list[str] = field(default_factory=list)
    admitted_target_revision: str = ""


@dataclass(frozen=True)
class Tenant:
    tenant: str
    binding_revision: str
    principals: list[str]
    state: str
    admitted_target_revision: str


@dataclass(frozen=True)
class OperationStep:
    step_id: str
    payload_hash: str
    outcome: str  # APPLIED | REFUSED
    code: str
    result: Any


@dataclass(frozen=True)
class OperationRecord:
    operation_id: str
    steps: list[OperationStep]

    def step(self, step_id: str) -> OperationStep | None:
        return next((s for s in self.steps if s.step_id == step_id), None)


@dataclass(frozen=True)
class Backend:
    name: str
    proxy_to: str
    active: bool
    routing_group: str


def parse_pool(obj: Any) -> PoolConfig:
    w = "Gateway pool"
    d = _obj(obj, w)
    return PoolConfig(
        pool=_str(d, "pool", w),
        api_mode=_str(d, "apiMode", w),
        min_serving=_int(d, "minServing", w),
        desired_members=_int(d, "desiredMembers", w),
        max_surge=_int(d, "maxSurge", w),
        max_repair=_int(d, "maxRepair", w),
        desired_revision=_str(d, "desiredRevision", w),
        tenant_admission_enabled=_bool(d, "tenantAdmissionEnabled", w),
        membership_generation=_int(d, "membershipGeneration", w),
    )


def parse_member(obj: Any) -> Member:
    w = "Gateway member"
    d = _obj(obj, w)
    receipt = d.get("retirementReceipt")
    if receipt is not None and not isinstance(receipt, dict):
        raise GatewayProtocolError(f"{w}: field 'retirementReceipt' must be an object")
    return Member(
        member_id=_str(d, "memberId", w),
        backend_name=_str(d, "backendName", w),
        state=_str(d, "state", w),
        eligible=_bool(d, "eligible", w),
        incarnation=_int(d, "incarnation", w),
        generation=_int(d, "generation", w),
        pod_uid=_str(d, "podUid", w),
        boot_id=_str(d, "bootId", w),
        node_id=_str(d, "nodeId", w),
        coordinator_id=_str(d, "coordinatorId", w),
        config_revision=_str(d, "configRevision", w),
        repair_for=_str(d, "repairFor", w, default=""),
        retirement_receipt=receipt,
    )


def parse_members(obj: Any) -> tuple[int, list[Member]]:
    """``GET …/members`` → (membershipGeneration, members)."""
    w = "Gateway member list"
    d = _obj(obj, w)
    members = d.get("members")
    if not isinstance(members, list):
        raise GatewayProtocolError(f"{w}: field 'members' must be a list")
    return _int(d, "membershipGeneration", w), [parse_member(m) for m in members]


def parse_obligations(obj: Any) -> Obligations:
    """Every field is required: an absent counter must never read as zero (spec §4.8)."""
    w = "Gateway obligations"
    d = _obj(obj, w)
    return Obligations(
        member_id=_str(d, "memberId", w),
        generation=_int(d, "generation", w),
        pending_requests=_int(d, "pendingRequests", w),
        open_transactions=_int(d, "openTransactions", w),
        active_queries=_int(d, "activeQueries", w),
        ready_to_seal=_bool(d, "readyToSeal", w),
        drained=_bool(d, "drained", w),
    )


def parse_failure_receipt(obj: Any) -> FailureReceipt:
    w = "Gateway failure receipt"
    d = _obj(obj, w)
    return FailureReceipt(
        member_id=_str(d, "memberId", w),
        state=_str(d, "state", w),
        kind=_str(d, "kind", w),
        generation=_int(d, "generation", w),
        evidence=_obj(d.get("evidence"), f"{w} evidence"),
        recorded_at=_str(d, "recordedAt", w),
    )


def parse_publication(obj: Any) -> Publication:
    w = "Gateway publication"
    d = _obj(obj, w)
    return Publication(
        publication_id=_str(d, "publicationId", w),
        tenant=_str(d, "tenant", w),
        target_revision=_str(d, "targetRevision", w),
        catalog_revision=_int(d, "catalogRevision", w),
        state=_str(d, "state", w),
        membership_generation=_int(d, "membershipGeneration", w),
        required_members=_strs(d, "requiredMembers", w),
        receipts=_strs(d, "receipts", w),
        admitted_target_revision=_str(d, "admittedTargetRevision", w, default=""),
    )


def parse_tenant(obj: Any) -> Tenant:
    """A tenant body; the revoke answer ``{"tenant","state"}`` parses with empty bindings."""
    w = "Gateway tenant"
    d = _obj(obj, w)
    return Tenant(
        tenant=_str(d, "tenant", w),
        binding_revision=_str(d, "bindingRevision", w, default=""),
        principals=_strs(d, "principals", w, default=[]),
        state=_str(d, "state", w),
        admitted_target_revision=_str(d, "admittedTargetRevision", w, default=""),
    )


def parse_operation(obj: Any) -> OperationRecord:
    w = "Gateway operation"
    d = _obj(obj, w)
    steps = d.get("steps")
    if not isinstance(steps, list):
        raise GatewayProtocolError(f"{w}: field 'steps' must be a list")
    parsed = []
    for raw in steps:
        s = _obj(raw, f"{w} step")
        outcome = _str(s, "outcome", w)
        if outcome not in ("APPLIED", "REFUSED"):
            raise GatewayProtocolError(f"{w}: step outcome {outcome[:40]!r} is not APPLIED/REFUSED")
        parsed.append(
            OperationStep(
                step_id=_str(s, "stepId", w),
                payload_hash=_str(s, "payloadHash", w),
                outcome=outcome,
                code=_str(s, "code", w, default=""),
                result=s.get("result"),
            )
        )
    return OperationRecord(operation_id=_str(d, "operationId", w), steps=parsed)


def parse_backend(obj: Any) -> Backend:
    w = "Gateway backend"
    d = _obj(obj, w)
    return Backend(
        name=_str(d, "name", w),
        proxy_to=_str(d, "proxyTo", w),
        active=_bool(d, "active", w),
        routing_group=_str(d, "routingGroup", w),
    )


def parse_backends(obj: Any) -> list[Backend]:
    if not isinstance(obj, list):
        raise GatewayProtocolError("Gateway backend list: expected a JSON array")
    return [parse_backend(b) for b in obj]
