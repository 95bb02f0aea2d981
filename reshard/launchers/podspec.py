"""The runner pod spec, built from the control plane's own pod (spec reshard §4.13). Pure: no I/O.

Input and output are Kubernetes API dicts in wire form (camelCase keys), as read from and sent
to the API server. The builder copies only what the table in §4.13 names; anything it refuses
raises ``LauncherError`` with an operator-facing message that never contains a secret value.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.base.times import rfc3339_seconds
from duckgres_admin.lib import secretrefs
from reshard.launchers.base import (
    DEFAULT_GRACE_SECONDS,
    OP_ID_LABEL,
    RUNNER_APP_LABEL,
    SPAWNED_AT_ANNOTATION,
    LauncherError,
    runner_name,
)
from reshard.launchers.envcontract import (
    ALLOWLIST,
    NEVER_PASSED,
    OP_ID_VAR,
    PASSWORD_URL_VAR,
    PULL_TOKEN_DIR,
    PULL_TOKEN_FILE,
    PULL_TOKEN_SECONDS,
    SECRET_BEARING,
)

CONTAINER_NAME = "reshard-runner"
CONFIG_STORE_VAR = "DUCKGRES_CONFIG_STORE"
LOGIN_SECRET_KEY = "config-store-dsn"  # key of the per-operation login Secret
# Keys of the same Secret holding the launch's operation-scoped S3 session (s3scope).
S3_SECRET_KEYS: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "aws-access-key-id",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-access-key",
    "AWS_SESSION_TOKEN": "aws-session-token",
}


def s3_secret_data(environment: Mapping[str, str]) -> dict[str, str]:
    """The AWS variables of ``environment`` (a minted session's, or this process's own) keyed
    as a per-op Secret stores them (``S3_SECRET_KEYS``)."""
    return {key: environment[var] for var, key in S3_SECRET_KEYS.items() if var in environment}


COMMAND = ["python", "manage.py", "reshard_runner"]
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
ARCH_LABEL = "kubernetes.io/arch"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_DROPPED_TOLERATION_PREFIX = "node.kubernetes.io/"
_DOWNWARD = (
    ("POD_NAME", "metadata.name"),
    ("POD_UID", "metadata.uid"),
    ("NODE_NAME", "spec.nodeName"),
    ("POD_NAMESPACE", "metadata.namespace"),
)
# Kubernetes resource.Quantity: <signed number><suffix>; runner sizes must also be positive.
_QUANTITY_RE = re.compile(
    r"^\+?(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)


TMP_VOLUME = "tmp"
PULL_TOKEN_VOLUME = "password-pull-token"
# Pod-level fields a runner pod never carries, whatever the control-plane pod has: they would
# fail the `restricted` Pod Security level (docs/kubernetes.md "Pod Security").
_UNSAFE_POD_FIELDS = ("sysctls", "windowsOptions")


def restricted_container_context(own: dict[str, Any]) -> dict[str, Any]:
    """The runner container's securityContext: the control-plane container's, made to pass the
    `restricted` Pod Security level whatever it said (no privilege, no escalation, no capability,
    non-root, a read-only root filesystem, the runtime's default seccomp profile)."""
    ctx = copy.deepcopy(own)
    ctx.pop("privileged", None)
    ctx.pop("procMount", None)
    ctx["allowPrivilegeEscalation"] = False
    ctx["capabilities"] = {"drop": ["ALL"]}
    ctx["readOnlyRootFilesystem"] = True
    ctx["runAsNonRoot"] = True
    if ctx.get("runAsUser") == 0:
        ctx.pop("runAsUser")
    if (ctx.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        ctx["seccompProfile"] = {"type": "RuntimeDefault"}
    return ctx


def restricted_pod_context(own: dict[str, Any]) -> dict[str, Any]:
    """The runner pod's securityContext, likewise: the control-plane pod's (user, group,
    fsGroup), non-root, RuntimeDefault seccomp unless a Localhost profile is named."""
    ctx = {k: copy.deepcopy(v) for k, v in own.items() if k not in _UNSAFE_POD_FIELDS}
    ctx["runAsNonRoot"] = True
    if ctx.get("runAsUser") == 0:
        ctx.pop("runAsUser")
    if (ctx.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        ctx["seccompProfile"] = {"type": "RuntimeDefault"}
    return ctx


def runner_labels(op_id: int) -> dict[str, str]:
    return {"app": RUNNER_APP_LABEL, OP_ID_LABEL: str(op_id)}


def node_arch(machine: str) -> str:
    """``platform.machine()`` mapped to the ``kubernetes.io/arch`` vocabulary."""
    return _ARCH.get(machine.lower(), machine.lower())


def validate_quantity(name: str, value: str) -> str:
    """A positive Kubernetes quantity, else "invalid reshard pod CPU/memory …" naming ``name``."""
    match = _QUANTITY_RE.match(value.strip())
    positive = False
    if match:
        try:
            positive = Decimal(match["num"]) > 0
        except InvalidOperation:
            positive = False
    if not match or not positive:
        raise LauncherError(
            f"invalid reshard pod CPU/memory: {name}={value!r} is not a positive Kubernetes "
            "quantity (e.g. 2, 500m, 8Gi)"
        )
    return value.strip()


def _dsn_has_password(dsn: str) -> bool:
    try:
        return bool(conninfo_to_dict(dsn).get("password"))
    except Exception:  # noqa: BLE001 - unparsable: cannot prove there is no password
        return True


def copy_allowlisted_env(container: dict[str, Any]) -> list[dict[str, Any]]:
    """The allowlisted entries of the container's ``env``, verbatim and in their order.

    Secret-bearing names must be ``secretKeyRef``s (``DUCKGRES_CONFIG_STORE`` may be a literal
    DSN without a password); anything else refuses the launch. ``envFrom`` is never copied.
    """
    allowed = set(ALLOWLIST) - NEVER_PASSED
    out: list[dict[str, Any]] = []
    for entry in container.get("env") or []:
        name = entry.get("name", "")
        if name not in allowed:
            continue
        if name in SECRET_BEARING:
            value_from = entry.get("valueFrom") or {}
            is_ref = bool(value_from.get("secretKeyRef")) and "value" not in entry
            literal_ok = (
                name == "DUCKGRES_CONFIG_STORE"
                and not value_from
                and not _dsn_has_password(entry.get("value") or "")
            )
            if not (is_ref or literal_ok):
                raise LauncherError(
                    f"{name} must be a secretKeyRef on the control-plane container to be passed "
                    "to runner pods"
                )
        out.append(copy.deepcopy(entry))
    return out


def mounted_secret_env(refs: Sequence[str], namespace: str) -> list[dict[str, Any]]:
    """``MOUNTED_MODE_VAR=1`` and one optional ``secretKeyRef`` variable per distinct ``k8s:``
    reference in ``namespace`` (a pod can reference no other namespace's Secret). Denied and
    malformed references are skipped: the runner reports them when it resolves them."""
    out: list[dict[str, Any]] = [{"name": secretrefs.MOUNTED_MODE_VAR, "value": "1"}]
    seen: set[str] = set()
    for ref in refs:
        if not ref or not ref.startswith("k8s:"):
            continue
        try:
            parsed = secretrefs.parse(ref, launcher="pod")
        except secretrefs.SecretRefError:
            continue
        if parsed.namespace != namespace or secretrefs.denied_reason(parsed):
            continue
        variable = secretrefs.mounted_variable(parsed)
        if variable in seen:
            continue
        seen.add(variable)
        out.append(
            {
                "name": variable,
                "valueFrom": {
                    "secretKeyRef": {"name": parsed.name, "key": parsed.key, "optional": True}
                },
            }
        )
    return out


def relocate_env(
    env: list[dict[str, Any]],
    *,
    own_namespace: str,
    login_secret: str,
    environ: Mapping[str, str],
    read_secret: Callable[[str, str, str], str | None],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``env`` for a runner pod in another namespace than the control plane's, where no
    reference to the control plane's Secrets and ConfigMaps resolves (docs/kubernetes.md "The
    runner namespace"). Returns the new ``env`` and the values to add to ``login_secret``:

    - a ``secretKeyRef`` (an allowlisted secret of the control-plane container, or a mounted
      ``k8s:`` reference) is read from ``own_namespace`` with ``read_secret(namespace, name,
      key)`` (None: the Secret or key does not exist, so the variable is left out, as an
      optional reference would be) and becomes a ``secretKeyRef`` to the same variable's key
      in ``login_secret``: never a value in the pod spec;
    - a ``configMapKeyRef`` (never secret) becomes the plain value this container has in
      ``environ`` (left out when it has none);
    - values, the downward API and references to ``login_secret`` itself stay as they are.
    """
    out: list[dict[str, Any]] = []
    data: dict[str, str] = {}
    for entry in env:
        name = str(entry.get("name", ""))
        value_from = entry.get("valueFrom") or {}
        secret_ref = value_from.get("secretKeyRef")
        if secret_ref and secret_ref.get("name") != login_secret:
            value = read_secret(own_namespace, str(secret_ref["name"]), str(secret_ref["key"]))
            if value is None:
                continue
            data[name] = value
            out.append(
                {"name": name, "valueFrom": {"secretKeyRef": {"name": login_secret, "key": name}}}
            )
        elif value_from.get("configMapKeyRef"):
            if name in environ:
                out.append({"name": name, "value": environ[name]})
        else:
            out.append(entry)
    return out, data


def pull_token_volume(audience: str) -> dict[str, Any]:
    """The projected ServiceAccount token of the password pull (audience ``audience`` only)."""
    return {
        "name": PULL_TOKEN_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": audience,
                        "expirationSeconds": PULL_TOKEN_SECONDS,
                        "path": PULL_TOKEN_FILE,
                    }
                }
            ]
        },
    }


def login_secret_name(op_id: int) -> str:
    """The Secret holding the operation's config-store login DSN (one per operation)."""
    return f"{runner_name(op_id)}-login"


def _rfc3339(moment: datetime) -> str:
    return rfc3339_seconds(moment)


def build_runner_pod(
    *,
    op_id: int,
    own_pod: dict[str, Any],
    runner_image: str,
    password_url: str,
    cpu: str,
    memory: str,
    machine: str,
    now: datetime,
    service_account: str = "",
    secret_refs: Sequence[str] = (),
    pull_audience: str = "",
    login_secret: str,
    s3_session: str | None = None,
) -> dict[str, Any]:
    """The runner pod manifest for ``op_id``, derived from the control plane's ``own_pod``.

    The runner has no Kubernetes API access: it runs as ``service_account`` (the runner's own,
    no RBAC) with no token mounted, and each ``k8s:`` reference of ``secret_refs`` in the pod's
    namespace reaches it as an optional ``secretKeyRef`` variable (``secretrefs``' mounted
    mode); a reference in another namespace cannot be mounted and fails in the runner with a
    message naming it.

    With a ``password_url`` (and ``pull_audience``) the pod also gets a projected
    ServiceAccount token for that audience only (600 s, rotated by the kubelet), mounted
    read-only at ``PULL_TOKEN_DIR``: its pull credential, which the API checks by TokenReview
    against this pod (safeguard reshard-79). It is not the automounted API token (still off):
    no other audience, including the Kubernetes API itself, accepts it.

    ``DUCKGRES_CONFIG_STORE`` is never the control plane's: it references key
    ``LOGIN_SECRET_KEY`` of ``login_secret``, the operation's own login (``login`` module).

    ``s3_session``: None copies the control plane's AWS variables like every allowlisted one
    (``DUCKGRES_RUNNER_S3_CREDENTIALS=ambient``). A string drops them: when non-empty (the
    session's description, ``s3scope``) the three AWS variables reference the session's keys
    (``S3_SECRET_KEYS``) in ``login_secret`` and ``DUCKGRES_RESHARD_S3_SESSION`` carries the
    description; when empty the runner gets no AWS credentials at all."""
    cpu = validate_quantity("DUCKGRES_RESHARD_POD_CPU", cpu)
    memory = validate_quantity("DUCKGRES_RESHARD_POD_MEMORY", memory)
    own_meta = own_pod.get("metadata") or {}
    own_spec = own_pod.get("spec") or {}
    own = _own_container(own_meta, own_spec)
    image = runner_image or own.get("image") or ""
    if not image:
        raise LauncherError("no runner image: the op has none and the control-plane pod has none")
    env = _runner_env(
        own,
        op_id=op_id,
        password_url=password_url,
        secret_refs=secret_refs,
        namespace=own_meta.get("namespace") or "",
        login_secret=login_secret,
    )
    if s3_session is not None:
        env = _scoped_s3_env(env, s3_session, login_secret)
    mounts, volumes = _runner_storage(password_url, pull_audience)
    container = _runner_container(own, image=image, env=env, cpu=cpu, memory=memory, mounts=mounts)
    spec = _runner_pod_spec(
        own_spec,
        container=container,
        volumes=volumes,
        machine=machine,
        service_account=service_account,
    )
    metadata = _runner_metadata(op_id, own_meta, now)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _own_container(own_meta: dict[str, Any], own_spec: dict[str, Any]) -> dict[str, Any]:
    """The control-plane pod's first container, else a ``LauncherError`` naming the pod."""
    containers = own_spec.get("containers") or []
    if not containers:
        raise LauncherError(
            f"own control-plane pod {own_meta.get('name', '')} has no containers: "
            "cannot derive the runner pod"
        )
    own: dict[str, Any] = containers[0]
    return own


def _runner_env(
    own: dict[str, Any],
    *,
    op_id: int,
    password_url: str,
    secret_refs: Sequence[str],
    namespace: str,
    login_secret: str,
) -> list[dict[str, Any]]:
    """The runner container's ``env``: allowlisted copies, its own config-store login, op id,
    downward API, pull, secrets."""
    login = {"secretKeyRef": {"name": login_secret, "key": LOGIN_SECRET_KEY}}
    env = [
        {"name": CONFIG_STORE_VAR, "valueFrom": login} if e.get("name") == CONFIG_STORE_VAR else e
        for e in copy_allowlisted_env(own)
    ]
    if not any(e.get("name") == CONFIG_STORE_VAR for e in env):
        env.append({"name": CONFIG_STORE_VAR, "valueFrom": login})
    env.append({"name": OP_ID_VAR, "value": str(op_id)})
    env.extend(
        {"name": var, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
        for var, path in _DOWNWARD
    )
    if password_url:
        env.append({"name": PASSWORD_URL_VAR, "value": password_url})
    env.extend(mounted_secret_env(secret_refs, namespace))
    return env


def _scoped_s3_env(
    env: list[dict[str, Any]], description: str, login_secret: str
) -> list[dict[str, Any]]:
    """``env`` without the control plane's AWS variables, plus the operation's session."""
    kept = [e for e in env if e.get("name") not in S3_SECRET_KEYS]
    if not description:
        return kept
    kept.extend(
        {"name": var, "valueFrom": {"secretKeyRef": {"name": login_secret, "key": key}}}
        for var, key in S3_SECRET_KEYS.items()
    )
    kept.append({"name": "DUCKGRES_RESHARD_S3_SESSION", "value": description})
    return kept


def _runner_storage(
    password_url: str, pull_audience: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runner's ``(volumeMounts, volumes)``: the /tmp emptyDir, plus the pull token."""
    # The root filesystem is read-only: scratch space is this emptyDir only.
    mounts: list[dict[str, Any]] = [
        {"name": TMP_VOLUME, "mountPath": "/tmp"}  # noqa: S108 - an emptyDir
    ]
    volumes: list[dict[str, Any]] = [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}]
    if password_url and pull_audience:
        mounts.append({"name": PULL_TOKEN_VOLUME, "mountPath": PULL_TOKEN_DIR, "readOnly": True})
        volumes.append(pull_token_volume(pull_audience))
    return mounts, volumes


def _runner_resources(cpu: str, memory: str) -> dict[str, Any]:
    """Guaranteed-QoS resources: requests equal to limits for ``cpu`` and ``memory``."""
    return {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu, "memory": memory},
    }


def _runner_container(
    own: dict[str, Any],
    *,
    image: str,
    env: list[dict[str, Any]],
    cpu: str,
    memory: str,
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The runner container, with the pull policy and working directory of ``own``."""
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(COMMAND),
        "env": env,
        "resources": _runner_resources(cpu, memory),
        "securityContext": restricted_container_context(own.get("securityContext") or {}),
        "volumeMounts": mounts,
    }
    if own.get("imagePullPolicy"):
        container["imagePullPolicy"] = own["imagePullPolicy"]
    if own.get("workingDir"):
        container["workingDir"] = own["workingDir"]
    return container


def _runner_node_selector(own_spec: dict[str, Any], machine: str) -> dict[str, Any]:
    """The control plane's ``nodeSelector``, pinned to this machine's architecture by default."""
    node_selector = dict(own_spec.get("nodeSelector") or {})
    node_selector.setdefault(ARCH_LABEL, node_arch(machine))
    return node_selector


def _runner_tolerations(own_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The control plane's tolerations, minus the node-lifecycle (``node.kubernetes.io/``) ones."""
    return [
        copy.deepcopy(t)
        for t in own_spec.get("tolerations") or []
        if not (t.get("key") or "").startswith(_DROPPED_TOLERATION_PREFIX)
    ]


def _runner_pod_spec(
    own_spec: dict[str, Any],
    *,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    machine: str,
    service_account: str,
) -> dict[str, Any]:
    """The runner pod's ``spec``: never restarted, no API token, restricted security context."""
    node_selector = _runner_node_selector(own_spec, machine)
    tolerations = _runner_tolerations(own_spec)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": DEFAULT_GRACE_SECONDS,
        "containers": [container],
        "nodeSelector": node_selector,
        "volumes": volumes,
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    spec["automountServiceAccountToken"] = False
    if tolerations:
        spec["tolerations"] = tolerations
    if own_spec.get("imagePullSecrets"):
        spec["imagePullSecrets"] = copy.deepcopy(own_spec["imagePullSecrets"])
    spec["securityContext"] = restricted_pod_context(own_spec.get("securityContext") or {})
    return spec


def _runner_metadata(op_id: int, own_meta: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The runner pod's ``metadata``: name, labels, annotations, the control plane's namespace."""
    metadata: dict[str, Any] = {
        "name": runner_name(op_id),
        "labels": runner_labels(op_id),
        "annotations": {
            DO_NOT_DISRUPT_ANNOTATION: "true",
            SPAWNED_AT_ANNOTATION: _rfc3339(now),
        },
    }
    if own_meta.get("namespace"):
        metadata["namespace"] = own_meta["namespace"]
    return metadata


def build_sandbox_pod(
    *,
    name: str,
    labels: dict[str, str],
    own_pod: dict[str, Any],
    env: list[dict[str, Any]],
    command: Sequence[str],
    machine: str,
    service_account: str,
    deadline_seconds: int,
) -> dict[str, Any]:
    """A one-shot pod of the control plane's image that runs ``command`` with exactly ``env``
    (the restore test's sandbox, ``reshard.launchers.sandbox_pod``): the runner pod's placement,
    restricted security contexts and account, no API token, a /tmp emptyDir, a short grace and
    ``activeDeadlineSeconds``. Small and fixed resources: it only pipes bytes into pg_restore."""
    own_meta = own_pod.get("metadata") or {}
    own_spec = own_pod.get("spec") or {}
    own = _own_container(own_meta, own_spec)
    image = own.get("image") or ""
    if not image:
        raise LauncherError("no sandbox image: the control-plane pod has none")
    mounts, volumes = _runner_storage("", "")
    container = _runner_container(own, image=image, env=env, cpu="500m", memory="512Mi",
                                  mounts=mounts)  # fmt: skip
    container["name"] = "restore-stream"
    container["command"] = list(command)
    spec = _runner_pod_spec(own_spec, container=container, volumes=volumes, machine=machine,
                            service_account=service_account)  # fmt: skip
    spec["terminationGracePeriodSeconds"] = 5
    spec["activeDeadlineSeconds"] = deadline_seconds
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": spec}  # fmt: skip


def parse_spawned_at(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
