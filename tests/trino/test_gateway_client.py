"""GatewayClient transport rules (spec trino-pools §4.8, docs/gateway-protocol.md §1-§2).

Real HTTP(S) servers on 127.0.0.1: the test Gateway and tiny scripted servers for answers the
Gateway would never give (redirects, broken bodies, oversize bodies, echoed tokens).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.lib import gateway as gw
from duckgres_admin.lib.gateway import (
    GatewayClient,
    GatewayError,
    GatewayRefused,
    GatewayUnavailable,
    GatewayUsageError,
    UnknownOutcome,
)
from tests.trino.gateway_double import GatewayDouble, gateway  # noqa: F401

TOKEN = "tok-" + "s3cr3t" * 8

Answer = tuple[int, dict[str, str], bytes]


class Scripted:
    """A tiny HTTP server answering every request with ``answer(method, path)``."""

    def __init__(self, answer: Callable[[str, str], Answer], tls: ssl.SSLContext | None = None):
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.seen.append((self.command, self.path, dict(self.headers.items())))
                status, headers, body = answer(self.command, self.path)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    started: list[Scripted] = []

    def start(answer: Callable[[str, str], Answer], tls: ssl.SSLContext | None = None) -> Scripted:
        server = Scripted(answer, tls)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def http_client(url: str, **kw: Any) -> GatewayClient:
    return GatewayClient(url, TOKEN, allow_http=True, **kw)


def assert_secret_free(error: BaseException, token: str = TOKEN) -> None:
    for text in (str(error), repr(error), *map(str, error.args)):
        assert token not in text
    assert token not in str(getattr(error, "message", ""))


def fail(fn: Callable[..., Any], kind: type[GatewayError], *args: Any, **kw: Any) -> Any:
    with pytest.raises(kind) as info:
        fn(*args, **kw)
    assert_secret_free(info.value)
    return info.value


# -- scheme, URL, path ---------------------------------------------------------------------------


def test_plain_http_is_refused_without_allow_http():
    for url in ("http://gateway.example.com", "ftp://gateway.example.com"):
        with pytest.raises(GatewayUsageError, match="must use https"):
            GatewayClient(url, TOKEN)
    with pytest.raises(GatewayUsageError, match="must use https"):
        GatewayClient("ftp://gateway.example.com", TOKEN, allow_http=True)
    for bad in (
        "https://u:p@gw.example.com",
        "https://gw.example.com/x",
        "https://gw.example.com?a",
    ):
        with pytest.raises(GatewayUsageError):
            GatewayClient(bad, TOKEN)
    assert TOKEN not in repr(GatewayClient("https://gw.example.com", TOKEN))


def test_pool_path_escapes_every_segment():
    assert GatewayClient.pool_path("rg-a") == "/gateway/v1/pools/rg-a"
    assert (
        GatewayClient.pool_path("rg a/b", "operations", "instance:cell-1a2b3c4d")
        == "/gateway/v1/pools/rg%20a%2Fb/operations/instance%3Acell-1a2b3c4d"
    )
    with pytest.raises(GatewayUsageError):
        GatewayClient.pool_path("rg-a", "")


def test_both_auth_headers_on_every_request(gateway):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    client.get(GatewayClient.BACKEND_ALL)
    client.send("POST", GatewayClient.BACKEND_DELETE, "x", content_type="text/plain")
    for _, _, headers, _ in gateway.requests:
        assert headers["authorization"] == f"Bearer {gateway.token}"
        assert headers["x-gateway-transaction-admin-token"] == gateway.token


def test_an_oversize_request_body_is_refused_before_sending(gateway):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    body = json.dumps({"x": "a" * (1024 * 1024)})
    fail(client.send, GatewayUsageError, "POST", GatewayClient.BACKEND_ADD, body)
    assert gateway.requests == []


# -- answers -------------------------------------------------------------------------------------


def test_a_redirect_is_refused_and_the_token_never_reaches_its_target(scripted):
    target = scripted(lambda m, p: (200, {"Content-Type": "application/json"}, b"[]"))
    location = {"Location": f"{target.url}/gateway/backend/all"}
    for status in (301, 302, 303, 307, 308):
        redirector = scripted(lambda m, p, s=status: (s, location, b""))
        client = http_client(redirector.url)
        error = fail(client.get, GatewayRefused, GatewayClient.BACKEND_ALL)
        assert (error.code, error.status) == ("", status)
        assert "redirect" in error.message
        fail(client.send, GatewayRefused, "POST", GatewayClient.BACKEND_ADD, "{}")
        assert len(redirector.seen) == 2
    assert target.seen == []


def test_5xx_and_429_without_a_code_are_unavailable(gateway, scripted):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    gateway.fail_next("GET", r"/backend/all", unavailable=True)
    assert fail(client.get, GatewayUnavailable, GatewayClient.BACKEND_ALL).status == 503
    for status in (500, 502, 429):
        server = scripted(lambda m, p, s=status: (s, {}, b'{"message":"busy"}'))
        error = fail(http_client(server.url).get, GatewayUnavailable, GatewayClient.BACKEND_ALL)
        assert error.status == status
        assert "busy" in str(error)


def test_codes_are_read_from_the_header_only(gateway, scripted):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    gateway.fail_next("POST", r".", refuse="POOL_SOMETHING_NEW", status=409)
    error = fail(client.send, GatewayRefused, "POST", GatewayClient.BACKEND_ADD, "{}")
    assert (error.code, error.status) == ("UNKNOWN", 409)
    gateway.fail_next("POST", r".", refuse="POOL_SOMETHING_NEW", status=503)
    fail(client.send, GatewayUnavailable, "POST", GatewayClient.BACKEND_ADD, "{}")
    body_only = scripted(lambda m, p: (409, {}, b'{"code":"POOL_STALE_EPOCH","message":"m"}'))
    error = fail(http_client(body_only.url).get, GatewayRefused, GatewayClient.BACKEND_ALL)
    assert (error.code, error.status) == ("", 409)
    known_5xx = scripted(
        lambda m, p: (503, {"X-Trino-Gateway-Error": "ROUTING_STATE_UNAVAILABLE"}, b"")
    )
    error = fail(http_client(known_5xx.url).get, GatewayRefused, GatewayClient.BACKEND_ALL)
    assert (error.code, error.status) == ("ROUTING_STATE_UNAVAILABLE", 503)


def test_a_token_echoed_by_the_gateway_is_scrubbed(scripted):
    echo = json.dumps({"code": "POOL_VALIDATION", "message": f"bad token {TOKEN}"}).encode()
    server = scripted(lambda m, p: (400, {"X-Trino-Gateway-Error": "POOL_VALIDATION"}, echo))
    error = fail(http_client(server.url).get, GatewayRefused, GatewayClient.BACKEND_ALL)
    assert "bad token ***" in error.message


def test_a_malformed_or_oversize_success_body_is_an_unknown_outcome(scripted):
    for body in (b"{not json", b"\xff\xfe", b"x" * (1024 * 1024 + 1)):
        server = scripted(lambda m, p, b=body: (200, {"Content-Type": "application/json"}, b))
        fail(http_client(server.url).get, UnknownOutcome, GatewayClient.BACKEND_ALL)
    accepted = scripted(lambda m, p: (202, {}, b"{}"))
    fail(http_client(accepted.url).get, UnknownOutcome, GatewayClient.BACKEND_ALL)
    empty = scripted(lambda m, p: (200, {}, b""))
    assert http_client(empty.url).get(GatewayClient.BACKEND_ALL) is None


# -- transport -----------------------------------------------------------------------------------


def test_a_closed_port_is_an_unknown_outcome():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = fail(
        http_client(f"http://127.0.0.1:{port}").get, UnknownOutcome, "/gateway/backend/all"
    )
    assert "no answer" in str(error)


def test_a_dropped_response_is_an_unknown_outcome_after_the_effect(gateway):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    record = {"name": "b", "proxyTo": "http://b", "active": False, "routingGroup": "rg-a"}
    gateway.fail_next("POST", r"/modify/add$", drop_response=True)
    fail(client.send, UnknownOutcome, "POST", GatewayClient.BACKEND_ADD, json.dumps(record))
    assert gateway.backend("b") == record


def test_a_slow_answer_times_out_as_an_unknown_outcome(gateway):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True, header_timeout=0.3)
    gateway.fail_next("GET", r".", delay=1.0)
    fail(client.get, UnknownOutcome, GatewayClient.BACKEND_ALL)


@pytest.fixture
def dribbler() -> Iterator[Callable[[bytes, bytes], int]]:
    """A raw server sending ``head`` at once, then ``tail`` one byte every 0.2 s."""
    listeners: list[socket.socket] = []
    stop = threading.Event()

    def start(head: bytes, tail: bytes) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listeners.append(listener)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(head)
                for byte in tail:
                    if stop.wait(0.2):
                        return
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        return

        threading.Thread(target=serve, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    stop.set()
    for listener in listeners:
        listener.close()


def test_slow_headers_and_slow_bodies_hit_hard_deadlines(dribbler):
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n"
    port = dribbler(b"", headers)
    client = http_client(f"http://127.0.0.1:{port}", header_timeout=0.5, timeout=5.0)
    started = time.monotonic()
    error = fail(client.get, UnknownOutcome, GatewayClient.BACKEND_ALL)
    assert time.monotonic() - started < 2.0
    assert "header timeout" in str(error)
    port = dribbler(headers, b"[" + b" " * 38 + b"]")
    client = http_client(f"http://127.0.0.1:{port}", header_timeout=0.5, timeout=1.0)
    started = time.monotonic()
    error = fail(client.get, UnknownOutcome, GatewayClient.BACKEND_ALL)
    assert time.monotonic() - started < 2.5
    assert "budget" in str(error)


def test_every_error_is_free_of_the_token(gateway):  # noqa: F811
    client = GatewayClient(gateway.url, gateway.token, allow_http=True)
    errors: list[BaseException] = []
    for kwargs, path in (
        ({"refuse": "POOL_PHASE"}, r"."),
        ({"unavailable": True}, r"."),
        ({"drop_response": True}, r"."),
    ):
        gateway.fail_next("GET", path, **kwargs)
        with pytest.raises(GatewayError) as info:
            client.get(GatewayClient.BACKEND_ALL)
        errors.append(info.value)
    with pytest.raises(GatewayError) as info:
        client.send("POST", GatewayClient.BACKEND_ADD, "x" * (2 * 1024 * 1024))
    errors.append(info.value)
    assert {type(e) for e in errors} == {
        GatewayRefused,
        GatewayUnavailable,
        UnknownOutcome,
        GatewayUsageError,
    }
    for error in errors:
        assert_secret_free(error, gateway.token)
    assert gateway.token not in repr(client)


# -- TLS -----------------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def tls_pair(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA and a server certificate for ``gateway.test`` (not for 127.0.0.1)."""
    ca_key, ca = tmp_path / "ca.key", tmp_path / "ca.pem"
    key, csr, cert = tmp_path / "srv.key", tmp_path / "srv.csr", tmp_path / "srv.pem"
    ext = tmp_path / "ext.cnf"
    ext.write_text("subjectAltName=DNS:gateway.test\n")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=gateway.test",
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "1",
        "-extfile",
        str(ext),
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ca, ctx


