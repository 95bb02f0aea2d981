"""Kubernetes probes for the API replica.

``/livez`` answers as long as the process serves requests (no dependencies: a config-store
outage must not make Kubernetes restart every replica). ``/readyz`` also runs ``SELECT 1`` on
the config store, so a replica that cannot reach it stops receiving traffic.
"""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        return JsonResponse(
            {"status": "unavailable", "error": f"config store: {type(exc).__name__}"}, status=503
        )
    return JsonResponse({"status": "ok"})
