"""The API survives unauthenticated load (issue 25 item 4), against a REAL gunicorn started as the
image starts it (``-c python:duckgres_admin.gunicorn_conf``), on loopback only.

- Memory: 1,000 connections each announcing a body of the largest allowed size and stalling one
  byte short keep the worker's resident memory (``/proc/<pid>/status``) within its buffer budget
  (``DUCKGRES_API_BUFFER_BUDGET_BYTES``) plus :data:`RSS_MARGIN` over its idle size; the request
  that no longer fits is answered 503 unread, while ``/livez`` and a lease grant still answer.
- Admission: 413 / 411 / 417 / 431 / 400 come from the head alone, before anything reads a body;
  24 clients posting 2 MB admin forms (with a ``csrftoken`` cookie) a byte at a time never hold
  a thread: ``/livez`` and a lease grant answer within 2 s.
- Reserved threads: admin logins that keep every general thread busy hashing passwords do not
  delay ``/livez`` or a lease grant beyond 2 s, while an admin page waits.

Every loop here has a deadline and stops by itself. The figures measured are printed (``-s``).
"""

from __future__ import annotations

import contextlib
import html
import http.client
import json
import os
import re
import secrets
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.conf import settings

from duckgres_admin.api import admission
from tests.fixtures.gunicorn import Gunicorn, free_port, run_gunicorn
from tests.fixtures.processes import process_env
from tests.fixtures.rows import new_store, new_warehouse

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024
# Beyond the budget: the Python objects of 1,000 connections, the allocator's slack, the probes.
RSS_MARGIN = 32 * MiB
PROBE_SECONDS = 2.0
CONTROL_MIN_WAIT_SECONDS = 1.0


@pytest.fixture
def api(tmp_path: Path, transactional_db: None) -> Iterator[Gunicorn]:
    env = process_env(DUCKGRES_DEBUG="false", DUCKGRES_API_METRICS_PORT="0")
    with run_gunicorn(env, tmp_path / "gunicorn.log") as running:
        yield running


def make_org(org: str) -> None:
    """A ready warehouse that grants leases (no cap); its store row is never connected to."""
    store = new_store(name=f"{org}-store", host="direct.example", port=5432, sslmode="verify-full")
    new_warehouse(
        org_id=org,
        store=store,
        metadata_store_database=f"{org}_db",
        metadata_store_user=f"{org}_user",
        metadata_store_password_ref="env:TENANT_PW",
    )


def worker_pid(master: int) -> int:
    """The one worker process of the gunicorn master (its only child)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == master:
                    return int(stat.parent.name)
        time.sleep(0.1)
    raise AssertionError(f"gunicorn master {master} has no worker")


def memory(pid: int, field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def timed(api: Gunicorn, method: str, path: str, *, expect: int, **kw: object) -> float:
    """Seconds one request on a fresh connection took; fails after 8 s or on another status."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=8)
    try:
        conn.request(method, path, **kw)  # type: ignore[arg-type]
        response = conn.getresponse()
        body = response.read()
        assert response.status == expect, (path, response.status, body[:300])
    except TimeoutError:
        pytest.fail(f"{method} {path} got no answer within 8 s: the worker's threads are starved")
    finally:
        conn.close()
    return time.monotonic() - started


def probes(api: Gunicorn, org: str) -> tuple[float, float]:
    """``/livez`` and a lease grant (then released), each timed."""
    livez = timed(api, "GET", "/livez", expect=200)
    grant = json.dumps({"holder": "probe", "purpose": "query"})
    headers = {
        "Content-Type": "application/json",
        "X-Duckgres-Dataplane-Secret": settings.DUCKGRES_DATAPLANE_SECRET,
    }
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=8)
    try:
        conn.request("POST", f"/api/v1/warehouses/{org}/leases", body=grant, headers=headers)
        response = conn.getresponse()
        body = json.loads(response.read())
        assert response.status == 201, body
        lease = time.monotonic() - started
        conn.request(
            "DELETE", f"/api/v1/warehouses/{org}/leases/{body['lease_id']}", headers=headers
        )
        assert conn.getresponse().status == 204
    except TimeoutError:
        pytest.fail("the lease grant got no answer within 8 s: the worker's threads are starved")
    finally:
        conn.close()
    return livez, lease


