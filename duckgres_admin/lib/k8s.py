"""The one seam to the Kubernetes API (official client). Nothing else imports ``kubernetes``.

Configuration: ``DUCKGRES_KUBE_API_URL`` (+ ``DUCKGRES_KUBE_TOKEN``, ``DUCKGRES_KUBE_VERIFY_TLS``)
when set, else the in-cluster service account. Errors are raised as ``KubeError`` carrying the
HTTP status, verb and resource, so callers can name what is missing (spec §8 #9).
"""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from kubernetes import client, config, utils


class KubeError(RuntimeError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class MissingKey(KubeError):
    """The Secret exists but has no such key (``status`` stays None: not a 404 of the API)."""


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


def _server_message(exc: Exception) -> str:
    """The API server's Status message (e.g. admission or validation text), if any."""
    body = getattr(exc, "body", None)
    if not body:
        return ""
    try:
        return str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        return ""


def _wrap(exc: Exception, verb: str, resource: str) -> KubeError:
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        # pydantic rejected the body client-side; never echo the input values.
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in errors(include_input=False, include_url=False)
        )
        return KubeError(f"Kubernetes {verb} {resource} refused by the client: {fields}")
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or type(exc).__name__
    detail = _server_message(exc)
    suffix = f": {detail}" if detail else ""
    if status == 403:
        return KubeError(f"Kubernetes forbids {verb} on {resource} (403 Forbidden){suffix}", 403)
    if status == 404:
        return KubeError(f"{resource} not found (404){suffix}", 404)
    if status == 409:
        return KubeError(f"Kubernetes {verb} {resource}: already exists (409){suffix}", 409)
    return KubeError(
        f"Kubernetes {verb} {resource} failed: {status or ''} {reason}{suffix}".strip(), status
    )


def _plain(obj: Any) -> dict[str, Any]:
    """A client model as its wire-form dict (camelCase keys, None fields dropped)."""
    data = api_client().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data if isinstance(data, dict) else {}


# --- pods (the runner pod launcher, spec reshard §4.13) -----------------------------------------


def read_pod(namespace: str, name: str) -> dict[str, Any]:
    """The pod as a wire-form dict; KubeError (status 404 when it does not exist)."""
    try:
        return _plain(core().read_namespaced_pod(name=name, namespace=namespace))
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(exc, "get", f"pods/{name} in namespace {namespace}") from None


def read_pod_or_none(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return read_pod(namespace, name)
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


def create_pod(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    name = (body.get("metadata") or {}).get("name", "")
    try:
        # A dict body is validated strictly by the client (unknown fields refused), unlike
        # V1Pod.from_dict, which drops them silently.
        pod_body: Any = body
        return _plain(core().create_namespaced_pod(namespace=namespace, body=pod_body))
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(exc, "create", f"pods/{name} in namespace {namespace}") from None


def list_pods(namespace: str, label_selector: str) -> list[dict[str, Any]]:
    try:
        result = core().list_namespaced_pod(
            namespace=namespace,
            label_selector=label_selector,
            _request_timeout=CALL_TIMEOUT_SECONDS,
        )
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(exc, "list", f"pods ({label_selector}) in namespace {namespace}") from None
    return [_plain(item) for item in result.items or []]


def delete_pod(namespace: str, name: str, grace_seconds: int | None = None) -> bool:
    """Request deletion (``None``: the pod's own grace period). False when already gone."""
    try:
        core().delete_namespaced_pod(
            name=name, namespace=namespace, grace_period_seconds=grace_seconds
        )
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        wrapped = _wrap(exc, "delete", f"pods/{name} in namespace {namespace}")
        if wrapped.status == 404:
            return False
        raise wrapped from None
    return True


def put_secret(namespace: str, name: str, data: dict[str, str], labels: dict[str, str]) -> None:
    """Create Secret ``name`` holding ``data`` (string values), replacing one of that name.

    Replacement is delete-then-create: the launcher may create and delete Secrets, never update
    or patch them (k8s/base/rbac.yaml). Errors name the Secret, never a value."""
    body: Any = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "labels": labels},
        "stringData": data,
    }
    for attempt in (1, 2):
        try:
            core().create_namespaced_secret(
                namespace=namespace, body=body, _request_timeout=CALL_TIMEOUT_SECONDS
            )
            return
        except Exception as exc:  # noqa: BLE001 - mapped to a named cause
            wrapped = _wrap(exc, "create", f"secrets/{name} in namespace {namespace}")
            if wrapped.status != 409 or attempt == 2:
                raise wrapped from None
        delete_secret(namespace, name)


