"""The one seam to the Kubernetes API (official client). Nothing else imports ``kubernetes``.

Configuration: ``DUCKGRES_KUBE_API_URL`` (+ ``DUCKGRES_KUBE_TOKEN``, ``DUCKGRES_KUBE_VERIFY_TLS``)
when set, else the in-cluster service account. Errors are raised as ``KubeError`` carrying the
HTTP status, verb and resource, so callers can name what is missing (spec §8 #9).
"""

from __future__ import annotations

import base64
import functools
from typing import Any

from django.conf import settings
from kubernetes import client, config


class KubeError(RuntimeError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@functools.lru_cache(maxsize=1)
def api_client() -> client.ApiClient:
    if settings.DUCKGRES_KUBE_API_URL:
        cfg = client.Configuration()
        cfg.host = settings.DUCKGRES_KUBE_API_URL
        cfg.verify_ssl = settings.DUCKGRES_KUBE_VERIFY_TLS
        if settings.DUCKGRES_KUBE_TOKEN:
            cfg.api_key = {"authorization": f"Bearer {settings.DUCKGRES_KUBE_TOKEN}"}
        return client.ApiClient(cfg)
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def core() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def _wrap(exc: Exception, verb: str, resource: str) -> KubeError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or type(exc).__name__
    if status == 403:
        return KubeError(f"Kubernetes forbids {verb} on {resource} (403 Forbidden)", 403)
    if status == 404:
        return KubeError(f"{resource} not found (404)", 404)
    return KubeError(
        f"Kubernetes {verb} {resource} failed: {status or ''} {reason}".strip(), status
    )


def read_secret_key(namespace: str, name: str, key: str) -> str:
    """One key of a Secret, decoded; errors name the reference and cause, never a value."""
    ref = f"k8s:{namespace}/{name}#{key}"
    try:
        secret: Any = core().read_namespaced_secret(name=name, namespace=namespace)
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause below
        wrapped = _wrap(exc, "get", f"secrets/{name} in namespace {namespace}")
        raise KubeError(f"secret {ref}: {wrapped}", wrapped.status) from None
    data = secret.data or {}
    if key not in data:
        raise KubeError(f"secret {ref}: missing key {key}")
    return base64.b64decode(data[key]).decode("utf-8")