def raw_exchange(api: Gunicorn, data: bytes, *, wait: float = 3.0) -> bytes:
    """Send ``data`` on a fresh connection and return what the server answers within ``wait``
    (it closes after a refusal)."""
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=wait)
    got = b""
    try:
        sock.sendall(data)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            got += chunk
            if b"\r\n\r\n" in got and not got.startswith(b"HTTP/1.1 100"):
                head, _, body = got.partition(b"\r\n\r\n")
                length = re.search(rb"Content-Length: (\d+)", head)
                if length and len(body) >= int(length[1]):
                    break
    finally:
        sock.close()
    return got


def status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


# --- memory ------------------------------------------------------------------------------------


def stall_bodies(
    api: Gunicorn, pid: int, count: int, bound: int
) -> tuple[list[socket.socket], int]:
    """``count`` connections, each announcing a body of the largest allowed size and sending
    all of it but one byte; stops early (and the test fails) once the worker's RSS passes
    ``bound``. Returns the connections and the largest RSS sampled."""
    max_body = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
    head = (
        "POST /api/v1/warehouses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {max_body}\r\n\r\n"
    ).encode()
    body = b"x" * (max_body - 1)
    held: list[socket.socket] = []
    peak = 0
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
        held.append(sock)
        with contextlib.suppress(OSError):  # a refused one may be reset while it sends
            sock.sendall(head + body)
        if i % 20 == 0:
            peak = max(peak, memory(pid, "VmRSS"))
            if peak > bound:
                break
    return held, peak


@pytest.mark.safeguard("reshard-116")
def test_stalled_bodies_keep_the_worker_inside_its_buffer_budget(api: Gunicorn):
    make_org("budget-org")
    pid = worker_pid(api.proc.pid)
    for _ in range(5):  # warm: Django, the lease path, the allocator
        probes(api, "budget-org")
    idle = memory(pid, "VmRSS")
    budget = int(settings.DUCKGRES_API_BUFFER_BUDGET_BYTES)
    bound = idle + budget + RSS_MARGIN
    held, peak = stall_bodies(api, pid, 1000, bound)
    try:
        for _ in range(10):  # the last bodies are still being read
            peak = max(peak, memory(pid, "VmRSS"))
            time.sleep(0.1)
        hwm = memory(pid, "VmHWM")
        print(
            f"\nworker RSS: idle {idle / MiB:.1f} MiB, peak sampled {peak / MiB:.1f} MiB, "
            f"VmHWM {hwm / MiB:.1f} MiB; budget {budget / MiB:.0f} MiB, bound "
            f"{bound / MiB:.1f} MiB; {len(held)} connections opened"
        )
        assert len(held) == 1000, f"stopped early: RSS {peak / MiB:.1f} > {bound / MiB:.1f} MiB"
        assert max(peak, hwm) <= bound, (idle, peak, hwm, bound)
        # Not vacuous: the stalled bodies did fill the part of the budget large bodies may take.
        large = budget - admission.reserve_bytes()
        assert peak - idle >= large // 2, (idle, peak, large)
        # The budget is full of stalled bodies: one more is answered 503 at once, unread ...
        max_body = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
        answer = raw_exchange(
            api,
            b"POST /api/v1/warehouses HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Length: {max_body}\r\n\r\n".encode(),
        )
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:500]
        assert status_and_error(answer) == (503, admission.BUSY.message)
        assert b"\r\nRetry-After: 1\r\n" in answer
        # ... while the probe and a lease grant (small bodies, never refused) answer.
        for _ in range(3):
            livez, lease = probes(api, "budget-org")
            print(f"probes with the budget full: livez {livez:.3f} s, lease {lease:.3f} s")
            assert livez < PROBE_SECONDS, livez
            assert lease < PROBE_SECONDS, lease
    finally:
        for sock in held:
            sock.close()


