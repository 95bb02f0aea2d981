"""The Kubernetes pod launcher (spec reshard §4.13): one bare pod per operation, no Job.

The pod is derived from the control plane's own pod (image, service account, scheduling, env
references); ``podspec`` builds it, ``duckgres_admin.lib.k8s`` talks to the API server. Nothing
here waits for a pod to run: the op row's heartbeat is the only liveness signal.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from duckgres_admin.lib import k8s, secretrefs
from duckgres_admin.models import ReshardOperation
from reshard.launchers import capture, login, s3scope
from reshard.launchers.base import (
    LOGIN_APP_LABEL,
    OP_ID_LABEL,
    PHASES,
    RUNNER_APP_LABEL,
    SPAWNED_AT_ANNOTATION,
    LauncherError,
    RunnerObject,
    RunnerStatus,
    StillTerminating,
    runner_name,
    runner_namespace,
    runner_secret_refs,
)
from reshard.launchers.podspec import (
    CONTAINER_NAME,
    LOGIN_SECRET_KEY,
    build_runner_pod,
    login_secret_name,
    parse_spawned_at,
    relocate_env,
    s3_secret_data,
)

_log = logging.getLogger("duckgres.reshard.launcher")
ABSENT = RunnerStatus(phase="absent")


def _namespace() -> str:
    """Where runner pods and their Secrets live (``runner_namespace``)."""
    namespace = runner_namespace()
    if not namespace:
        raise LauncherError(
            "neither DUCKGRES_RESHARD_RUNNER_NAMESPACE nor POD_NAMESPACE is set: the pod "
            "launcher needs a namespace for runner pods"
        )
    return namespace


def _own_pod() -> dict[str, Any]:
    try:
        return k8s.read_own_pod()
    except k8s.KubeError as exc:
        raise LauncherError(str(exc)) from None


def resolve_control_plane_image() -> str:
    """The control-plane pod's first container image, pinned to the digest its node resolved
    (the start API records it on the op, and every runner of the op, relaunches included, runs
    exactly it: a tag re-pushed meanwhile, or an upgrade that rolls the control plane, never
    changes the code an operation runs under)."""
    pod = _own_pod()
    containers = (pod.get("spec") or {}).get("containers") or []
    image = containers[0].get("image", "") if containers else ""
    if not image:
        raise LauncherError(
            f"cannot read own control-plane pod {settings.POD_NAME}: it has no container image"
        )
    name = containers[0].get("name", "")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    image_id = next((str(s.get("imageID") or "") for s in statuses if s.get("name") == name), "")
    return pinned_image(str(image), image_id)


def pinned_image(image: str, image_id: str) -> str:
    """``image`` by digest: ``<repository>@sha256:…`` from the container status's ``imageID``
    (``repo@sha256:…``, or ``docker-pullable://repo@sha256:…``). An image already pinned, or a
    status without a repository digest (a node that reports only the local image id), keeps
    ``image`` as it is."""
    if "@" in image:
        return image
    _, at, digest = image_id.rpartition("@")
    if not at or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return image
    last = image.rsplit("/", 1)[-1]
    repository = image.rsplit(":", 1)[0] if ":" in last else image
    return f"{repository}@{digest}"


def status_of(pod: dict[str, Any]) -> RunnerStatus:
    """The launcher view of a pod object (spec §3.3)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase not in PHASES:
        phase = "Unknown"
    reason = ""
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if container.get("name") == CONTAINER_NAME and terminated:
            code = terminated.get("exitCode")
            text = terminated.get("reason") or ""
            reason = f"{text} (exit code {code})" if text and code is not None else text
            reason = reason or (f"exit code {code}" if code is not None else "")
    if not reason:
        reason = status.get("reason") or ""  # e.g. Evicted, with no container state
    return RunnerStatus(
        phase=phase,
        terminating=bool(meta.get("deletionTimestamp")),
        spawned_at=parse_spawned_at((meta.get("annotations") or {}).get(SPAWNED_AT_ANNOTATION)),
        reason=reason,
        uid=str(meta.get("uid") or ""),
    )


def _read_secret_or_none(namespace: str, name: str, key: str) -> str | None:
    try:
        return k8s.read_secret_key(namespace, name, key)
    except k8s.KubeError as exc:
        if exc.status == 404 or isinstance(exc, k8s.MissingKey):
            return None
        raise LauncherError(
            f"copying Secret {namespace}/{name} key {key} for the runner failed: {exc}"
        ) from None


def _relocate(body: dict[str, Any], own_namespace: str, secret: str, data: dict[str, str]) -> None:
    """A runner pod in its own namespace: the control plane's references become the per-op
    Secret's keys or plain non-secret values (``podspec.relocate_env``)."""
    container = body["spec"]["containers"][0]
    container["env"], copied = relocate_env(
        container["env"],
        own_namespace=own_namespace,
        login_secret=secret,
        environ=os.environ,
        read_secret=_read_secret_or_none,
    )
    data.update(copied)


class PodLauncher:
    kind = "pod"

    def create(self, op: ReshardOperation, replace: bool) -> RunnerStatus:
        namespace = _namespace()
        name = runner_name(op.id)
        own_pod = _own_pod()
        existing = self._read(namespace, name)
        if existing is not None:
            current = status_of(existing)
            if not (replace and current.exited and not current.terminating):
                raise StillTerminating(current)
            try:  # normal grace; the exited runner is fenced by the epoch anyway
                k8s.delete_pod(namespace, name)
            except k8s.KubeError as exc:
                _log.warning("deleting exited runner pod %s failed: %s", name, exc)
        s3 = s3scope.for_launch(op)
        # The session beside the login: one Secret, one lifecycle.
        data = s3_secret_data(s3.environment()) if s3 is not None else {}
        secret = login_secret_name(op.id)
        body = build_runner_pod(
            op_id=op.id,
            own_pod=own_pod,
            runner_image=op.runner_image,
            password_url=op.password_url,
            cpu=settings.DUCKGRES_RESHARD_POD_CPU,
            memory=settings.DUCKGRES_RESHARD_POD_MEMORY,
            machine=platform.machine(),
            now=datetime.now(UTC),
            service_account=settings.DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT,
            secret_refs=runner_secret_refs(op),
            pull_audience=settings.DUCKGRES_PASSWORD_PULL_AUDIENCE,
            login_secret=secret,
            s3_session=(s3.description if s3 is not None else "") if s3scope.scoped() else None,
        )
        own_namespace = str((own_pod.get("metadata") or {}).get("namespace") or "")
        if namespace != own_namespace:
            _relocate(body, own_namespace, secret, data)
            body["spec"]["containers"][0]["env"].append(
                {"name": secretrefs.CONTROL_NAMESPACE_VAR, "value": own_namespace}
            )
        body["metadata"]["namespace"] = namespace
        # Minted only once no runner of this op is alive: a new password would refuse its
        # next connection (login module docstring).
        data[LOGIN_SECRET_KEY] = login.mint(op.id)
        try:
            k8s.put_secret(
                namespace,
                secret,
                data,
                {"app": LOGIN_APP_LABEL, OP_ID_LABEL: str(op.id)},
            )
        except k8s.KubeError as exc:
            raise LauncherError(f"storing the runner's config-store login failed: {exc}") from None
        try:
            created = k8s.create_pod(namespace, body)
        except k8s.KubeError as exc:
            if exc.status == 409:
                raise StillTerminating() from None
            raise LauncherError(f"creating runner pod {name} failed: {exc}") from None
        _log.info("runner pod %s created in namespace %s", name, namespace)
        return status_of(created)

    def get_phase(self, op_id: int) -> RunnerStatus:
        pod = self._read(_namespace(), runner_name(op_id))
        return ABSENT if pod is None else status_of(pod)

    def list(self) -> list[RunnerObject]:
        try:
            pods = k8s.list_pods(_namespace(), f"app={RUNNER_APP_LABEL}")
        except k8s.KubeError as exc:
            raise LauncherError(f"listing runner pods failed: {exc}") from None
        return [
            RunnerObject(
                name=str((pod.get("metadata") or {}).get("name", "")),
                op_id_label=str(
                    ((pod.get("metadata") or {}).get("labels") or {}).get(OP_ID_LABEL, "")
                ),
                status=status_of(pod),
            )
            for pod in pods
        ]

    def delete(self, op_id: int, grace_seconds: int | None = None) -> None:
        """Request deletion; ``None`` keeps the pod's own grace (600 s). Gone already is fine."""
        name = runner_name(op_id)
        try:
            k8s.delete_pod(_namespace(), name, grace_seconds)
        except k8s.KubeError as exc:
            raise LauncherError(f"deleting runner pod {name} failed: {exc}") from None

    def forget_login(self, op_id: int) -> None:
        """Delete the Secret holding the op's config-store login (gone already is fine)."""
        name = login_secret_name(op_id)
        try:
            k8s.delete_secret(_namespace(), name)
        except k8s.KubeError as exc:
            raise LauncherError(f"deleting Secret {name} failed: {exc}") from None

    def capture_log(self, op_id: int, status: RunnerStatus) -> bool:
        return capture.capture_log(op_id, status, self.read_log)

    def read_log(self, op_id: int, limit_bytes: int = 5 * 1024 * 1024) -> str:
        name = runner_name(op_id)
        try:
            return k8s.read_pod_log(_namespace(), name, CONTAINER_NAME, limit_bytes)
        except k8s.KubeError as exc:
            raise LauncherError(f"reading the log of runner pod {name} failed: {exc}") from None

    @staticmethod
    def _read(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return k8s.read_pod_or_none(namespace, name)
        except k8s.KubeError as exc:
            raise LauncherError(f"reading runner pod {name} failed: {exc}") from None
