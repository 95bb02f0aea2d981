"""The API's gunicorn settings as shipped (``gunicorn -c python:duckgres_admin.gunicorn_conf``).

ONE worker process per replica, threads for concurrency: the reshard password stash lives in
that process's memory (spec reshard §4.17), so a second worker process would answer a runner's
pull with 404 half of the time. With ``DUCKGRES_PASSWORD_PULL_PORT`` set the process listens on
that port too, on the main bind's host: the password route is served there and only there
(``duckgres_admin/api/pullport.py``), and the NetworkPolicy admits only runner pods to it.
The container image and ``k8s/base/api.yaml`` both start gunicorn with this module; change a value
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
connection's request head and its body (``Content-Length`` up to
``DUCKGRES_API_MAX_BODY_BYTES``), and only a complete request reaches a thread. A request that is
not complete within ``REQUEST_ARRIVAL_SECONDS`` is dropped; at ``worker_connections`` the oldest
incomplete connection makes room for the new one. A response write gets
``RESPONSE_WRITE_SECONDS``, and the graceful close after a response lingers in the poller, not
in the main loop (gunicorn's own blocks the loop up to 2 s per silent client).

Admission (docs/configuration.md "Request admission", ``duckgres_admin/api/admission.py``). The head
alone decides: a body over the limit is answered 413, ``Transfer-Encoding`` 411, an ``Expect``
other than ``100-continue`` 417, a head over 32 KiB 431, a malformed length 400, and the
connection is closed without a byte of the body read; ``100 Continue`` is sent from the main
loop once the body is admitted. Every byte held for a request (the head, then the whole
announced body, allocated once) is charged to one budget (``DUCKGRES_API_BUFFER_BUDGET_BYTES``)
until its thread is done; a large body that does not fit is answered 503 unread, heads and small
bodies always fit (the budget keeps a reserve for 1,000 of them). So no thread reads from a
client (``DeadlineSocket`` stays as the backstop), and the worker's buffers stay inside the
budget. Of the 16 threads, ``RESERVED_THREADS`` serve only lease calls, password pulls and the
probes (which also take an idle general thread): no admin page, login or other API call can take
them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import time
from collections import deque
from concurrent import futures
from functools import partial
from typing import Any

from gunicorn.workers import gthread  # type: ignore[import-untyped]
from prometheus_client import Counter

from duckgres_admin.api import admission
from duckgres_admin.platform.logs import gunicorn_logconfig_dict

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
worker_connections = admission.WORKER_CONNECTIONS
accesslog = "-"
errorlog = "-"
logconfig_dict = gunicorn_logconfig_dict()

# No runtime control socket: nothing may change the worker count of a running API (the password
# stash needs exactly one worker), and the root filesystem may be read-only.
control_socket_disable = True

# --- slow clients and admission (docs/configuration.md "Slow clients", "Request admission") ------
# A request's line, headers and body must have arrived within this long of its first byte being
# awaited; a thread's own reads (none are left in normal operation) share the same deadline.
REQUEST_ARRIVAL_SECONDS = 10.0
# Writing one response (sendall / sendfile) may take this long.
RESPONSE_WRITE_SECONDS = 30.0
# The graceful close after a response: drain at most this long / this much, in the poller.
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 65536
# At most this many closes linger at once (each holds a descriptor); beyond, the oldest ends now.
LINGER_MAX_SOCKETS = 1000
RECV_CHUNK = 65536
# Of the ``threads``, this many serve only the priority routes (admission.PRIORITY_ROUTE: lease
# calls, password pulls, probes; and everything on the password-pull port). A priority request
# takes an idle general thread too when the reserved ones are busy; no other request ever takes
# a reserved one.
RESERVED_THREADS = 4
# Until its head is read, a connection is read at most this much (a head and a small body).
HEAD_READ_BYTES = admission.MAX_HEAD_BYTES + admission.SMALL_BODY_BYTES
# One log line per refusal reason per this long, carrying the count of those not logged.
REFUSAL_LOG_SECONDS = 60.0
GENERAL, RESERVED = "general", "reserved"

_log = logging.getLogger("gunicorn.error")
REFUSED = Counter(
    "duckgres_api_admission_refusals_total",
    "Requests the API worker answered from their head alone, without reading a body "
    "(docs/configuration.md, Request admission).",
    ["reason"],
)
for _reason in ("too_large", "length_required", "expectation", "head_too_large", "bad_length"):
    REFUSED.labels(reason=_reason)
REFUSED.labels(reason=admission.BUSY.reason)


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
    """gthread's connection with the bytes collected by the main loop, their charge on the
    worker's budget, and a worker to linger in when it is closed gracefully."""

    def __init__(self, worker: BufferedThreadWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker
        # Until the head is read: what arrived so far. After: the whole request, preallocated
        # (its length is charged to the budget), of which ``filled`` bytes have arrived.
        self.arrived = bytearray()
        self.filled = 0
        self.head: admission.Head | None = None
        self.charged = 0
        self.arrival_deadline = 0.0
        self.buffered = False
        self.continue_sent = False
        self.lane = ""

    def close(self, graceful: bool = False) -> None:
        if graceful:
            self.worker.linger(self)
        else:
            super().close()


def _port(address: Any) -> int | None:
    return int(address[1]) if isinstance(address, tuple) and len(address) >= 2 else None


class BufferedThreadWorker(gthread.ThreadWorker):  # type: ignore[misc]
    """gthread whose threads only ever get requests that have arrived whole and were admitted,
    with threads reserved for the priority routes (module docstring)."""

    def init_process(self) -> None:
        from django.conf import settings

        if self.cfg.is_ssl:
            raise RuntimeError("BufferedThreadWorker reads requests in its main loop: no TLS here")
        self.max_body = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
        self.budget = admission.BufferBudget(int(settings.DUCKGRES_API_BUFFER_BUDGET_BYTES))
        self.pull_port = int(settings.DUCKGRES_PASSWORD_PULL_PORT)
        self.arriving: deque[BufferedConn] = deque()
        self.lingering: deque[tuple[float, socket.socket]] = deque()
        self.reserved_pool = futures.ThreadPoolExecutor(
            max_workers=RESERVED_THREADS, thread_name_prefix="reserved"
        )
        self.busy = {GENERAL: 0, RESERVED: 0}
        self.refusals_logged: dict[str, tuple[float, int]] = {}
        super().init_process()

    def get_thread_pool(self) -> futures.ThreadPoolExecutor:
        """The general threads: ``threads`` less the reserved ones."""
        return futures.ThreadPoolExecutor(max_workers=self.cfg.threads - RESERVED_THREADS)

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.reserved_pool.shutdown(wait=False)

    def handle_quit(self, sig: Any, frame: Any) -> None:
        self.reserved_pool.shutdown(wait=False)
        super().handle_quit(sig, frame)

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

    def _await_request(self, conn: BufferedConn, seed: bytes = b"") -> None:
        """Collect the connection's next request in the poller; ``seed`` holds bytes of it
        already read (pipelined behind the previous request)."""
        conn.sock.setblocking(False)
        conn.arrived = bytearray()
        conn.filled = 0
        conn.head = None
        conn.continue_sent = False
        conn.arrival_deadline = time.monotonic() + REQUEST_ARRIVAL_SECONDS
        self.arriving.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_arrival, conn))
        if seed:
            self._take(conn, seed)

    def _on_arrival(self, conn: BufferedConn, client: Any) -> None:
        data, got = b"", 0
        try:
            if conn.head is None:
                data = conn.sock.recv(max(HEAD_READ_BYTES - conn.filled, 1))
            else:
                with memoryview(conn.arrived) as whole, whole[conn.filled :] as rest:
                    got = conn.sock.recv_into(rest)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, got = b"", 0
        if conn.head is None:
            if data:
                self._take(conn, data)
            else:
                self._drop_arriving(conn)
        elif got:
            conn.filled += got
            self._advance(conn)
        else:
            self._drop_arriving(conn)

    def _take(self, conn: BufferedConn, data: bytes) -> None:
        """Bytes of a head not read yet: charged (never refused in practice: a head is bounded
        by HEAD_READ_BYTES and counted in the budget's reserve), then looked at."""
        if not self._charge(conn, conn.filled + len(data)):
            self._refuse(conn, admission.BUSY)
            return
        conn.arrived += data
        conn.filled += len(data)
        self._advance(conn)

    def _advance(self, conn: BufferedConn) -> None:
        """Decide on a head once it is there; hand a request over once all of it is."""
        if conn.head is None:
            verdict = admission.inspect(conn.arrived, self.max_body)
            if verdict is None:
                return
            if isinstance(verdict, admission.Refusal):
                self._refuse(conn, verdict)
                return
            conn.head = verdict
            if conn.filled < verdict.total:
                large = verdict.body_bytes > admission.SMALL_BODY_BYTES
                if not self._charge(conn, verdict.total, large=large):
                    self._refuse(conn, admission.BUSY)
                    return
                whole = bytearray(verdict.total)
                whole[: conn.filled] = conn.arrived
                conn.arrived = whole
                if verdict.expect_continue:
                    self._send_continue(conn)
                return
            conn.filled = len(conn.arrived)
        if conn.filled < len(conn.arrived):
            return
        self.poller.unregister(conn.sock)
        self.arriving.remove(conn)
        conn.buffered = True
        conn.data_ready = True
        self.enqueue_req(conn)

    def _charge(self, conn: BufferedConn, wanted: int, *, large: bool = False) -> bool:
        if not self.budget.charge(conn.charged, wanted, large=large):
            return False
        conn.charged = wanted
        return True

    def _send_continue(self, conn: BufferedConn) -> None:
        """The "100 Continue" an HTTP/1.1 client waits for before its body, sent once the body
        is admitted; the request's thread must then not send it again (handle_request)."""
        try:
            sent = conn.sock.send(admission.CONTINUE)
        except OSError:
            sent = 0
        if sent == len(admission.CONTINUE):
            conn.continue_sent = True
        else:  # 25 bytes into a fresh connection's empty buffer: only a broken one fails
            self._drop_arriving(conn)

    def _refuse(self, conn: BufferedConn, refusal: admission.Refusal) -> None:
        """Answer from the head, unread body and all, and close (lingering in the poller)."""
        self._note_refusal(conn, refusal)
        self._drop_arriving(conn, close=False)
        with contextlib.suppress(OSError):
            conn.sock.send(admission.response_bytes(refusal))
        self._linger_socket(conn.sock)

    def _note_refusal(self, conn: BufferedConn, refusal: admission.Refusal) -> None:
        REFUSED.labels(reason=refusal.reason).inc()
        now = time.monotonic()
        last, skipped = self.refusals_logged.get(refusal.reason, (None, 0))
        if last is not None and now - last < REFUSAL_LOG_SECONDS:
            self.refusals_logged[refusal.reason] = (last, skipped + 1)
            return
        self.refusals_logged[refusal.reason] = (now, 0)
        client = conn.client[0] if isinstance(conn.client, tuple) else conn.client
        _log.warning(
            "request refused before its body was read (%s %s) from %s; %d more refused for this "
            "reason since the last such line",
            refusal.status,
            refusal.reason,
            client,
            skipped,
        )

    def _drop_arriving(self, conn: BufferedConn, *, close: bool = True) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        with contextlib.suppress(ValueError):
            self.arriving.remove(conn)
        self._charge(conn, 0)
        conn.arrived = bytearray()
        self.nr_conns -= 1
        if close:
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

    # --- to a thread, and back ----------------------------------------------------------------
    def enqueue_req(self, conn: BufferedConn) -> None:
        """A whole request to its lane's pool. gthread also calls this for a kept-alive
        connection whose parser read ahead into the next request: that request is collected in
        the main loop first, like any other."""
        if not conn.buffered:
            seed = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
            self._await_request(conn, seed)
            return
        conn.lane = self._lane(conn)
        self.busy[conn.lane] += 1
        pool = self.reserved_pool if conn.lane == RESERVED else self.tpool
        fs = pool.submit(self.handle, conn)
        fs.add_done_callback(lambda fut: self.method_queue.defer(self.finish_request, conn, fut))

    def _lane(self, conn: BufferedConn) -> str:
        """RESERVED for a priority request while a reserved thread is free, or when no general
        one is (it then queues behind priority requests only); GENERAL otherwise."""
        on_pull_port = bool(self.pull_port) and _port(conn.server) == self.pull_port
        head = conn.head
        priority = on_pull_port or (head is not None and admission.priority_route(head.target))
        if priority and (
            self.busy[RESERVED] < RESERVED_THREADS
            or self.busy[GENERAL] >= self.cfg.threads - RESERVED_THREADS
        ):
            return RESERVED
        return GENERAL

    def finish_request(self, conn: BufferedConn, fs: Any) -> None:
        """In the main loop once a thread is done: the lane's count and the budget get the
        request's share back before gthread keeps, re-reads or closes the connection."""
        if conn.lane:
            self.busy[conn.lane] -= 1
            conn.lane = ""
        self._charge(conn, 0)
        super().finish_request(conn, fs)

    def handle(self, conn: BufferedConn) -> Any:
        if conn.buffered:
            conn.buffered = False
            conn.sock.setblocking(True)
            try:
                conn.init()
            except Exception as exc:  # noqa: BLE001 - as gthread's own handle would report it
                self.handle_error(None, conn.sock, conn.client, exc)
                return False
            conn.parser.unreader.unread(conn.arrived)
            conn.arrived = bytearray()
        return super().handle(conn)

    def handle_request(self, req: Any, conn: BufferedConn) -> Any:
        if conn.continue_sent:
            conn.continue_sent = False
            req._expected_100_continue = False  # the main loop sent "100 Continue" already
        return super().handle_request(req, conn)

    # --- graceful close, in the poller ----------------------------------------------------------
    def linger(self, conn: BufferedConn) -> None:
        self._linger_socket(conn.sock)

    def _linger_socket(self, sock: socket.socket) -> None:
        """Half-close and drain the client's leftovers (RFC 9112 §9.6) without blocking."""
        while len(self.lingering) >= LINGER_MAX_SOCKETS:
            self._end_linger(self.lingering[0][1])
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

    from reshard.start import stash

    stash.start_pruner()

    port = int(settings.DUCKGRES_API_METRICS_PORT)
    if not port:
        return
    try:
        start_http_server(port)
    except OSError as exc:
        _log.warning("API metrics exporter not started on port %s: %s", port, exc)
