"""Request admission in-process (issue 25 item 4): the head reader, the buffer budget and the
reserved routes of ``duckgres_admin/api/admission.py``, the same refusals inside Django before the
CSRF middleware reads a body, and the settings that bound them. Against a real gunicorn:
``test_request_admission_gunicorn.py``."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from duckgres_admin.api import admission
from tests.fixtures.settings_probe import settings_printed

MAX = 1024 * 1024
POST = b"POST /api/v1/warehouses HTTP/1.1\r\nHost: x\r\n"


# --- the head ---------------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-117")
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"GET /livez HTTP/1.1\r\nHost: x", None),  # not all there yet
        (b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", admission.Head("/livez", 32, 0, False)),
        (b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", admission.Head("/", 22, 0, False)),
        (POST + b"Content-Length: 5\r\n\r\n{}", admission.Head("/api/v1/warehouses", 64, 5, False)),
        (
            POST + b"content-length:  7 \r\nEXPECT: 100-Continue\r\n\r\n",
            admission.Head("/api/v1/warehouses", 88, 7, True),
        ),
        (
            b"POST / HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n",
            admission.Head(
                "/",
                60,
                3,
                False,  # RFC 9110 §10.1.1: an HTTP/1.0 client does not wait for it
            ),
        ),
        (
            POST + b"Content-Length: 0\r\nExpect: 100-continue\r\n\r\n",
            admission.Head("/api/v1/warehouses", 86, 0, False),
        ),
        (POST + b"Content-Length: 1048577\r\n\r\n", admission.too_large(MAX)),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n", admission.LENGTH_REQUIRED),
        (
            POST + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            admission.LENGTH_REQUIRED,
        ),
        (POST + b"Expect: 200-ok\r\n\r\n", admission.expectation_failed("200-ok")),
        (POST + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\n", admission.BAD_LENGTH),
        (POST + b"Content-Length: -3\r\n\r\n", admission.BAD_LENGTH),
        (POST + b"Content-Length:\r\n\r\n", admission.BAD_LENGTH),
        (POST + b"X: " + b"a" * admission.MAX_HEAD_BYTES, admission.HEAD_TOO_LARGE),
        (POST + b"X: " + b"a" * admission.MAX_HEAD_BYTES + b"\r\n\r\n", admission.HEAD_TOO_LARGE),
        # What the parser refuses by itself (400) is handed to it whole, with no body to wait for.
        (b"GET / HTTP/1.1\r\n folded\r\n\r\n", admission.Head("", 27, 0, False)),
        (b"BROKEN\r\nContent-Length: 9\r\n\r\n", admission.Head("", 29, 9, False)),
    ],
)
def test_a_head_is_decided_alone(data: bytes, expected: Any):
    assert admission.inspect(data, MAX) == expected


@pytest.mark.safeguard("reshard-117")
def test_the_refusal_is_a_whole_http_response_that_closes():
    raw = admission.response_bytes(admission.BUSY)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable"
    assert b"\r\nConnection: close" in head
    assert b"\r\nRetry-After: 1" in head
    assert f"\r\nContent-Length: {len(body)}".encode() in head
    assert body == b'{"error": "' + admission.BUSY.message.encode() + b'"}'


# --- the budget -------------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-116")
def test_large_bodies_never_take_the_reserve_of_heads_and_small_bodies():
    reserve = admission.reserve_bytes()
    budget = admission.BufferBudget(reserve + 3 * MAX)
    assert budget.charge(0, MAX, large=True)
    assert budget.charge(0, MAX, large=True)
    assert budget.charge(0, MAX, large=True)
    assert not budget.charge(0, 1, large=True)  # the fourth waits (503)
    assert budget.used == 3 * MAX
    # Heads and small bodies of every possible connection still fit, and nothing more.
    per_conn = admission.MAX_HEAD_BYTES + admission.SMALL_BODY_BYTES
    for _ in range(admission.WORKER_CONNECTIONS + admission.CONNECTION_SLACK):
        assert budget.charge(0, per_conn)
    assert budget.used == budget.limit
    assert not budget.charge(0, 1)
    # A charge that shrinks is always taken; handing one back frees it for a large body.
    assert budget.charge(per_conn, 0)
    assert not budget.charge(0, MAX, large=True)  # the reserve is still in use
    for _ in range(admission.WORKER_CONNECTIONS + admission.CONNECTION_SLACK - 1):
        budget.charge(per_conn, 0)
    assert budget.charge(MAX, 0, large=True)
    assert budget.charge(0, MAX, large=True)
    assert budget.used == 3 * MAX


@pytest.mark.safeguard("reshard-116")
def test_the_shipped_budget_and_django_s_own_limit():
    assert settings.DUCKGRES_API_BUFFER_BUDGET_BYTES == 128 * MAX
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == settings.DUCKGRES_API_MAX_BODY_BYTES == MAX
    assert admission.minimum_budget(MAX) < settings.DUCKGRES_API_BUFFER_BUDGET_BYTES


@pytest.mark.safeguard("reshard-116")
def test_the_budget_and_the_body_limit_are_set_together():
    result = settings_printed(
        {"DUCKGRES_API_MAX_BODY_BYTES": "4096", "DUCKGRES_API_BUFFER_BUDGET_BYTES": "67108864"},
        "DATA_UPLOAD_MAX_MEMORY_SIZE",
        "DUCKGRES_API_BUFFER_BUDGET_BYTES",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4096", "67108864"]
    least = admission.minimum_budget(MAX)
    result = settings_printed({"DUCKGRES_API_BUFFER_BUDGET_BYTES": str(least - 1)}, "DEBUG")
    assert result.returncode != 0
    assert (
        f"DUCKGRES_API_BUFFER_BUDGET_BYTES={least - 1} is below {least}, the reserve for request "
        "heads and small bodies plus one body of DUCKGRES_API_MAX_BODY_BYTES: raise it, or lower "
        "DUCKGRES_API_MAX_BODY_BYTES"
    ) in result.stderr


# --- the reserved routes ----------------------------------------------------------------------


@pytest.mark.safeguard("reshard-117")
@pytest.mark.parametrize(
    ("target", "priority"),
    [
        ("/livez", True),
        ("/readyz", True),
        ("/api/v1/reshards/12/password", True),
        ("/api/v1/warehouses/org-a/leases", True),
        ("/api/v1/warehouses/org-a/leases/7", True),
        ("/api/v1/warehouses/org-a/leases/7/renew", True),
        ("/api/v1/warehouses/org-a/leases?x=1", True),
        ("/api/v1/warehouses/org-a/lease%73", True),  # Django routes it to the lease view too
        ("http://admin.example/api/v1/warehouses/o/leases", True),
        ("/api/v1/warehouses/org-a", False),
        ("/api/v1/warehouses/org-a/reshards", False),
        ("/api/v1/reshards/12", False),
        ("/admin/login/", False),
        ("/livez/extra", False),
        ("/api/v1/warehouses/a/b/leases", False),
        ("", False),
    ],
)
def test_the_routes_of_the_reserved_threads(target: str, priority: bool):
    assert admission.priority_route(target) is priority


# --- inside Django, before CSRF -----------------------------------------------------------------


class Unreadable:
    """A ``wsgi.input`` that fails the test if anything reads it."""

    def read(self, *args: Any) -> bytes:
        pytest.fail("a refused body was read")

    readline = read


@pytest.mark.safeguard("reshard-117")
@pytest.mark.django_db
def test_django_refuses_from_the_headers_before_csrf_reads_the_body():
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = "a" * 32
    form: dict[str, Any] = {
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "wsgi.input": Unreadable(),
    }
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({"CONTENT_LENGTH": "2000000"}, 413, admission.too_large(MAX).message),
        ({"CONTENT_LENGTH": "10", "HTTP_TRANSFER_ENCODING": "chunked"}, 411, None),
        ({"CONTENT_LENGTH": "10", "HTTP_EXPECT": "later"}, 417, None),
        ({"CONTENT_LENGTH": "ten"}, 400, admission.BAD_LENGTH.message),
    ]
    for extra, status, message in cases:
        for path in ("/admin/login/", "/api/v1/warehouses"):
            response = client.generic("POST", path, **form, **extra)
            assert response.status_code == status, (path, extra, response.content[:300])
            assert response["Content-Type"] == "application/json"
            if message:
                assert response.json() == {"error": message}
    # Within the limit the request goes on to CSRF as before (no token in the form: 403).
    response = client.post("/admin/login/", {"username": "u", "password": "p"})
    assert response.status_code == 403
    assert b"CSRF" in response.content