def delete_secret(namespace: str, name: str) -> bool:
    """Delete Secret ``name``; False when it was gone already."""
    try:
        core().delete_namespaced_secret(
            name=name, namespace=namespace, _request_timeout=CALL_TIMEOUT_SECONDS
        )
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        wrapped = _wrap(exc, "delete", f"secrets/{name} in namespace {namespace}")
        if wrapped.status == 404:
            return False
        raise wrapped from None
    return True


def read_pod_log(namespace: str, name: str, container: str, limit_bytes: int) -> str:
    """The container's log, at most ``limit_bytes`` from the end (``tail`` semantics).

    The API's ``limitBytes`` reads from the start, so the tail is approximated by fetching
    everything up to a generous cap and keeping the last ``limit_bytes``.
    """
    try:
        text = core().read_namespaced_pod_log(name=name, namespace=namespace, container=container)
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(exc, "get", f"pods/{name}/log in namespace {namespace}") from None
    data = (text or "").encode("utf-8", errors="replace")
    return data[-limit_bytes:].decode("utf-8", errors="replace") if limit_bytes > 0 else ""


def read_own_pod() -> dict[str, Any]:
    """This control-plane process's own pod (``POD_NAME`` in ``POD_NAMESPACE``).

    Errors read "cannot read own control-plane pod <name>: <cause>".
    """
    name, namespace = settings.POD_NAME, settings.POD_NAMESPACE
    if not name or not namespace:
        missing = " and ".join(
            v for v, s in (("POD_NAME", name), ("POD_NAMESPACE", namespace)) if not s
        )
        raise KubeError(
            f"cannot read own control-plane pod {name or '<unset>'}: {missing} not set "
            "(set them from the downward API)"
        )
    try:
        return read_pod(namespace, name)
    except KubeError as exc:
        raise KubeError(f"cannot read own control-plane pod {name}: {exc}", exc.status) from None


# --- TokenReview (the password pull's runner identity, safeguard reshard-79) ----------------------


@dataclass(frozen=True)
class TokenReview:
    """What the API server said about a bearer token (``authentication.k8s.io/v1``)."""

    authenticated: bool
    audiences: tuple[str, ...]
    username: str
    extra: dict[str, tuple[str, ...]]
    error: str  # the server's reason for refusing it ('' when authenticated); never the token

    def extra_value(self, key: str) -> str:
        """The single value of ``status.user.extra[key]``, '' when absent or not single."""
        values = self.extra.get(key, ())
        return values[0] if len(values) == 1 else ""


def review_token(token: str, audience: str) -> TokenReview:
    """``POST /apis/authentication.k8s.io/v1/tokenreviews`` with ``spec.audiences=[audience]``.

    Needs ``create`` on ``tokenreviews`` (cluster-scoped). A refused token is a result, not an
    error; a failed call raises :class:`KubeError` whose message never contains the token."""
    body: Any = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": [audience]},
    }
    try:
        result: Any = client.AuthenticationV1Api(api_client()).create_token_review(
            body=body, _request_timeout=CALL_TIMEOUT_SECONDS
        )
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        wrapped = _wrap(exc, "create", "tokenreviews")
        message = str(wrapped).replace(token, "***") if token else str(wrapped)
        raise KubeError(message, wrapped.status) from None
    status = result.status
    user = status.user if status is not None else None
    extra = (user.extra if user is not None else None) or {}
    error = str((status.error if status is not None else "") or "")
    return TokenReview(
        authenticated=bool(status is not None and status.authenticated),
        audiences=tuple((status.audiences if status is not None else None) or ()),
        username=str((user.username if user is not None else "") or ""),
        extra={str(k): tuple(str(v) for v in (vals or ())) for k, vals in extra.items()},
        error=error.replace(token, "***") if token else error,
    )


