"""The one strict HTTP transport of the project (design §2), used by the ``duckgres`` client and,
through ``duckgres_admin.lib.http``, by the control plane: ``request`` over ``http.client``
(the CLI's API calls, probes, spec trino-pools §4.12) and ``get``, the same request with the
method fixed (the runner's password pull: a redirect or a proxy variable must never send the
runner secret elsewhere) and ``post`` (the signed webhook delivery).

Non-2xx answers are returned, not raised, so callers decide what is final. Transport problems
(refused, timeout, TLS) raise :class:`HttpTransportError` with the cause only. Bodies are read up
to ``max_bytes``; a longer body is reported as truncated.

``request`` invariants:

- redirects are never followed: a 3xx is returned as a response like any other status;
- no proxy is ever used (``http.client`` reads no proxy environment);
- HTTPS requires TLS >= 1.2 and verifies the certificate against ``server_name`` when given
  (the pin), else against the URL's host;
- ``connect_to=(address, port)`` opens the TCP connection there while the ``Host`` header, the
  TLS server name and everything else still come from the URL (like ``curl --connect-to``);
- ``timeout`` is the whole request's budget (connect, send, headers and body);
- at most :data:`MAX_CONNECTIONS_PER_HOST` requests run at once per URL host and port; a caller
  that cannot get a slot within its budget fails with a transport error.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_CONNECTIONS_PER_HOST = 4


class HttpTransportError(OSError):
    """The request did not produce an HTTP answer (connection refused, timeout, TLS…)."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = field(repr=False)
    truncated: bool = False
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # lower-case names


def get(
    url: str, *, headers: Mapping[str, str], timeout: float, max_bytes: int = 1024 * 1024
) -> HttpResponse:
    """``GET url`` through :func:`request`: the same rules (no redirect is ever followed, no
    proxy variable is honoured, ``timeout`` bounds the whole request); returns the status and at
    most ``max_bytes`` of the body."""
    return request("GET", url, headers=headers, body=None, timeout=timeout, max_bytes=max_bytes)


def post(
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes,
    timeout: float,
    max_bytes: int = 64 * 1024,
) -> HttpResponse:
    """``POST url`` with ``body`` through :func:`request`: the same rules (no redirect is ever
    followed, no proxy variable is honoured, ``timeout`` bounds the whole request); returns the
    status and at most ``max_bytes`` of the answer (the webhook delivery,
    docs/notifications.md)."""
    return request("POST", url, headers=headers, body=body, timeout=timeout, max_bytes=max_bytes)


_slots_lock = threading.Lock()
_slots: dict[tuple[str, int], threading.BoundedSemaphore] = {}


def _slot(host: str, port: int) -> threading.BoundedSemaphore:
    with _slots_lock:
        sem = _slots.get((host, port))
        if sem is None:
            sem = _slots[(host, port)] = threading.BoundedSemaphore(MAX_CONNECTIONS_PER_HOST)
        return sem


class _Connection(http.client.HTTPConnection):
    """Plain HTTP to ``address`` with the URL's host in the ``Host`` header."""

    def __init__(self, host: str, port: int, *, address: tuple[str, int], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection(self._address, self.timeout)


class _TlsConnection(_Connection):
    """HTTPS to ``address``; TLS >= 1.2, certificate checked against ``server_name``."""

    default_port = 443

    def __init__(
        self,
        host: str,
        port: int,
        *,
        address: tuple[str, int],
        timeout: float,
        context: ssl.SSLContext,
        server_name: str,
    ) -> None:
        super().__init__(host, port, address=address, timeout=timeout)
        self._context = context
        self._server_name = server_name

    def connect(self) -> None:
        raw = socket.create_connection(self._address, self.timeout)
        try:
            self.sock = self._context.wrap_socket(raw, server_hostname=self._server_name)
        except BaseException:
            raw.close()
            raise


def tls_context(cafile: str | None = None) -> ssl.SSLContext:
    """A verifying client context that refuses anything older than TLS 1.2."""
    context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: float,
    max_bytes: int = 1024 * 1024,
    connect_to: tuple[str, int] | None = None,
    server_name: str = "",
    context: ssl.SSLContext | None = None,
) -> HttpResponse:
    """One request, never following redirects; see the module docstring for the rules."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpTransportError("only absolute http:// and https:// URLs are allowed")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise HttpTransportError("the URL has an invalid port") from None
    host = parts.hostname
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    deadline = time.monotonic() + timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request budget exhausted")
        return left

    slot = _slot(host.lower(), port)
    if not slot.acquire(timeout=max(timeout, 0.0)):
        raise HttpTransportError(f"more than {MAX_CONNECTIONS_PER_HOST} connections to {host}")
    try:
        address = connect_to or (host, port)
        conn: _Connection
        if parts.scheme == "https":
            conn = _TlsConnection(
                host,
                port,
                address=address,
                timeout=remaining(),
                context=context or tls_context(),
                server_name=server_name or host,
            )
        else:
            conn = _Connection(host, port, address=address, timeout=remaining())
        try:
            conn.request(method, target, body=body, headers=dict(headers))
            if conn.sock is not None:
                conn.sock.settimeout(remaining())
            response = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while size <= max_bytes:
                if conn.sock is not None:
                    conn.sock.settimeout(remaining())
                chunk = response.read1(min(65536, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
            reply_headers = {k.lower(): v for k, v in response.getheaders()}
            status = int(response.status)
        finally:
            conn.close()
    except (http.client.HTTPException, ssl.SSLError, TimeoutError, OSError) as exc:
        raise HttpTransportError(f"{type(exc).__name__}: {exc}") from None
    finally:
        slot.release()
    return HttpResponse(
        status=status,
        body=data[:max_bytes],
        truncated=len(data) > max_bytes,
        headers=reply_headers,
    )
