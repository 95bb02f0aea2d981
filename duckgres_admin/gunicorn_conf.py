"""The API's gunicorn settings as shipped (``gunicorn -c python:duckgres_admin.gunicorn_conf``).

ONE worker process per replica, threads for concurrency: the reshard password stash lives in
that process's memory (spec reshard §4.17), so a second worker process would answer a runner's
pull with 404 half of the time. With ``DUCKGRES_PASSWORD_PULL_PORT`` set the process listens on
that port too, on the main bind's host: the password route is served there and only there
(``duckgres_admin/api/pullport.py``), and the NetworkPolicy admits only runner pods to it.
The container image and ``k8s/api.yaml`` both start gunicorn with this module; change a value
here, not on a command line.

Logging (docs/logging.md): ``logconfig_dict`` sends gunicorn's error and access logs through
the project's JSON formatter, like every other record of the process: one scrubbed JSON line
each, on stderr (``accesslog``/``errorlog`` keep ``-``, but the handlers are those of
``logconfig_dict``). Building it loads the Django settings in the master, so a bad environment
stops gunicorn before it binds.

Slow clients (docs/configuration.md "Slow clients"). The stock ``gthread`` worker hands a
connection to one of its 16 threads as soon as its first byte arrives, and that thread then
reads the request line, headers and body with blocking reads and no deadline: 16 clients
trickling a header byte at a time hold every thread, and lease grants and password pulls
queue behind them forever. :class:`BufferedThreadWorker` keeps gthread's threads but never gives
one a request that has not arrived: the main loop (non-blocking, one poller) collects each
connection's request head and a body of known length up to ``DUCKGRES_API_MAX_BODY_BYTES``, and
only a complete request reaches a thread. A request that is not complete within
``REQUEST_ARRIVAL_SECONDS`` is dropped; at ``worker_connections`` the oldest incomplete
connection makes room for the new one. What still reads in a thread (a chunked body, one sent
after ``Expect: 100-continue``, one over the limit, pipelined leftovers) does so against a
deadline of ``REQUEST_ARRIVAL_SECONDS`` for the whole request, a response write gets
``RESPONSE_WRITE_SECONDS``, and the graceful close after a response lingers in the poller, not
in the main loop (gunicorn's own blocks the loop up to 2 s per silent client).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import selectors
import socket
import time
from collections import deque
from functools import partial
from typing import Any

from gunicorn.workers import gthread  # type: ignore[import-untyped]

from duckgres_admin.logs import gunicorn_logconfig_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")


def binds(main: str, pull_port: int) -> list[str]:
    """The main bind, plus the password-pull port on the main bind's host when it is set
    (``DUCKGRES_PASSWORD_PULL_PORT``; docs/configuration.md, safeguard reshard-79)."""
    out = [main]
    if pull_port:
        host = main.rsplit(":", 1)[0] if ":" in main else main
        out.append(f"{host}:{pull_port}")
    return out


def _pull_port() -> int:
    from django.conf import settings

    return int(settings.DUCKGRES_PASSWORD_PULL_PORT)


bind = binds(os.environ.get("DUCKGRES_HTTP_BIND", "0.0.0.0:8080"), _pull_port())
workers = 1
worker_class = "duckgres_admin.gunicorn_conf.BufferedThreadWorker"
threads = 16
# gthread's main loop checks in with the master at least once a second; a worker that has not
# for this long is wedged and is restarted. (This bounds no request: a slow request holds a
# thread, never the loop, and requests are bounded below.)
timeout = 30
# On SIGTERM, in-flight requests get this long before the process exits.
graceful_timeout = 30
# An idle kept-alive connection waits in the poller (no thread) this long for its next request.
keepalive = 5
# Our longest URL is far below 1 KiB; gunicorn's defaults (4094 / 100 / 8190) invite big heads.
limit_request_line = 4094
limit_request_fields = 50
limit_request_field_size = 8190
# Open connections per worker (threads + kept-alive + arriving); see BufferedThreadWorker.
worker_connections = 1000
accesslog = "-"
errorlog = "-"
logconfig_dict = gunicorn_logconfig_dict()

# No runtime control socket: nothing may change the worker count of a running API (the password
# stash needs exactly one worker), and the root filesystem may be read-only.
control_socket_disable = True

# --- slow clients -----------------------------------------------------------------------------
# A request's line, headers and (prebuffered) body must have arrived within this long of its
# first byte being awaited; a thread's own reads share the same deadline.
REQUEST_ARRIVAL_SECONDS = 10.0
# Writing one response (sendall / sendfile) may take this long.
RESPONSE_WRITE_SECONDS = 30.0
# The graceful close after a response: drain at most this long / this much, in the poller.
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 65536
# A request head larger than this is handed to a thread as is (the parser's limits answer it).
MAX_HEAD_BYTES = 64 * 1024
RECV_CHUNK = 65536

_log = logging.getLogger("gunicorn.error")
_CONTENT_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*([0-9]+)[ \t]*$", re.I | re.M)
_TRANSFER_ENCODING = re.compile(rb"^transfer-encoding[ \t]*:", re.I | re.M)
_EXPECT = re.compile(rb"^expect[ \t]*:", re.I | re.M)


class ClientTooSlowError(ConnectionResetError):
    """A client missed its deadline; gunicorn treats ``ECONNRESET`` as a quiet disconnect."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.ECONNRESET, f"client too slow: {what}")


