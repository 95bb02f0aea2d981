"""Candidate validation and coordinator probes (spec trino-pools §4.6 CREATING/PREPARING, §4.12).

Every probe request goes through :func:`duckgres_admin.lib.http.request` and obeys, in order:

1. **Endpoint check before sending.** The base endpoint is ``https://host[:port]`` or, for an
   in-cluster pool endpoint (host ``*.svc.cluster.local``), ``http://…`` ("internal HTTP"); it
   has no userinfo, query or fragment. A request URL must have the endpoint's host
   (case-insensitive), scheme and port, no userinfo, query or fragment, no ``.``/``..`` path
   segment, and a path that is exactly ``/v1/statement``, under ``/v1/statement/``, exactly
   ``/v1/info`` or exactly ``/v1/catalog/sync`` (the last is not in the §4.12 list but §4.6 and
   stage (3) read it). ``/v1/statement-unrelated`` is refused before anything is sent.
2. **Continuations.** A ``nextUri`` must be same-origin. For internal HTTP, a GET continuation
   under ``/v1/statement/`` that the coordinator reports as ``https`` port 443 (it honours the
   forwarded headers we send) is rewritten onto the endpoint's own scheme, host and port. Any
   other origin is refused, so the credential never reaches a foreign host.
3. **Headers.** Basic auth with the pool's own observer principal, ``X-Trino-User``,
   ``X-Trino-Source: rollout-readiness``, ``Content-Type: text/plain``; internal HTTP adds
   ``X-Forwarded-Proto: https`` and ``X-Forwarded-Port: 443``.
4. **Answers.** Redirects are never followed; any status but 200 fails without echoing the
   body; a body over 1 MiB, bad JSON, a non-object document or a JSON ``error`` fails. One
   statement may use at most 32 pages, 4 MiB and 4096 rows.
5. **Credential.** Read from the Secret ``trino-observer`` (keys ``username``, ``password``) in
   the pool's own namespace on every probe call; errors name the Secret and key, never a value.
   The credential never appears in an exception, a log line or a result.

Validation is resumable (:class:`Validator`): a pass is stages (1)-(7) of §4.12 in order; each
``step()`` issues at most two requests (20 s) and keeps the pass state in memory keyed by
instance id. A pass older than its budget (5 min) is discarded and the next step starts a new
one; only a completed pass produces a receipt. A coordinator whose ``processId`` differs from the
one registered, or whose identity changes mid-pass, fails with
``"the coordinator process restarted before admission"`` (``fatal=True``).

Decisions where the specification is silent (also in ``docs/trino-validation.md``):

- Stage (1): Trino does not report its image. The caller reads the coordinator pod's running
  container image from Kubernetes (``status.containerStatuses[].image`` of the coordinator
  container, else its spec image) and passes it as ``ValidationContext.running_image``
  (worker images, when known, as ``running_worker_images``). An unknown running image fails the
  stage. Images compare after dropping a leading ``docker.io/`` and ``library/``.
- ``securityRevisions`` is read from the ``/v1/catalog/sync`` answer (absent = no components).
- ``/v1/info`` identity unchanged (stage 5) means the same ``nodeId`` and ``coordinatorId`` (and
  ``processId`` when ``/v1/info`` reports one). The statement's query id must also end with the
  coordinator id, so a restart between stages is caught at the next request.
- Every probe request, the process-identity probe included, has a 10 s budget (connect, send,
  headers and body): §4.12's 8 s client timeout would fail a coordinator that answers after 9 s,
  which safeguard 44 requires to validate.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from duckgres_admin.lib import http
from duckgres_admin.lib.k8s import KubeError, read_secret_key

_log = logging.getLogger("duckgres.trino.probes")

OBSERVER_SECRET = "trino-observer"
SOURCE = "rollout-readiness"
INTERNAL_SUFFIX = ".svc.cluster.local"
MAX_BODY_BYTES = 1024 * 1024
MAX_STATEMENT_PAGES = 32
MAX_STATEMENT_BYTES = 4 * 1024 * 1024
MAX_STATEMENT_ROWS = 4096
REQUEST_BUDGET_SECONDS = 10.0
PASS_BUDGET_SECONDS = 300.0
REQUESTS_PER_STEP = 2
NODES_SQL = "SELECT node_id, coordinator, state FROM system.runtime.nodes"
CHECKS = ("image", "workers", "catalog-revision", "operational-connection")
SECURITY_KINDS = ("system-access-control", "password-authenticator", "group-provider")
RESTARTED = "the coordinator process restarted before admission"
COORDINATOR_ID = re.compile(r"^[A-Za-z0-9]{5}$")

#: The test DNS seam: URL host (lower case) → (address, port) to connect to instead. Every probe
#: request consults it; production never sets it. Tests point a Service host such as
#: ``cell-1a2b3c4d.trino-a.svc.cluster.local`` at a stand-in coordinator on 127.0.0.1.
CONNECT_OVERRIDES: dict[str, tuple[str, int]] = {}

Credential = tuple[str, str]


class ProbeError(Exception):
    """A probe or validation failure; the message never carries a credential or a body."""


def _clip(text: str, limit: int = 120) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- credential ----------------------------------------------------------------------------


def observer_credential(namespace: str) -> Credential:
    """The pool's observer principal from Secret ``trino-observer`` in its own namespace."""
    values: list[str] = []
    for key in ("username", "password"):
        where = f"Secret {OBSERVER_SECRET} key {key} in namespace {namespace}"
        try:
            value = read_secret_key(namespace, OBSERVER_SECRET, key)
        except KubeError as exc:
            if exc.status == 404:
                cause = "the Secret does not exist"
            elif exc.status is None and "missing key" in str(exc):
                cause = "the key is missing"
            elif exc.status is not None:
                cause = f"the Kubernetes API answered {exc.status}"
            else:
                cause = "the Kubernetes API could not be read"
            raise ProbeError(f"observer credential unavailable: {where}: {cause}") from None
        except UnicodeDecodeError:
            raise ProbeError(f"observer credential unavailable: {where}: not UTF-8") from None
        if not value:
            raise ProbeError(f"observer credential unavailable: {where}: the key is empty")
        values.append(value)
    username, password = values
    if ":" in username or any(not ch.isprintable() for ch in username):
        raise ProbeError(
            f"observer credential unusable: Secret {OBSERVER_SECRET} key username in namespace "
            f"{namespace}: must not contain ':' or control characters"
        )
    return username, password