@pytest.mark.safeguard("reshard-116")
def test_refused_clients_that_never_close_hold_a_bounded_number_of_descriptors(api: Gunicorn):
    """A refusal lingers in the poller for the client's leftovers (RFC 9112 §9.6), but at most
    ``LINGER_MAX_SOCKETS`` at once: clients that never close cannot exhaust descriptors."""
    from duckgres_admin import gunicorn_conf

    pid = worker_pid(api.proc.pid)
    idle = len(os.listdir(f"/proc/{pid}/fd"))
    head = b"POST /api/v1/warehouses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    clients: list[socket.socket] = []
    try:
        started = time.monotonic()
        for _ in range(gunicorn_conf.LINGER_MAX_SOCKETS + 400):
            sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
            sock.sendall(head)  # answered 411, then never read, never closed
            clients.append(sock)
        opened = time.monotonic() - started
        time.sleep(0.3)
        held = len(os.listdir(f"/proc/{pid}/fd")) - idle
        print(f"\n{len(clients)} refused clients opened in {opened:.2f} s: worker holds {held} fds")
        assert held <= gunicorn_conf.LINGER_MAX_SOCKETS + 20, held
        # Every one of them got its answer, those whose linger was cut short too.
        for sock in (clients[0], clients[len(clients) // 2], clients[-1]):
            assert sock.recv(100).startswith(b"HTTP/1.1 411 ")
    finally:
        for sock in clients:
            sock.close()
    assert timed(api, "GET", "/livez", expect=200) < PROBE_SECONDS


# --- admission answers ---------------------------------------------------------------------------


@pytest.fixture
def metered_api(tmp_path: Path, transactional_db: None) -> Iterator[tuple[Gunicorn, int]]:
    """The shipped gunicorn with its Prometheus exporter on a free port."""
    port = free_port()
    env = process_env(DUCKGRES_DEBUG="false", DUCKGRES_API_METRICS_PORT=str(port))
    with run_gunicorn(env, tmp_path / "gunicorn.log") as running:
        yield running, port


def refusals(metrics_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    found = re.findall(
        rb'^duckgres_api_admission_refusals_total\{reason="([a-z_]+)"\} ([0-9.]+)$', text, re.M
    )
    return {reason.decode(): float(value) for reason, value in found}


@pytest.mark.safeguard("reshard-117")
def test_the_head_alone_is_answered_and_no_body_is_waited_for(metered_api: tuple[Gunicorn, int]):
    """Each answer arrives at once although no body byte is ever sent; each is counted, and
    logged once per reason and minute."""
    api, metrics_port = metered_api
    max_body = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
    post = "POST /api/v1/warehouses HTTP/1.1\r\nHost: x\r\n"
    cases = [
        (f"Content-Length: {max_body + 1}\r\n", 413, admission.too_large(max_body).message),
        ("Transfer-Encoding: chunked\r\n", 411, admission.LENGTH_REQUIRED.message),
        (
            "Content-Length: 10\r\nExpect: 200-ok\r\n",
            417,
            admission.expectation_failed("200-ok").message,
        ),
        ("Content-Length: 10\r\nContent-Length: 10\r\n", 400, admission.BAD_LENGTH.message),
        (
            "X-Big: " + "a" * admission.MAX_HEAD_BYTES + "\r\n",
            431,
            admission.HEAD_TOO_LARGE.message,
        ),
    ]
    for fields, status, message in cases:
        for _ in range(2):
            started = time.monotonic()
            answer = raw_exchange(api, (post + fields + "\r\n").encode())
            assert status_and_error(answer) == (status, message), (fields[:60], answer[:300])
            assert time.monotonic() - started < PROBE_SECONDS
    counted = refusals(metrics_port)
    reasons = ("too_large", "length_required", "expectation", "bad_length", "head_too_large")
    assert {r: counted[r] for r in reasons} == dict.fromkeys(reasons, 2.0), counted
    assert counted["budget"] == 0
    lines = [line for line in api.log_text().splitlines() if "refused before its body" in line]
    assert len(lines) == len(reasons), lines  # the second of each reason within the minute: not
    assert all("from 127.0.0.1; 0 more refused for this reason" in line for line in lines), lines
    # 100-continue: the worker sends "100 Continue" once the body is admitted, exactly once.
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
    try:
        sock.sendall((post + "Content-Length: 2\r\nExpect: 100-continue\r\n\r\n").encode())
        assert sock.recv(100) == admission.CONTINUE
        sock.sendall(b"{}")
        rest = sock.recv(65536)
        assert rest.startswith(b"HTTP/1.1 401 "), rest[:200]  # the API's own answer
        assert b"100 Continue" not in rest
    finally:
        sock.close()


class AdminTricklers:
    """``count`` connections that each POST ``head`` and then trickle one body byte every half
    second; one the server answers is read (its status kept) and replaced. Stops by itself after
    ``seconds``."""

    def __init__(self, port: int, head: bytes, count: int, seconds: float) -> None:
        self.port, self.head, self.count = port, head, count
        self.deadline = time.monotonic() + seconds
        self.answers: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AdminTricklers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _open(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        sock.sendall(self.head + b"c")
        return sock

    def _run(self) -> None:
        socks = [self._open() for _ in range(self.count)]
        try:
            while time.monotonic() < self.deadline and not self._stop.is_set():
                readable, _, _ = select.select(socks, [], [], 0)
                for sock in readable:
                    try:
                        self.answers.append(sock.recv(65536))
                    except OSError:
                        self.answers.append(b"")
                    sock.close()
                    socks[socks.index(sock)] = self._open()
                for sock in socks:
                    with contextlib.suppress(OSError):
                        sock.send(b"a")
                self._stop.wait(0.5)
        finally:
            for sock in socks:
                sock.close()


def csrf_form(api: Gunicorn) -> tuple[str, str]:
    """The admin login form's CSRF cookie and token, as a browser (or anyone) gets them."""
    form = api.request("GET", "/admin/login/?next=/admin/")
    assert form.status == 200
    cookie = re.search(r"csrftoken=([^;]+)", " ".join(form.set_cookies()))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert cookie, form.headers
    assert token, form.text[:2000]
    return cookie[1], html.unescape(token[1])


@pytest.mark.safeguard("reshard-117")
def test_admin_post_tricklers_hold_no_thread(api: Gunicorn):
    make_org("trickle-org")
    cookie, _ = csrf_form(api)
    head = (
        "POST /admin/login/?next=/admin/ HTTP/1.1\r\nHost: x\r\n"
        f"Cookie: csrftoken={cookie}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 2000000\r\n\r\n"
    ).encode()
    timings: list[tuple[float, float]] = []
    with AdminTricklers(api.port, head, 24, seconds=20) as tricklers:
        time.sleep(1.5)  # every trickler has sent bytes, most several times
        for _ in range(5):
            timings.append(probes(api, "trickle-org"))
            time.sleep(0.3)
    print(f"\nunder 24 admin-POST tricklers: (livez, lease) seconds {timings}")
    assert all(livez < PROBE_SECONDS and lease < PROBE_SECONDS for livez, lease in timings)
    # Every one was answered 413 from its Content-Length, and at once (so, many times over).
    assert len(tricklers.answers) >= 48, len(tricklers.answers)
    max_body = int(settings.DUCKGRES_API_MAX_BODY_BYTES)
    expected = (413, admission.too_large(max_body).message)
    assert all(status_and_error(a) == expected for a in tricklers.answers), tricklers.answers[:3]


# --- reserved threads --------------------------------------------------------------------------


class LoginHammer:
    """``count`` clients posting admin logins (valid CSRF, a new username each time, a wrong
    password) back to back: each one costs the server a full password hash. Stops by itself
    after ``seconds``; :meth:`stop` also breaks off the requests in flight."""

    def __init__(self, api: Gunicorn, count: int, seconds: float) -> None:
        self.port = api.port
        self.cookie, self.token = csrf_form(api)
        self.deadline = time.monotonic() + seconds
        self.statuses: list[int] = []
        self._conns: list[http.client.HTTPConnection] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def __enter__(self) -> LoginHammer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.deadline = 0.0
        for conn in list(self._conns):
            with contextlib.suppress(OSError, AttributeError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=10)

    def _run(self) -> None:
        while time.monotonic() < self.deadline:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self._conns.append(conn)
            body = urlencode(
                {
                    "csrfmiddlewaretoken": self.token,
                    "username": f"nobody-{secrets.token_hex(4)}",
                    "password": "wrong",
                    "next": "/admin/",
                }
            )
            headers = {
                "Cookie": f"csrftoken={self.cookie}",
                "Content-Type": "application/x-www-form-urlencoded",
            }
            try:
                conn.request("POST", "/admin/login/?next=/admin/", body=body, headers=headers)
                self.statuses.append(conn.getresponse().status)
            except OSError:
                self.statuses.append(0)
            finally:
                conn.close()


@pytest.mark.safeguard("reshard-117")
def test_lease_grants_and_probes_keep_threads_no_admin_request_can_take(api: Gunicorn):
    from duckgres_admin import gunicorn_conf

    make_org("reserved-org")
    general = gunicorn_conf.threads - gunicorn_conf.RESERVED_THREADS
    timings: list[tuple[float, float]] = []
    # Twice as many hashers as general threads: a full round of logins queues behind the busy
    # threads.
    with LoginHammer(api, 2 * general, seconds=30) as hammer:
        time.sleep(2)  # every general thread is hashing a password, as many logins queue
        # The control: a general-lane request waits for a general thread.
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=4)
            conn.request("GET", "/admin/login/")
            conn.getresponse().read()
        waited = time.monotonic() - started
        for _ in range(3):
            timings.append(probes(api, "reserved-org"))
    print(
        f"\nunder {2 * general} login hashers: admin page waited {waited:.2f} s; (livez, lease) "
        f"seconds {timings}; logins answered before the stop: "
        f"{sum(status != 0 for status in hammer.statuses)} of {len(hammer.statuses)}"
    )
    # The control: the general lane was saturated — its request waited at least a second and
    # far longer than any probe on the reserved lane (when it arrives just as a round of hashes
    # ends it waits less than a whole round, so no fixed wait is promised).
    slowest = max(max(pair) for pair in timings)
    assert waited >= CONTROL_MIN_WAIT_SECONDS, (
        f"the general threads were not saturated ({waited:.2f} s)"
    )
    assert waited >= 5 * slowest, (waited, timings)
    assert all(livez < PROBE_SECONDS and lease < PROBE_SECONDS for livez, lease in timings)


# --- per-route request metrics (docs/monitoring.md "Platform metrics") ---------------------------


def _metric_lines(metrics_port: int) -> list[str]:
    text: bytes = urllib.request.urlopen(
        f"http://127.0.0.1:{metrics_port}/metrics", timeout=5
    ).read()
    return text.decode().splitlines()


def _value(lines: list[str], prefix: str, **labels: str) -> float:
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    found = [ln for ln in lines if ln.startswith(prefix + "{") and all(w in ln for w in wanted)]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in found)


def test_requests_are_counted_and_timed_per_route_never_per_path(
    metered_api: tuple[Gunicorn, int],
):
    """Rate, errors and latency per route: two op ids are one series (the route's name), and a
    path no route matches adds no label of its own (bounded cardinality)."""
    api, metrics_port = metered_api
    by_view = "django_http_responses_total_by_status_view_method_total"
    latency = "django_http_requests_latency_seconds_by_view_method_count"
    before = _metric_lines(metrics_port)
    stray = f"/no-such-{secrets.token_hex(6)}"
    for path in ("/livez", "/livez", "/api/v1/reshards/101", "/api/v1/reshards/202", stray):
        api.request("GET", path, headers={"Host": "localhost"})
    lines = _metric_lines(metrics_port)
    livez = {"view": "livez", "method": "GET"}
    assert (
        _value(lines, by_view, status="200", **livez)
        - _value(before, by_view, status="200", **livez)
        == 2
    )
    assert _value(lines, latency, **livez) - _value(before, latency, **livez) == 2
    detail = [ln for ln in lines if ln.startswith(by_view) and "reshard-detail" in ln]
    assert len(detail) == 1, detail  # both op ids in one series
    assert detail[0].rsplit(" ", 1)[1] == "2.0"
    assert '"401"' in detail[0] or '"403"' in detail[0], detail
    assert not any(stray in ln for ln in lines)