def test_tls_pins_the_server_name(tls_pair, scripted, monkeypatch):
    ca, server_ctx = tls_pair
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    server = scripted(lambda m, p: (200, {"Content-Type": "application/json"}, b"[]"), server_ctx)
    url = f"https://127.0.0.1:{server.port}"
    pinned = GatewayClient(url, TOKEN, server_name="gateway.test")
    assert pinned.get(GatewayClient.BACKEND_ALL) == []
    fail(GatewayClient(url, TOKEN).get, UnknownOutcome, GatewayClient.BACKEND_ALL)
    fail(
        GatewayClient(url, TOKEN, server_name="other.test").get,
        UnknownOutcome,
        "/gateway/backend/all",
    )
    assert len(server.seen) == 1


def test_tls_below_1_2_is_refused(tls_pair, scripted, monkeypatch):
    ca, server_ctx = tls_pair
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            server_ctx.minimum_version = ssl.TLSVersion.TLSv1
            server_ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot offer TLS 1.1 at all")
    server = scripted(lambda m, p: (200, {}, b"[]"), server_ctx)
    client = GatewayClient(f"https://127.0.0.1:{server.port}", TOKEN, server_name="gateway.test")
    fail(client.get, UnknownOutcome, GatewayClient.BACKEND_ALL)
    assert server.seen == []


def test_parsers_reject_bodies_without_the_protocol_shape():
    with pytest.raises(gw.GatewayProtocolError):
        gw.parse_member({"memberId": "x"})
    with pytest.raises(gw.GatewayProtocolError):
        gw.parse_backends({"name": "x"})
    with pytest.raises(gw.GatewayProtocolError):
        gw.parse_operation(
            {"operationId": "x", "steps": [{"stepId": "a", "payloadHash": "h", "outcome": "MAYBE"}]}
        )
    with pytest.raises(gw.GatewayProtocolError):
        gw.parse_pool({"pool": "rg-a", "minServing": True})
