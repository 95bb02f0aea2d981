"""The one seam for outbound HTTP (design §2): a small ``GET`` over ``urllib.request``.

Non-2xx answers are returned, not raised, so callers decide what is final. Transport problems
(refused, timeout, TLS) raise :class:`HttpTransportError` with the cause only. Bodies are read up
to ``max_bytes``; a longer body is reported as truncated.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field


class HttpTransportError(OSError):
    """The request did not produce an HTTP answer (connection refused, timeout, TLS…)."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = field(repr=False)
    truncated: bool = False


def get(
    url: str, *, headers: Mapping[str, str], timeout: float, max_bytes: int = 1024 * 1024
) -> HttpResponse:
    """``GET url``; returns the status and at most ``max_bytes`` of the body."""
    if not url.startswith(("http://", "https://")):
        raise HttpTransportError("only http:// and https:// URLs are allowed")
    request = urllib.request.Request(url, headers=dict(headers), method="GET")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            body = response.read(max_bytes + 1)
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        body = exc.read(max_bytes + 1) if exc.fp is not None else b""
        status = int(exc.code)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HttpTransportError(f"{type(exc).__name__}: {reason}") from None
    return HttpResponse(status=status, body=body[:max_bytes], truncated=len(body) > max_bytes)
