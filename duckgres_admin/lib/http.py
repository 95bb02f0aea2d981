"""The product's seam for outbound HTTP (design §2): the strict transport of
:mod:`duckgres_cli.http`, which the ``duckgres`` command-line client ships so that it needs
neither Django nor Celery (docs/cli.md). The probes, the runner's password pull and the signed
webhook delivery import it from here, never from the client package, so this module stays the
one place the control plane's domains reach HTTP through (import-linter).

The invariants are the transport's own (see that module): no redirect is ever followed, no proxy
variable is honoured, TLS >= 1.2 with the certificate checked against the pin or the URL's host,
one ``timeout`` for the whole request, at most :data:`MAX_CONNECTIONS_PER_HOST` requests at once
per host and port.
"""

from __future__ import annotations

from duckgres_cli.http import (
    MAX_CONNECTIONS_PER_HOST,
    HttpResponse,
    HttpTransportError,
    get,
    post,
    request,
    tls_context,
)

__all__ = [
    "MAX_CONNECTIONS_PER_HOST",
    "HttpResponse",
    "HttpTransportError",
    "get",
    "post",
    "request",
    "tls_context",
]
