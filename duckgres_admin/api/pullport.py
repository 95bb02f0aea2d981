"""The password-pull port (safeguard reshard-79): one listener for one route.

With ``DUCKGRES_PASSWORD_PULL_PORT`` set, gunicorn listens on it next to the main port
(``duckgres_admin/gunicorn_conf.py``) and the password URL names it (``reshard/start/stash.py``).
The ``duckgres-admin-api-ingress`` NetworkPolicy admits only runner pods to it. This middleware
makes the split hold inside the process: a request that arrived on the pull port may reach the
password route and nothing else, and the password route answers only requests that arrived on
the pull port. Both refusals are a plain 404 written nowhere (no identity was proven yet). It
runs right after WhiteNoise, so the public ``/static/`` files (no identity, no data) are the
one thing the pull port also serves; no session, view or admin page is reached there.

The port is the one the connection was accepted on: gunicorn sets ``SERVER_PORT`` from the
listening socket (never from the ``Host`` header) for TCP listeners, and the shipped
configuration enables no PROXY protocol. With the setting at 0 nothing is checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

PASSWORD_ROUTE = re.compile(r"^/api/v1/reshards/[0-9]+/password/?$")


def on_pull_port(request: HttpRequest) -> bool:
    port = int(settings.DUCKGRES_PASSWORD_PULL_PORT)
    return bool(port) and str(request.META.get("SERVER_PORT", "")) == str(port)


class PullPortMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if int(settings.DUCKGRES_PASSWORD_PULL_PORT):
            is_route = PASSWORD_ROUTE.match(request.path_info) is not None
            if on_pull_port(request) != is_route:
                response = JsonResponse({"error": "not found"}, status=404)
                response["Cache-Control"] = "no-store"
                return response
        return self.get_response(request)
