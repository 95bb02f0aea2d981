"""Request admission: what a request may cost before anything reads its body (issue 25 item 4).

The API's gunicorn worker (``duckgres_admin/gunicorn_conf.py``) collects every request in its
main loop before a thread takes it; this module is the pure part of that: reading a request head
(:func:`inspect`), the budget of buffered bytes (:class:`BufferBudget`), the routes that get the
reserved threads (:func:`priority_route`), and the canned answers. ``BodyAdmissionMiddleware``
gives the same 413/411/417 answers inside Django (the test client, ``runserver``), placed before
``CsrfViewMiddleware`` so no refused body is ever read. docs/configuration.md "Slow clients"
and "Request admission" are the operator's account.

Invariants:

- A body is read only if its ``Content-Length`` is at most ``DUCKGRES_API_MAX_BODY_BYTES``;
  without one there is no body (``Transfer-Encoding`` answers 411), an ``Expect`` other than
  ``100-continue`` answers 417, a head over :data:`MAX_HEAD_BYTES` 431: all decided from the head
  alone, nothing of a refused body is read.
- Every byte the worker's main loop holds for a request (head, and the whole announced body,
  reserved when the head arrives) is charged to one :class:`BufferBudget` until the request's
  thread is done with it. A head and a small body (at most :data:`SMALL_BODY_BYTES`) are never
  refused: there are at most ``WORKER_CONNECTIONS`` of them, so they are bounded by
  :func:`reserve_bytes`; a larger body is admitted only while the budget keeps that reserve
  free, else 503. So the total never passes the budget, and a probe, a lease grant or a
  password pull always finds room however many large bodies are stalled.
- Nothing here reads a setting or a clock: the worker and the middleware pass them in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

# A request head (request line and header fields) larger than this is refused with 431. Far
# above what our clients and a browser with its cookies send.
MAX_HEAD_BYTES = 32 * 1024
# A body this small is never refused for the budget (lease grants, logins, most API writes).
SMALL_BODY_BYTES = 8 * 1024
# The worker's open-connection limit (gunicorn ``worker_connections``), and the slack above it
# (gthread checks the limit once per loop, between accepts on each of its listeners).
WORKER_CONNECTIONS = 1000
CONNECTION_SLACK = 16


def reserve_bytes() -> int:
    """The part of the budget that heads and small bodies may need at most, and that a large
    body therefore never takes: one head and one small body per possible connection."""
    return (WORKER_CONNECTIONS + CONNECTION_SLACK) * (MAX_HEAD_BYTES + SMALL_BODY_BYTES)


def minimum_budget(max_body: int) -> int:
    """The smallest budget under which a body of ``max_body`` bytes can still be admitted."""
    return reserve_bytes() + MAX_HEAD_BYTES + max_body


@dataclass(frozen=True)
class Refusal:
    """An answer given from the head alone; the connection is closed after it."""

    status: int
    reason: str  # the metric label: too_large, length_required, expectation, head_too_large, ...
    message: str
    retry_after: int | None = None


@dataclass(frozen=True)
class Head:
    """A request head that is admitted: the bytes up to the body, and the body's length."""

    target: str  # the request-target as sent (latin-1), '' when the request line is malformed
    head_bytes: int  # leading empty lines, request line, fields and the blank line
    body_bytes: int
    expect_continue: bool  # an HTTP/1.1 ``Expect: 100-continue``: the client waits for "100"

    @property
    def total(self) -> int:
        return self.head_bytes + self.body_bytes


def too_large(max_body: int) -> Refusal:
    # The API's own 413 text (duckgres_admin/api/base.py body_too_large), for every route.
    return Refusal(
        413,
        "too_large",
        f"invalid body: body: larger than {max_body} bytes (DUCKGRES_API_MAX_BODY_BYTES); send "
        "a smaller JSON document",
    )


LENGTH_REQUIRED = Refusal(
    411,
    "length_required",
    "a request body needs a Content-Length header: Transfer-Encoding (chunked) bodies are not "
    "accepted; send the body with its length",
)
HEAD_TOO_LARGE = Refusal(
    431,
    "head_too_large",
    f"request head larger than {MAX_HEAD_BYTES} bytes; send fewer or shorter header fields",
)
BAD_LENGTH = Refusal(
    400,
    "bad_length",
    "invalid Content-Length header: send exactly one, a decimal number of bytes",
)
BUSY = Refusal(
    503,
    "budget",
    "server busy: the request bodies this replica is receiving fill its buffer "
    "(DUCKGRES_API_BUFFER_BUDGET_BYTES); retry shortly",
    retry_after=1,
)


def expectation_failed(value: str) -> Refusal:
    shown = value if len(value) <= 64 else value[:64] + "..."
    return Refusal(
        417,
        "expectation",
        f"unsupported Expect header {shown!r}: only 100-continue is understood; drop the header",
    )


_FIELD = re.compile(rb"^([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*(.*?)[ \t]*$")