class DeadlineSocket(socket.socket):
    """A client socket whose blocking reads share one deadline per request and whose writes are
    bounded: gthread calls ``setblocking(True)`` when a thread takes the connection up."""

    read_deadline: float | None = None

    @classmethod
    def adopt(cls, sock: socket.socket) -> DeadlineSocket:
        family, kind, proto = sock.family, sock.type, sock.proto
        return cls(family, kind, proto, fileno=sock.detach())

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.read_deadline = time.monotonic() + REQUEST_ARRIVAL_SECONDS
            self.settimeout(REQUEST_ARRIVAL_SECONDS)
        else:
            self.read_deadline = None
            super().setblocking(False)

    def _bound_read(self) -> None:
        timeout = self.gettimeout()
        if timeout == 0.0 or self.read_deadline is None:
            return  # non-blocking (the main loop), or not taken up by a thread
        left = self.read_deadline - time.monotonic()
        if left <= 0:
            raise ClientTooSlowError(f"request not received within {REQUEST_ARRIVAL_SECONDS:g} s")
        self.settimeout(left if timeout is None else min(timeout, left))

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._bound_read()
        try:
            return super().recv(bufsize, flags)
        except TimeoutError:
            raise ClientTooSlowError("request read timed out") from None

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._bound_read()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            raise ClientTooSlowError("request read timed out") from None

    def _bound_write(self) -> None:
        if self.gettimeout() != 0.0:
            self.settimeout(RESPONSE_WRITE_SECONDS)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._bound_write()
        try:
            super().sendall(data, flags)
        except TimeoutError:
            raise ClientTooSlowError("response not read in time") from None

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        self._bound_write()
        try:
            return super().sendfile(file, offset, count)
        except TimeoutError:
            raise ClientTooSlowError("response not read in time") from None