# --- manifests ------------------------------------------------------------------------------------


def server_dry_run(doc: dict[str, Any], namespace: str) -> None:
    """Validate one manifest document on the API server without persisting it."""
    kind = doc.get("kind", "?")
    name = (doc.get("metadata") or {}).get("name", "?")
    try:
        utils.create_from_dict(  # type: ignore[no-untyped-call]
            api_client(), doc, namespace=namespace, dry_run="All"
        )
    except utils.FailToCreateError as exc:
        causes = "; ".join(_wrap(e, "create", f"{kind}/{name}").args[0] for e in exc.api_exceptions)
        raise KubeError(causes) from None
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(exc, "create", f"{kind}/{name}") from None


def read_secret_key(namespace: str, name: str, key: str) -> str:
    """One key of a Secret, decoded; errors name the reference and cause, never a value."""
    ref = f"k8s:{namespace}/{name}#{key}"
    try:
        secret: Any = core().read_namespaced_secret(
            name=name, namespace=namespace, _request_timeout=CALL_TIMEOUT_SECONDS
        )
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause below
        wrapped = _wrap(exc, "get", f"secrets/{name} in namespace {namespace}")
        raise KubeError(f"secret {ref}: {wrapped}", wrapped.status) from None
    data = secret.data or {}
    if key not in data:
        raise MissingKey(f"secret {ref}: missing key {key}")
    return base64.b64decode(data[key]).decode("utf-8")


# --- Trino pool instances (spec trino-pools §4.4 step 1, §4.13) ----------------------------------

CALL_TIMEOUT_SECONDS = 10.0  # the per-call budget of §4.4 ("each external call is bounded")


def apps() -> client.AppsV1Api:
    return client.AppsV1Api(api_client())


# kind -> (api factory, method suffix)
_KINDS: dict[str, tuple[Any, str]] = {
    "ConfigMap": (core, "namespaced_config_map"),
    "Service": (core, "namespaced_service"),
    "Deployment": (apps, "namespaced_deployment"),
    "Pod": (core, "namespaced_pod"),
}
_RESOURCES = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "Deployment": "deployments",
    "Pod": "pods",
}


def _kind_call(kind: str, verb: str) -> Any:
    if kind not in _KINDS:
        raise KubeError(f"unsupported kind {kind!r} (expected one of {', '.join(sorted(_KINDS))})")
    factory, suffix = _KINDS[kind]
    return getattr(factory(), f"{verb}_{suffix}")


