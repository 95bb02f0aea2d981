"""The admin's answer to a failed CSRF check: Django's reason plus the setting that fixes it.

Two failures are what a first look meets: the CSRF cookie never came back because it is Secure
and the page was reached over plain HTTP at a name the browser does not treat as secure (not
``localhost``), and an origin that the check does not trust behind a TLS proxy. Each names its
fix; every other reason is Django's own text. Request values are escaped, never trusted.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponseForbidden
from django.middleware.csrf import REASON_NO_CSRF_COOKIE
from django.utils.html import format_html

_PLAIN_HTTP = (
    "This admin sets its cookies Secure (DUCKGRES_SECURE_COOKIES), and this page was reached over "
    "plain HTTP at {host}, so the browser never sent the CSRF cookie back. Reach the admin over "
    "HTTPS (behind a TLS proxy that sets the DUCKGRES_SECURE_PROXY_SSL_HEADER header), through "
    "kubectl port-forward at http://localhost:8080, or set DUCKGRES_SECURE_COOKIES=false for a "
    'plain-HTTP address on a trusted network (docs/configuration.md, "Behind a proxy / TLS").'
)
_ORIGIN = (
    "The browser's origin is not one this admin trusts. Behind a TLS proxy, add its https:// "
    "origin to DUCKGRES_CSRF_TRUSTED_ORIGINS and set DUCKGRES_SECURE_PROXY_SSL_HEADER "
    '(docs/configuration.md, "Behind a proxy / TLS").'
)


def explanation(request: HttpRequest, reason: str) -> str:
    """The fix for ``reason`` on this request, or "" when Django's reason says it all."""
    if reason == REASON_NO_CSRF_COOKIE and settings.CSRF_COOKIE_SECURE and not request.is_secure():
        return _PLAIN_HTTP.format(host=request.get_host())
    if reason.startswith("Origin checking failed"):
        return _ORIGIN
    return ""


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponseForbidden:
    body = format_html(
        "<!doctype html><title>403 Forbidden</title><h1>Forbidden (403)</h1>"
        "<p>CSRF verification failed: {}</p><p>{}</p>",
        reason,
        explanation(request, reason),
    )
    return HttpResponseForbidden(body)