# --- endpoint and continuation rules -------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str  # lower case
    port: int
    internal: bool  # plain HTTP to an in-cluster Service

    def url(self, path: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return urlunsplit((self.scheme, f"{host}:{self.port}", path, "", ""))


def origin_of(endpoint_url: str) -> Origin:
    """The validated base endpoint (§4.12 endpoint checks)."""
    try:
        parts = urlsplit(endpoint_url)
        port = parts.port
    except ValueError:
        raise ProbeError("probe endpoint is not a valid URL") from None
    host = (parts.hostname or "").lower()
    if not host:
        raise ProbeError("probe endpoint has no host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ProbeError("probe endpoint must not carry userinfo")
    if parts.query or parts.fragment or "?" in endpoint_url or "#" in endpoint_url:
        raise ProbeError("probe endpoint must not carry a query or fragment")
    if parts.path not in ("", "/"):
        raise ProbeError("probe endpoint must not carry a path")
    if parts.scheme == "https":
        return Origin("https", host, port or 443, internal=False)
    if parts.scheme == "http" and host.endswith(INTERNAL_SUFFIX):
        return Origin("http", host, port or 80, internal=True)
    raise ProbeError(
        f"probe endpoint scheme {_clip(parts.scheme)!r} refused: https, or http for an "
        f"in-cluster Service (*{INTERNAL_SUFFIX})"
    )


def _path_allowed(path: str) -> bool:
    if path in ("/v1/statement", "/v1/info", "/v1/catalog/sync"):
        return True
    if not path.startswith("/v1/statement/"):
        return False
    segments = unquote(path).replace("\\", "/").split("/")
    return not any(seg in (".", "..") for seg in segments)


def check_target(
    origin: Origin, url: str, *, method: str = "GET", continuation: bool = False
) -> str:
    """The URL actually requested for ``url``, or :class:`ProbeError` before anything is sent."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ProbeError("probe URL is not a valid URL") from None
    what = "continuation nextUri" if continuation else "probe URL"
    host = (parts.hostname or "").lower()
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ProbeError(f"{what} refused: it carries userinfo")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ProbeError(f"{what} refused: it carries a query or fragment")
    if host != origin.host:
        raise ProbeError(f"{what} refused: host {_clip(host)!r} is not the endpoint's host")
    if not _path_allowed(parts.path):
        raise ProbeError(f"{what} refused: path {_clip(parts.path)!r} is not a probe path")
    if parts.scheme not in ("http", "https"):
        raise ProbeError(f"{what} refused: scheme {_clip(parts.scheme)!r}")
    effective_port = port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == origin.scheme and effective_port == origin.port:
        return origin.url(parts.path)
    if (
        continuation
        and origin.internal
        and method == "GET"
        and parts.scheme == "https"
        and effective_port == 443
        and parts.path.startswith("/v1/statement/")
    ):
        # The coordinator reports forwarded https:443; bring it back onto the Service.
        return origin.url(parts.path)
    raise ProbeError(
        f"{what} refused: {parts.scheme}://{_clip(host)}:{effective_port} is not the "
        f"endpoint's origin"
    )


def probe_headers(origin: Origin, credential: Credential) -> dict[str, str]:
    username, password = credential
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    headers = {
        "Authorization": f"Basic {token}",
        "X-Trino-User": username,
        "X-Trino-Source": SOURCE,
        "Content-Type": "text/plain",
        "Accept": "application/json",
    }
    if origin.internal:
        headers["X-Forwarded-Proto"] = "https"
        headers["X-Forwarded-Port"] = "443"
    return headers


def probe(
    origin: Origin,
    credential: Credential,
    url: str,
    *,
    method: str = "GET",
    body: str | None = None,
    continuation: bool = False,
    budget: float = REQUEST_BUDGET_SECONDS,
) -> tuple[dict[str, Any], int]:
    """One checked request; returns the JSON object and the body size."""
    target = check_target(origin, url, method=method, continuation=continuation)
    path = urlsplit(target).path
    try:
        response = http.request(
            method,
            target,
            headers=probe_headers(origin, credential),
            body=body.encode() if body is not None else None,
            timeout=max(budget, 0.1),
            max_bytes=MAX_BODY_BYTES,
            connect_to=CONNECT_OVERRIDES.get(origin.host),
        )
    except http.HttpTransportError as exc:
        raise ProbeError(f"{method} {path}: {_clip(str(exc), 200)}") from None
    if response.status != 200:
        raise ProbeError(f"{method} {path} answered HTTP {response.status}")
    if response.truncated:
        raise ProbeError(f"{method} {path}: the answer exceeds {MAX_BODY_BYTES} bytes")
    try:
        doc = json.loads(response.body)
    except (ValueError, UnicodeDecodeError):
        raise ProbeError(f"{method} {path}: the answer is not valid JSON") from None
    if not isinstance(doc, dict):
        raise ProbeError(f"{method} {path}: the answer is not a JSON object")
    error = doc.get("error")
    if error is not None:
        name = error.get("errorName") if isinstance(error, dict) else None
        detail = f" ({_clip(name, 60)})" if isinstance(name, str) and name else ""
        raise ProbeError(f"{method} {path}: the coordinator reported an error{detail}")
    return doc, len(response.body)


def _text(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def read_process_id(
    endpoint_url: str,
    namespace: str,
    *,
    credentials: Callable[[str], Credential] = observer_credential,
) -> str:
    """The coordinator's boot identity: only ``processId`` of ``/v1/catalog/sync``."""
    origin = origin_of(endpoint_url)
    doc, _ = probe(origin, credentials(namespace), origin.url("/v1/catalog/sync"))
    process_id = _text(doc, "processId")
    if not process_id:
        raise ProbeError("GET /v1/catalog/sync reported no processId")
    return process_id


# --- receipt formulas ----------------------------------------------------------------------


def auth_fingerprint(components: Sequence[dict[str, Any]]) -> str:
    """SHA-256 hex over sorted ``kind NUL name NUL revision NUL error`` joined by 0x1E."""
    if not components:
        return hashlib.sha256(b"none").hexdigest()
    entries = sorted(
        "\0".join(str(c.get(k) or "") for k in ("kind", "name", "revision", "error"))
        for c in components
    )
    return hashlib.sha256("\x1e".join(entries).encode()).hexdigest()


def certificate_hash(
    *,
    node_id: str,
    process_id: str,
    coordinator_id: str,
    applied_revision: int,
    auth_fingerprint: str,
    ready_workers: int,
    checks: Sequence[str],
) -> str:
    """SHA-256 hex over the NUL-separated admission facts (§4.12 step 7)."""
    fields = (
        node_id,
        process_id,
        coordinator_id,
        str(applied_revision),
        auth_fingerprint,
        str(ready_workers),
        ",".join(checks),
    )
    return hashlib.sha256("\0".join(fields).encode()).hexdigest()


def claimed_checks(
    components: Sequence[dict[str, Any]], expected_auth: dict[str, str]
) -> list[str]:
    """Stage (6): the four base checks, plus ``auth-revision`` only when every component reports
    a revision and each required kind reports exactly the expected one (empty → never)."""
    checks = list(CHECKS)
    if not expected_auth or not components:
        return checks
    if any(not c.get("revision") or c.get("error") for c in components):
        return checks
    for kind in SECURITY_KINDS:
        revisions = {str(c.get("revision")) for c in components if c.get("kind") == kind}
        if revisions != {expected_auth.get(kind, "")} or not expected_auth.get(kind):
            return checks
    return [*checks, "auth-revision"]


# --- validation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationContext:
    instance_id: str
    endpoint_url: str  # the instance's own Service, never the pooled endpoint
    namespace: str  # the pool's own namespace (observer Secret)
    image: str  # blueprint coordinator image
    worker_image: str  # blueprint worker image ("" = same as image)
    ready_workers: int  # Kubernetes ready workers
    publication_revision: int  # the pool's checkpointed catalog revision
    registered_process_id: str  # bootId sent to RegisterMember
    pod_uid: str
    config_revision: str  # release id
    running_image: str = ""  # coordinator container image as Kubernetes reports it
    running_worker_images: tuple[str, ...] = ()  # worker container images, when known
    registered_node_id: str = ""  # as the Gateway recorded it ("" = not compared)
    registered_coordinator_id: str = ""


@dataclass(frozen=True)
class ValidationResult:
    done: bool
    receipt: dict[str, Any] | None = None
    node_id: str = ""
    coordinator_id: str = ""
    process_id: str = ""
    applied_revision: int | None = None
    error: str = ""  # "" while the pass is unfinished or when done
    fatal: bool = False  # True only for a restarted coordinator: fail the candidate
    requests: int = 0  # requests issued by this step
    stage: int = 0  # the stage the pass will resume at (0 when done or discarded)


@dataclass
class _Statement:
    next_uri: str = ""
    query_id: str = ""
    pages: int = 0
    size: int = 0
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)


@dataclass
class _Pass:
    key: ValidationContext
    started: float
    stage: int = 1
    node_id: str = ""
    coordinator_id: str = ""
    info_process_id: str = ""
    process_id: str = ""
    applied_revision: int = 0
    components: list[dict[str, Any]] = field(default_factory=list)
    statement: _Statement | None = None


class _Failed(Exception):
    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def _normal_image(ref: str) -> str:
    ref = ref.strip()
    for prefix in ("docker.io/", "library/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
    return ref


class Validator:
    """Per-term memory of validation passes, keyed by instance id (thread-safe).

    ``step(ctx)`` advances the instance's pass by at most two requests. The operator calls
    ``forget(instance_id)`` on any phase change of the instance and ``clear()`` at term end.
    """

    def __init__(
        self,
        *,
        pass_budget: float = PASS_BUDGET_SECONDS,
        request_budget: float = REQUEST_BUDGET_SECONDS,
        expected_auth: dict[str, str] | None = None,
        credentials: Callable[[str], Credential] = observer_credential,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pass_budget = pass_budget
        self._request_budget = request_budget
        self._expected_auth = dict(expected_auth or {})
        self._credentials = credentials
        self._clock = clock
        self._lock = threading.Lock()
        self._passes: dict[str, _Pass] = {}

    def forget(self, instance_id: str) -> None:
        with self._lock:
            self._passes.pop(instance_id, None)

    def clear(self) -> None:
        with self._lock:
            self._passes.clear()

    def retain(self, instance_ids: Sequence[str]) -> None:
        """Drop passes of instances no longer in the snapshot."""
        keep = set(instance_ids)
        with self._lock:
            for gone in set(self._passes) - keep:
                del self._passes[gone]

    def in_progress(self, instance_id: str) -> int:
        """The stage the instance's pass resumes at, or 0."""
        with self._lock:
            state = self._passes.get(instance_id)
        return state.stage if state else 0

    def _key(self, ctx: ValidationContext) -> ValidationContext:
        # Everything the verdict depends on except the publication watermark, which may move
        # forward during a pass (stage 3 compares against the value it sees then).
        return replace(ctx, publication_revision=0)

    def step(self, ctx: ValidationContext) -> ValidationResult:
        now = self._clock()
        with self._lock:
            state = self._passes.get(ctx.instance_id)
            if state is not None and (
                now - state.started > self._pass_budget or state.key != self._key(ctx)
            ):
                state = None
            if state is None:
                state = _Pass(key=self._key(ctx), started=now)
            self._passes[ctx.instance_id] = state
        requests = 0
        try:
            origin = origin_of(ctx.endpoint_url)
            credential: Credential | None = None
            while True:
                if state.stage == 1:
                    self._stage_image(ctx)
                    state.stage = 2
                    continue
                if state.stage == 6:
                    result = self._finish(ctx, state, requests)
                    self.forget(ctx.instance_id)
                    return result
                if requests >= REQUESTS_PER_STEP:
                    return ValidationResult(done=False, requests=requests, stage=state.stage)
                left = self._pass_budget - (self._clock() - state.started)
                if left <= 0:
                    raise _Failed("the validation pass exceeded its budget; a new pass starts")
                if credential is None:
                    credential = self._credentials(ctx.namespace)
                budget = min(self._request_budget, left)
                requests += 1
                if state.stage == 2:
                    self._stage_info(origin, credential, budget, ctx, state)
                elif state.stage == 3:
                    self._stage_sync(origin, credential, budget, ctx, state)
                elif state.stage == 4:
                    self._stage_nodes(origin, credential, budget, ctx, state)
                elif state.stage == 5:
                    self._stage_info_again(origin, credential, budget, state)
        except (ProbeError, _Failed) as exc:
            self.forget(ctx.instance_id)
            fatal = isinstance(exc, _Failed) and exc.fatal
            message = str(exc)
            _log.debug(  # the operator's wait log reports it, rate-limited
                "Trino candidate validation pass failed.",
                extra={"instance": ctx.instance_id, "reason": message, "fatal": fatal},
            )
            return ValidationResult(done=False, error=message, fatal=fatal, requests=requests)

    # (1) running coordinator image == blueprint image (and worker image if reported)
    def _stage_image(self, ctx: ValidationContext) -> None:
        if not ctx.running_image:
            raise _Failed("image check: the running coordinator image is not known")
        if _normal_image(ctx.running_image) != _normal_image(ctx.image):
            raise _Failed(
                f"image check: the coordinator runs {_clip(ctx.running_image)!r}, "
                f"the blueprint pins {_clip(ctx.image)!r}"
            )
        want = ctx.worker_image or ctx.image
        for running in ctx.running_worker_images:
            if _normal_image(running) != _normal_image(want):
                raise _Failed(
                    f"image check: a worker runs {_clip(running)!r}, the blueprint pins "
                    f"{_clip(want)!r}"
                )

    def _info(self, origin: Origin, credential: Credential, budget: float) -> tuple[str, str, str]:
        doc, _ = probe(origin, credential, origin.url("/v1/info"), budget=budget)
        if doc.get("coordinator") is not True:
            raise _Failed("/v1/info: the node is not a coordinator")
        if doc.get("starting") is not False:
            raise _Failed("/v1/info: the coordinator is still starting")
        node_id = _text(doc, "nodeId")
        coordinator_id = _text(doc, "coordinatorId")
        if not node_id:
            raise _Failed("/v1/info: no nodeId")
        if not COORDINATOR_ID.match(coordinator_id):
            raise _Failed("/v1/info: coordinatorId is not exactly 5 alphanumerics")
        return node_id, coordinator_id, _text(doc, "processId")

    # (2) /v1/info identity
    def _stage_info(
        self,
        origin: Origin,
        credential: Credential,
        budget: float,
        ctx: ValidationContext,
        state: _Pass,
    ) -> None:
        node_id, coordinator_id, process_id = self._info(origin, credential, budget)
        if ctx.registered_node_id and node_id != ctx.registered_node_id:
            raise _Failed(RESTARTED + " (nodeId differs from the registered member)", fatal=True)
        if ctx.registered_coordinator_id and coordinator_id != ctx.registered_coordinator_id:
            raise _Failed(
                RESTARTED + " (coordinatorId differs from the registered member)", fatal=True
            )
        if process_id and process_id != ctx.registered_process_id:
            raise _Failed(RESTARTED, fatal=True)
        state.node_id, state.coordinator_id, state.info_process_id = (
            node_id,
            coordinator_id,
            process_id,
        )
        state.stage = 3

    # (3) /v1/catalog/sync
    def _stage_sync(
        self,
        origin: Origin,
        credential: Credential,
        budget: float,
        ctx: ValidationContext,
        state: _Pass,
    ) -> None:
        doc, _ = probe(origin, credential, origin.url("/v1/catalog/sync"), budget=budget)
        process_id = _text(doc, "processId")
        if not process_id:
            raise _Failed("/v1/catalog/sync: no processId")
        if process_id != ctx.registered_process_id:
            raise _Failed(RESTARTED, fatal=True)
        if _text(doc, "nodeId") != state.node_id or (
            _text(doc, "coordinatorId") != state.coordinator_id
        ):
            raise _Failed(RESTARTED + " (catalog sync reports another identity)", fatal=True)
        if doc.get("enabled") is not True:
            raise _Failed("/v1/catalog/sync: catalog sync is not enabled")
        if doc.get("ready") is not True:
            raise _Failed("/v1/catalog/sync: catalog sync is not ready")
        failed = doc.get("failedCatalogs")
        failed_count = len(failed) if isinstance(failed, list) else failed
        if type(failed_count) is not int or failed_count != 0:
            raise _Failed("/v1/catalog/sync: failedCatalogs is not 0")
        applied = doc.get("appliedRevision")
        if type(applied) is not int:
            raise _Failed("/v1/catalog/sync: appliedRevision is missing")
        if applied < ctx.publication_revision:
            raise _Failed(
                f"/v1/catalog/sync: appliedRevision {applied} is behind the pool's "
                f"publication revision {ctx.publication_revision}"
            )
        components = doc.get("securityRevisions") or []
        if not isinstance(components, list) or not all(isinstance(c, dict) for c in components):
            raise _Failed("/v1/catalog/sync: securityRevisions is not a list of objects")
        state.process_id = process_id
        state.applied_revision = applied
        state.components = [
            {k: str(c.get(k) or "") for k in ("kind", "name", "revision", "error")}
            for c in components
        ]
        state.stage = 4

    # (4) SELECT node_id, coordinator, state FROM system.runtime.nodes — one page per request
    def _stage_nodes(
        self,
        origin: Origin,
        credential: Credential,
        budget: float,
        ctx: ValidationContext,
        state: _Pass,
    ) -> None:
        stmt = state.statement
        if stmt is None:
            stmt = state.statement = _Statement()
            doc, size = probe(
                origin,
                credential,
                origin.url("/v1/statement"),
                method="POST",
                body=NODES_SQL,
                budget=budget,
            )
        else:
            doc, size = probe(origin, credential, stmt.next_uri, continuation=True, budget=budget)
        stmt.pages += 1
        stmt.size += size
        if stmt.pages > MAX_STATEMENT_PAGES:
            raise _Failed(f"statement: more than {MAX_STATEMENT_PAGES} pages")
        if stmt.size > MAX_STATEMENT_BYTES:
            raise _Failed(f"statement: more than {MAX_STATEMENT_BYTES} bytes")
        query_id = _text(doc, "id")
        if not query_id or (stmt.query_id and query_id != stmt.query_id):
            raise _Failed("statement: missing or changing query id")
        stmt.query_id = query_id
        if not query_id.endswith("_" + state.coordinator_id):
            raise _Failed(RESTARTED + " (the query ran on another coordinator id)", fatal=True)
        columns = doc.get("columns")
        if isinstance(columns, list) and columns and not stmt.columns:
            stmt.columns = [str(c.get("name")) if isinstance(c, dict) else "" for c in columns]
        data = doc.get("data")
        if data is not None:
            if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
                raise _Failed("statement: data is not a list of rows")
            stmt.rows.extend(data)
            if len(stmt.rows) > MAX_STATEMENT_ROWS:
                raise _Failed(f"statement: more than {MAX_STATEMENT_ROWS} rows")
        next_uri = doc.get("nextUri")
        if next_uri is not None:
            if not isinstance(next_uri, str):
                raise _Failed("statement: nextUri is not a string")
            check_target(origin, next_uri, continuation=True)  # refuse before the next step
            stmt.next_uri = next_uri
            return
        self._check_nodes(ctx, state, stmt)
        state.stage = 5

    def _check_nodes(self, ctx: ValidationContext, state: _Pass, stmt: _Statement) -> None:
        try:
            i_node = stmt.columns.index("node_id")
            i_coord = stmt.columns.index("coordinator")
            i_state = stmt.columns.index("state")
        except ValueError:
            raise _Failed("statement: the nodes answer lacks its columns") from None
        coordinators: list[str] = []
        workers = 0
        for row in stmt.rows:
            if len(row) != len(stmt.columns):
                raise _Failed("statement: a row does not match the columns")
            if row[i_state] != "active":
                raise _Failed("workers check: a node is not active")
            if row[i_coord] is True:
                coordinators.append(str(row[i_node]))
            elif row[i_coord] is False:
                workers += 1
            else:
                raise _Failed("statement: coordinator is not a boolean")
        if coordinators != [state.node_id]:
            raise _Failed("workers check: not exactly one coordinator equal to the info node id")
        if ctx.ready_workers <= 0 or workers != ctx.ready_workers:
            raise _Failed(
                f"workers check: Trino reports {workers} active workers, Kubernetes "
                f"{ctx.ready_workers} ready"
            )

    # (5) /v1/info again unchanged
    def _stage_info_again(
        self, origin: Origin, credential: Credential, budget: float, state: _Pass
    ) -> None:
        node_id, coordinator_id, process_id = self._info(origin, credential, budget)
        if (node_id, coordinator_id, process_id) != (
            state.node_id,
            state.coordinator_id,
            state.info_process_id,
        ):
            raise _Failed(RESTARTED + " (/v1/info identity changed mid-validation)", fatal=True)
        state.stage = 6

    # (6) claimed checks, (7) receipt
    def _finish(self, ctx: ValidationContext, state: _Pass, requests: int) -> ValidationResult:
        checks = claimed_checks(state.components, self._expected_auth)
        fingerprint = auth_fingerprint(state.components)
        receipt: dict[str, Any] = {
            "certificateHash": certificate_hash(
                node_id=state.node_id,
                process_id=state.process_id,
                coordinator_id=state.coordinator_id,
                applied_revision=state.applied_revision,
                auth_fingerprint=fingerprint,
                ready_workers=ctx.ready_workers,
                checks=checks,
            ),
            "configRevision": ctx.config_revision,
            "authRevision": "",
            "podUid": ctx.pod_uid,
            "bootId": state.process_id,
            "nodeId": state.node_id,
            "coordinatorId": state.coordinator_id,
            "readyWorkers": ctx.ready_workers,
            "checks": checks,
        }
        return ValidationResult(
            done=True,
            receipt=receipt,
            node_id=state.node_id,
            coordinator_id=state.coordinator_id,
            process_id=state.process_id,
            applied_revision=state.applied_revision,
            requests=requests,
        )
