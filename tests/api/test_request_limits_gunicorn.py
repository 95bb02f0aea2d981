"""Slow clients cannot starve the API (the "hostile inputs" issue, item 9), against a REAL
gunicorn started exactly as the image starts it (``-c python:duckgres_admin.gunicorn_conf``).

The stock gthread worker gives a connection to one of its 16 threads as soon as a first byte
arrives; the thread then reads the rest with no deadline, so clients trickling their headers or
bodies hold every thread, and the graceful close after a ``Connection: close`` response blocks
the main loop up to 2 s per client that never closes. With the shipped worker none of them
reaches a thread or blocks the loop: the probe and an API read answer at once.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from duckgres_admin import gunicorn_conf
from tests.fixtures.gunicorn import Gunicorn, run_gunicorn
from tests.fixtures.processes import process_env

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def api(tmp_path: Path, transactional_db: None) -> Iterator[Gunicorn]:
    """The shipped gunicorn on the test database (rows committed, so the API process sees
    them)."""
    env = process_env(DUCKGRES_DEBUG="false", DUCKGRES_API_METRICS_PORT="0")
    with run_gunicorn(env, tmp_path / "gunicorn.log") as running:
        yield running


def timed_get(api: Gunicorn, path: str, headers: dict[str, str] | None = None) -> float:
    """Seconds one request on a fresh connection took (fails after 8 s)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=8)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        assert response.status == 200, (path, response.status)
    except TimeoutError:
        pytest.fail(f"GET {path} got no answer within 8 s: the worker's threads are starved")
    finally:
        conn.close()
    return time.monotonic() - started


class Tricklers:
    """Connections that send their request one byte at a time, forever."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)

    def open(self, count: int, opening: bytes) -> None:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            sock.sendall(opening)
            self.sockets.append(sock)

    def start(self) -> None:
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(0.5):
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.send(b"a")

    def close(self) -> None:
        self._stop.set()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.mark.safeguard("reshard-67")
def test_trickling_clients_never_hold_the_threads(api: Gunicorn):
    internal = {"X-Duckgres-Internal-Secret": settings.DUCKGRES_INTERNAL_SECRET}
    slow = Tricklers(api.port)
    try:
        # Three times as many clients as threads, half stuck in their headers, half in a body.
        slow.open(24, b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        slow.open(
            24,
            b"POST /api/v1/warehouses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{",
        )
        slow.start()
        time.sleep(2)  # every one of them has sent bytes, some several times
        for _ in range(3):
            assert timed_get(api, "/livez") < 2
            assert timed_get(api, "/api/v1/reshards", internal) < 2
        # A request that has not arrived within the deadline is dropped.
        deadline = time.monotonic() + gunicorn_conf.REQUEST_ARRIVAL_SECONDS + 5
        for sock in slow.sockets:
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1024) == b"", "a trickling client was never dropped"
    finally:
        slow.close()
    assert timed_get(api, "/livez") < 2


@pytest.mark.safeguard("reshard-67")
def test_clients_that_never_close_do_not_block_the_main_loop(api: Gunicorn):
    idle: list[socket.socket] = []
    try:
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            idle.append(sock)  # never read, never closed: the server's linger waits for it
        time.sleep(1)
        started = time.monotonic()
        for _ in range(3):
            assert timed_get(api, "/livez") < 2
        assert time.monotonic() - started < 4
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.safeguard("reshard-67")
def test_the_shipped_limits(api: Gunicorn):
    assert gunicorn_conf.worker_class == "duckgres_admin.gunicorn_conf.BufferedThreadWorker"
    assert (gunicorn_conf.workers, gunicorn_conf.threads) == (1, 16)
    assert gunicorn_conf.limit_request_fields == 50
    # An oversized request line and too many headers are refused by gunicorn itself.
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=8)
    conn.request("GET", "/livez?" + "a" * 5000)
    assert conn.getresponse().status == 414
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=8)
    conn.request("GET", "/livez", headers={f"X-H{i}": "v" for i in range(60)})
    assert conn.getresponse().status == 431
    conn.close()
    # A complete request with a body still works (the body is collected before the thread).
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=8)
    conn.request(
        "POST",
        "/api/v1/warehouses",
        body=b'{"org_id": "gunicorn-org"}',
        headers={
            "Content-Type": "application/json",
            "X-Duckgres-Internal-Secret": settings.DUCKGRES_INTERNAL_SECRET,
        },
    )
    response = conn.getresponse()
    assert response.status in (201, 409), response.read()
    conn.close()