class BufferedConn(gthread.TConn):  # type: ignore[misc]
    """gthread's connection with the bytes collected by the main loop and a worker to linger
    in when it is closed gracefully."""

    def __init__(self, worker: BufferedThreadWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker
        self.arrived = bytearray()
        self.arrival_deadline = 0.0
        self.buffered = False

    def close(self, graceful: bool = False) -> None:
        if graceful:
            self.worker.linger(self)
        else:
            super().close()


def request_complete(data: bytes | bytearray, max_body: int) -> bool:
    """Whether ``data`` holds a whole request head and, for a body of known length up to
    ``max_body``, the whole body. Anything the main loop should not wait for (a head over
    ``MAX_HEAD_BYTES``, chunked, ``Expect``, a body over the limit, a malformed length) counts
    as complete: the thread's parser answers it, reading against its deadline."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return len(data) > MAX_HEAD_BYTES
    head = bytes(data[:end])
    if _TRANSFER_ENCODING.search(head) or _EXPECT.search(head):
        return True
    lengths = _CONTENT_LENGTH.findall(head)
    if len(lengths) != 1:
        return True  # no body, or a conflict the parser refuses
    length = int(lengths[0])
    if length > max_body:
        return True  # the API answers 413 from the header
    return len(data) - (end + 4) >= length


class BufferedThreadWorker(gthread.ThreadWorker):  # type: ignore[misc]
    """gthread whose threads only ever get requests that have arrived (module docstring)."""

    def init_process(self) -> None:
        from django.conf import settings

        self.max_body = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
        self.arriving: deque[BufferedConn] = deque()
        self.lingering: deque[tuple[float, socket.socket]] = deque()
        super().init_process()

    # --- arrival, in the main loop ------------------------------------------------------------
    def accept(self, listener: Any) -> None:
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = BufferedConn(
            self, self.cfg, DeadlineSocket.adopt(client), address, listener.getsockname()
        )
        self._await_request(conn)

    def on_client_socket_readable(self, conn: BufferedConn, client: Any) -> None:
        """A kept-alive connection has its next request coming: collect it first."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._await_request(conn)

    def _await_request(self, conn: BufferedConn) -> None:
        conn.sock.setblocking(False)
        conn.arrived = bytearray()
        conn.arrival_deadline = time.monotonic() + REQUEST_ARRIVAL_SECONDS
        self.arriving.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_arrival, conn))

    def _on_arrival(self, conn: BufferedConn, client: Any) -> None:
        try:
            data = conn.sock.recv(RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop_arriving(conn)
            return
        conn.arrived += data
        if request_complete(conn.arrived, self.max_body):
            self.poller.unregister(conn.sock)
            self.arriving.remove(conn)
            conn.buffered = True
            conn.data_ready = True
            self.enqueue_req(conn)

    def _drop_arriving(self, conn: BufferedConn) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        with contextlib.suppress(ValueError):
            self.arriving.remove(conn)
        self.nr_conns -= 1
        gthread.TConn.close(conn)

    def murder_pending(self) -> None:
        """Each loop: drop requests past their arrival deadline, make room at the connection
        limit (oldest incomplete first), and finish lingering closes."""
        super().murder_pending()
        now = time.monotonic()
        while self.arriving and self.arriving[0].arrival_deadline <= now:
            self._drop_arriving(self.arriving[0])
        while self.arriving and self.nr_conns >= self.worker_connections:
            self._drop_arriving(self.arriving[0])
        while self.lingering and self.lingering[0][0] <= now:
            self._end_linger(self.lingering[0][1])

    # --- a thread takes the request up --------------------------------------------------------
    def handle(self, conn: BufferedConn) -> Any:
        if conn.buffered:
            conn.buffered = False
            data, conn.arrived = bytes(conn.arrived), bytearray()
            conn.sock.setblocking(True)
            try:
                conn.init()
            except Exception as exc:  # noqa: BLE001 - as gthread's own handle would report it
                self.handle_error(None, conn.sock, conn.client, exc)
                return False
            conn.parser.unreader.unread(data)
        return super().handle(conn)

    # --- graceful close, in the poller ----------------------------------------------------------
    def linger(self, conn: BufferedConn) -> None:
        """Half-close and drain the client's leftovers (RFC 9112 §9.6) without blocking."""
        sock = conn.sock
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
            self.poller.register(sock, selectors.EVENT_READ, partial(self._on_linger, [0]))
        except (OSError, ValueError, KeyError):
            self._close_quietly(sock)
            return
        self.lingering.append((time.monotonic() + LINGER_SECONDS, sock))

    def _on_linger(self, drained: list[int], sock: Any) -> None:
        try:
            data = sock.recv(RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        drained[0] += len(data)
        if not data or drained[0] >= LINGER_MAX_BYTES:
            self._end_linger(sock)

    def _end_linger(self, sock: socket.socket) -> None:
        for i, (_, lingering) in enumerate(self.lingering):
            if lingering is sock:
                del self.lingering[i]
                break
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(sock)
        self._close_quietly(sock)

    @staticmethod
    def _close_quietly(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.close()


def post_worker_init(worker: Any) -> None:
    """The API process's Prometheus exporter (``DUCKGRES_API_METRICS_PORT``, 0 = off): the
    unauthenticated-request counter. A port in use is a warning, never a failed worker. Also the
    password stash's pruner thread (terminal ops' entries go within a minute)."""
    from django.conf import settings
    from prometheus_client import start_http_server

    from reshard import stash

    stash.start_pruner()

    port = int(settings.DUCKGRES_API_METRICS_PORT)
    if not port:
        return
    try:
        start_http_server(port)
    except OSError as exc:
        _log.warning("API metrics exporter not started on port %s: %s", port, exc)
