"""A stand-in Trino coordinator (spec trino-pools §8 preamble): ``/v1/info``, ``/v1/catalog/sync``
and ``/v1/statement`` with continuation pages, answers set per test.

It records every request (method, path, headers, the Basic credential) and can delay every
answer, restart (new ``processId`` and ``coordinatorId``), enforce one credential (401 for any
other) and inject one fault per path: a redirect, 401, bad JSON, a SQL error, an oversize body or
a foreign ``nextUri``. Like Trino with ``http-server.process-forwarded``, a request carrying
``X-Forwarded-Proto: https`` gets continuation URIs reported as ``https://<host>/…`` (port 443).

Use ``coordinator.host_alias(instance_id, namespace, port)`` to make the instance's Service host
(``<instance>.<namespace>.svc.cluster.local``) reach this server through
``trino_pools.probes.CONNECT_OVERRIDES``; the alias is removed at teardown.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trino_pools import probes

FAULTS = ("redirect", "401", "bad-json", "sql-error", "oversize", "foreign-next", "500")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up early (oversize answer, timeout) is expected


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    credential: tuple[str, str] | None  # the Basic credential, decoded
    body: str


def _coordinator_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(5))


@dataclass
class CoordinatorDouble:
    node_id: str = "trino-a-coordinator-7d9f"
    coordinator_id: str = field(default_factory=_coordinator_id)
    process_id: str = field(default_factory=lambda: secrets.token_hex(8))
    applied_revision: int | None = 7
    failed_catalogs: int = 0
    sync_enabled: bool = True
    sync_ready: bool = True
    starting: bool = False
    is_coordinator: bool = True
    workers: int = 2
    worker_state: str = "active"
    security_revisions: list[dict[str, str]] = field(default_factory=list)
    rows_per_page: int = 2  # statement rows per page (one extra queued page comes first)
    delay: float = 0.0  # seconds before every answer
    expected_credential: tuple[str, str] | None = None  # 401 for any other credential
    honor_forwarded: bool = True
    foreign_next_uri: str = ""  # for the "foreign-next" fault

    def __post_init__(self) -> None:
        self.requests: list[Recorded] = []
        self.faults: dict[str, str] = {}  # path prefix -> fault kind (applied once)
        self.aliases: list[str] = []
        self._lock = threading.Lock()
        self._queries: dict[str, list[dict[str, Any]]] = {}  # query id -> remaining pages
        self._query_seq = 0
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                double._handle(self, "GET")

            def do_POST(self) -> None:
                double._handle(self, "POST")

            def do_DELETE(self) -> None:
                double._handle(self, "DELETE")

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    # --- control -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def restart(self) -> None:
        """A coordinator restart: new process id and coordinator id, open queries lost."""
        with self._lock:
            self.process_id = secrets.token_hex(8)
            self.coordinator_id = _coordinator_id()
            self._queries.clear()

    def fail(self, path_prefix: str, kind: str) -> None:
        """Answer the next request whose path starts with ``path_prefix`` with ``kind``."""
        assert kind in FAULTS, kind
        self.faults[path_prefix] = kind

    def host_alias(self, instance_id: str, namespace: str, port: int = 8080) -> str:
        """Route ``<instance>.<namespace>.svc.cluster.local`` here; returns the endpoint URL."""
        host = f"{instance_id}.{namespace}.svc.cluster.local"
        probes.CONNECT_OVERRIDES[host] = ("127.0.0.1", self.port)
        self.aliases.append(host)
        return f"http://{host}:{port}"

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def credentials(self) -> set[tuple[str, str] | None]:
        return {r.credential for r in self.requests}

    def close(self) -> None:
        for host in self.aliases:
            probes.CONNECT_OVERRIDES.pop(host, None)
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> CoordinatorDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- serving -------------------------------------------------------------------------
    def nodes(self) -> list[list[Any]]:
        rows: list[list[Any]] = [[self.node_id, True, "active"]]
        rows += [[f"worker-{i}", False, self.worker_state] for i in range(self.workers)]
        return rows

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode() if length else ""
        headers = {k.lower(): v for k, v in handler.headers.items()}
        credential = None
        auth = headers.get("authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            credential = (user, password)
        path = handler.path
        self.requests.append(Recorded(method, path, headers, credential, body))
        if self.delay:
            time.sleep(self.delay)
        fault = next((k for p, k in self.faults.items() if path.startswith(p)), None)
        if fault is not None:
            self.faults = {p: k for p, k in self.faults.items() if not path.startswith(p)}
        if self.expected_credential is not None and credential != self.expected_credential:
            fault = "401"
        try:
            status, payload, extra = self._answer(method, path, body, headers, fault)
        except Exception as exc:  # a bug in the double: make it visible
            status, payload, extra = 500, repr(exc).encode(), {}
        try:
            handler.send_response(status)
            for key, value in extra.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(payload)))
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client gave up (oversize or timeout)

    def _base(self, headers: dict[str, str]) -> str:
        host = headers.get("host", f"127.0.0.1:{self.port}")
        if self.honor_forwarded and headers.get("x-forwarded-proto") == "https":
            return "https://" + host.rsplit(":", 1)[0]  # reported as https, port 443
        return "http://" + host

    def _answer(
        self, method: str, path: str, body: str, headers: dict[str, str], fault: str | None
    ) -> tuple[int, bytes, dict[str, str]]:
        if fault == "redirect":
            target = self.foreign_next_uri or "http://elsewhere.example.com/v1/info"
            return 302, b'{"secret":"body"}', {"Location": target}
        if fault == "401":
            return 401, b'{"message":"unauthorized body text"}', {}
        if fault == "500":
            return 500, b'{"message":"internal body text"}', {}
        if fault == "bad-json":
            return 200, b"{not json", {}
        if fault == "oversize":
            return 200, b'{"pad":"' + b"x" * (1024 * 1024 + 10) + b'"}', {}
        if fault == "sql-error":
            doc = {
                "id": f"20261130_000000_00000_{self.coordinator_id}",
                "error": {"errorName": "PERMISSION_DENIED", "message": "Access Denied: body"},
            }
            return 200, json.dumps(doc).encode(), {}
        if method == "GET" and path == "/v1/info":
            info = {
                "nodeId": self.node_id,
                "coordinatorId": self.coordinator_id,
                "coordinator": self.is_coordinator,
                "starting": self.starting,
                "environment": "test",
                "nodeVersion": {"version": "476"},
            }
            return 200, json.dumps(info).encode(), {}
        if method == "GET" and path == "/v1/catalog/sync":
            sync = {
                "enabled": self.sync_enabled,
                "ready": self.sync_ready,
                "failedCatalogs": self.failed_catalogs,
                "appliedRevision": self.applied_revision,
                "nodeId": self.node_id,
                "coordinatorId": self.coordinator_id,
                "processId": self.process_id,
                "securityRevisions": self.security_revisions,
            }
            return 200, json.dumps(sync).encode(), {}
        if method == "POST" and path == "/v1/statement":
            return self._start_query(body, headers, fault)
        if method == "GET" and path.startswith("/v1/statement/"):
            return self._next_page(path, headers, fault)
        return 404, b'{"message":"not found"}', {}

    def _start_query(
        self, sql: str, headers: dict[str, str], fault: str | None
    ) -> tuple[int, bytes, dict[str, str]]:
        with self._lock:
            self._query_seq += 1
            query_id = f"20261130_121212_{self._query_seq:05d}_{self.coordinator_id}"
            rows = self.nodes() if "system.runtime.nodes" in sql else []
            columns = [
                {"name": "node_id", "type": "varchar"},
                {"name": "coordinator", "type": "boolean"},
                {"name": "state", "type": "varchar"},
            ]
            pages: list[dict[str, Any]] = []
            chunks = [
                rows[i : i + self.rows_per_page] for i in range(0, len(rows), self.rows_per_page)
            ] or [[]]
            for chunk in chunks:
                pages.append({"id": query_id, "columns": columns, "data": chunk})
            self._queries[query_id] = pages
        first = {"id": query_id, "stats": {"state": "QUEUED"}}
        first["nextUri"] = self._next_uri(query_id, 0, headers, fault)
        return 200, json.dumps(first).encode(), {}

    def _next_uri(
        self, query_id: str, token: int, headers: dict[str, str], fault: str | None
    ) -> str:
        if fault == "foreign-next":
            return self.foreign_next_uri
        return f"{self._base(headers)}/v1/statement/executing/{query_id}/y{token}/{token + 1}"

    def _next_page(
        self, path: str, headers: dict[str, str], fault: str | None
    ) -> tuple[int, bytes, dict[str, str]]:
        parts = path.split("/")
        if len(parts) < 7:
            return 404, b'{"message":"no such page"}', {}
        query_id, token = parts[4], int(parts[6])
        with self._lock:
            pages = self._queries.get(query_id)
            if pages is None:
                return 404, b'{"message":"query gone"}', {}
            page = dict(pages[token - 1])
            last = token >= len(pages)
        if not last or fault == "foreign-next":
            page["nextUri"] = self._next_uri(query_id, token, headers, fault)
        return 200, json.dumps(page).encode(), {}


@pytest.fixture
def coordinator() -> Iterator[CoordinatorDouble]:
    double = CoordinatorDouble()
    try:
        yield double
    finally:
        double.close()