def read_config_map(
    namespace: str, name: str, *, timeout: float = CALL_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """The ConfigMap as a wire-form dict; KubeError (status 404 when it does not exist)."""
    try:
        return _plain(
            core().read_namespaced_config_map(
                name=name, namespace=namespace, _request_timeout=timeout
            )
        )
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(exc, "get", f"configmaps/{name} in namespace {namespace}") from None


def read_object(
    namespace: str, kind: str, name: str, *, timeout: float = CALL_TIMEOUT_SECONDS
) -> dict[str, Any] | None:
    """One Service, Deployment, ConfigMap or Pod as a wire-form dict; None when absent."""
    try:
        return _plain(
            _kind_call(kind, "read")(name=name, namespace=namespace, _request_timeout=timeout)
        )
    except KubeError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        wrapped = _wrap(exc, "get", f"{_RESOURCES[kind]}/{name} in namespace {namespace}")
        if wrapped.status == 404:
            return None
        raise wrapped from None


def list_objects(
    namespace: str, kind: str, label_selector: str, *, timeout: float = CALL_TIMEOUT_SECONDS
) -> list[dict[str, Any]]:
    """Objects of ``kind`` in ``namespace`` matching ``label_selector``, as wire-form dicts."""
    try:
        result = _kind_call(kind, "list")(
            namespace=namespace, label_selector=label_selector, _request_timeout=timeout
        )
    except KubeError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        raise _wrap(
            exc, "list", f"{_RESOURCES[kind]} ({label_selector}) in namespace {namespace}"
        ) from None
    return [_plain(item) for item in result.items or []]


def apply_instance_object(
    namespace: str, doc: dict[str, Any], *, timeout: float = CALL_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """Create ``doc``; when it already exists (409) return the existing object if it is ours.

    "Ours" means it carries every label of ``doc`` with the same value (the instance, pool and
    managed-by labels): a replayed create after a lost response adopts the object it made; any
    other object with that name is refused with a 409 ``KubeError``.
    """
    kind = str(doc.get("kind", ""))
    metadata = doc.get("metadata") or {}
    name = str(metadata.get("name", ""))
    resource = f"{_RESOURCES.get(kind, kind)}/{name} in namespace {namespace}"
    try:
        created = _kind_call(kind, "create")(
            namespace=namespace, body=doc, _request_timeout=timeout
        )
        return _plain(created)
    except KubeError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        wrapped = _wrap(exc, "create", resource)
        if wrapped.status != 409:
            raise wrapped from None
    existing = read_object(namespace, kind, name, timeout=timeout)
    if existing is None:
        raise KubeError(f"Kubernetes create {resource}: conflict, then not found on read-back", 409)
    labels = (existing.get("metadata") or {}).get("labels") or {}
    wanted = metadata.get("labels") or {}
    if any(labels.get(k) != v for k, v in wanted.items()):
        raise KubeError(
            f"Kubernetes create {resource}: an object with this name exists and is not this "
            "instance's (labels differ); refusing to adopt it",
            409,
        )
    return existing


def delete_object(
    namespace: str, kind: str, name: str, uid: str, *, timeout: float = CALL_TIMEOUT_SECONDS
) -> bool:
    """Delete exactly the object with ``uid`` (UID precondition). False when already gone.

    A precondition failure (the name now belongs to another object) raises a 409 KubeError.
    Dependents (ReplicaSets, pods) are left to the garbage collector (background propagation).
    """
    if not uid:
        raise KubeError(f"refusing to delete {kind} {name} in namespace {namespace} without a UID")
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=uid), propagation_policy="Background"
    )
    try:
        _kind_call(kind, "delete")(
            name=name,
            namespace=namespace,
            body=options,
            _request_timeout=timeout,
            _preload_content=False,  # the answer (object or Status) is not needed
        )
    except KubeError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a named cause
        wrapped = _wrap(exc, "delete", f"{_RESOURCES[kind]}/{name} in namespace {namespace}")
        if wrapped.status == 404:
            return False
        if wrapped.status == 409:
            raise KubeError(
                f"Kubernetes delete {_RESOURCES[kind]}/{name} in namespace {namespace} refused: "
                f"the UID precondition {uid} does not match (409)",
                409,
            ) from None
        raise wrapped from None
    return True


def pod_template_problems(template: dict[str, Any]) -> list[str]:
    """Client-side strict check of a PodTemplateSpec-shaped dict (unknown fields, wrong types).

    Returns one "<path>: <message>" per problem, never echoing input values; no API call.
    """
    try:
        client.V1PodTemplateSpec.model_validate(template)
    except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, reported field by field
        errors = getattr(exc, "errors", None)
        if not callable(errors):
            return [f"not a valid pod template ({type(exc).__name__})"]
        return [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in errors(include_input=False, include_url=False)
        ]
    return []