def inspect(data: bytes | bytearray, max_body: int) -> Head | Refusal | None:
    """What to do with a connection's bytes so far: ``None`` while the head is incomplete, a
    :class:`Refusal` to answer at once, or the admitted :class:`Head` (its body still to come).

    A head this reader cannot make sense of (a malformed request line or field) is admitted with
    no body: every byte of it is there, so gunicorn's parser answers it (400) without reading."""
    start = 0
    while data.startswith(b"\r\n", start):  # RFC 9112 §2.2: empty lines before a request
        start += 2
    end = data.find(b"\r\n\r\n", start)
    if end < 0:
        return HEAD_TOO_LARGE if len(data) - start > MAX_HEAD_BYTES else None
    if end - start > MAX_HEAD_BYTES:
        return HEAD_TOO_LARGE
    request_line, *lines = bytes(data[start:end]).split(b"\r\n")
    parts = request_line.split(b" ")
    target = parts[1].decode("latin-1") if len(parts) == 3 else ""
    http11 = len(parts) == 3 and parts[2] == b"HTTP/1.1"
    lengths: list[bytes] = []
    expect_continue = False
    for line in lines:
        field = _FIELD.match(line)
        if field is None:
            return Head("", end + 4, 0, False)  # obs-fold, a space before the colon: 400
        name, value = field.group(1).lower(), field.group(2)
        if name == b"transfer-encoding":
            return LENGTH_REQUIRED
        if name == b"content-length":
            lengths.append(value)
        elif name == b"expect":
            text = value.decode("latin-1")
            if text.lower() != "100-continue":
                return expectation_failed(text)
            expect_continue = http11  # RFC 9110 §10.1.1: ignored in an HTTP/1.0 request
    if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
        return BAD_LENGTH
    length = int(lengths[0]) if lengths else 0
    if length > max_body:
        return too_large(max_body)
    return Head(target, end + 4, length, expect_continue and length > 0)


# --- the reserved threads -----------------------------------------------------------------------
# Lease grants, reads, renewals and releases (the data plane), the runners' password pulls, and
# the kubelet's probes: a liveness probe that queues behind admin pages restarts the pod, and the
# password stash (spec reshard §4.17) with it.
PRIORITY_ROUTE = re.compile(
    r"^/(?:livez|readyz|api/v1/reshards/[0-9]+/password"
    r"|api/v1/warehouses/[^/]+/leases(?:/[0-9]+(?:/renew)?)?)/?$"
)
_ABSOLUTE_FORM = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]*")


def priority_route(target: str) -> bool:
    """Whether a request-target is one of the routes of the reserved threads: matched on the
    percent-decoded path, as Django routes it (the query is ignored)."""
    path = _ABSOLUTE_FORM.sub("", target, count=1).split("?", 1)[0]
    return PRIORITY_ROUTE.match(unquote(path, errors="replace")) is not None


# --- the budget --------------------------------------------------------------------------------
class BufferBudget:
    """Bytes of requests a worker holds (main loop and threads), across all its connections.

    Used from the worker's main loop only (gthread runs its completion callbacks there): no lock.
    Each connection keeps what it is charged and hands it back with :meth:`charge` ``(held, 0)``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.large_limit = limit - reserve_bytes()
        self.used = 0

    def charge(self, held: int, wanted: int, *, large: bool = False) -> bool:
        """Move one connection's charge from ``held`` to ``wanted`` bytes; ``False`` (nothing
        changed) if that passes the budget, or for a ``large`` body the budget less the
        reserve."""
        after = self.used - held + wanted
        if wanted > held and after > (self.large_limit if large else self.limit):
            return False
        self.used = after
        return True


# --- the answers -------------------------------------------------------------------------------
_REASONS = {400: "Bad Request", 411: "Length Required", 413: "Content Too Large"}
_REASONS |= {417: "Expectation Failed", 431: "Request Header Fields Too Large"}
_REASONS |= {503: "Service Unavailable"}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def response_bytes(refusal: Refusal) -> bytes:
    """The whole HTTP/1.1 response of a refusal, with ``Connection: close``."""
    body = json.dumps({"error": refusal.message}).encode()
    lines = [
        f"HTTP/1.1 {refusal.status} {_REASONS[refusal.status]}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
    ]
    if refusal.retry_after is not None:
        lines.append(f"Retry-After: {refusal.retry_after}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def refusal_for(meta: Mapping[str, object], max_body: int) -> Refusal | None:
    """The same refusals from a WSGI environ (the server has parsed the head)."""
    if meta.get("HTTP_TRANSFER_ENCODING"):
        return LENGTH_REQUIRED
    expect = str(meta.get("HTTP_EXPECT") or "")
    if expect and expect.lower() != "100-continue":
        return expectation_failed(expect)
    length = str(meta.get("CONTENT_LENGTH") or "").strip()
    if length and not length.isdigit():
        return BAD_LENGTH
    if length and int(length) > max_body:
        return too_large(max_body)
    return None


class BodyAdmissionMiddleware:
    """413/411/417 (and 400 for a malformed length) from the request's headers, before the CSRF
    middleware or a view reads the body. Under the shipped gunicorn the worker has answered these
    already; this keeps every other server (``runserver``, the test client) to the same rules."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from django.conf import settings
        from django.http import JsonResponse

        refusal = refusal_for(request.META, int(settings.DUCKGRES_API_MAX_BODY_BYTES))
        if refusal is None:
            return self.get_response(request)
        response = JsonResponse({"error": refusal.message}, status=refusal.status)
        response["Cache-Control"] = "no-store"
        return response
