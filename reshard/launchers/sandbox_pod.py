"""The restore test's sandbox in a pod (``reshard.engines.restore.sandbox``; safeguard reshard-139).

One pod per restore test, ``duckgres-restore-test-op<id>`` in the runner namespace (label
``app=duckgres-restore-test``, which the janitor's runner listing never selects), run as the
runner's rightless account with no API token. Its secrets — the scratch login's password and
an S3 session that may read the one object (``s3scope.for_object``) — are in a Secret of the
same name, referenced by ``secretKeyRef``; everything else in its environment is plain.

Invariants:

- **Bounded wait.** The worker polls the pod every :data:`POLL_SECONDS` until its container
  terminates, the job's timeout plus :data:`START_ALLOWANCE_SECONDS` (scheduling, image pull)
  passes, or ``should_stop`` (the size guard) turns true; it logs every phase it observes. The
  pod's own ``activeDeadlineSeconds`` bounds it should the worker die.
- **Nothing is left.** The pod (no grace) and the Secret are deleted when the wait ends,
  whatever the outcome; :func:`sweep` deletes what a killed worker left, at the next run
  (runs hold the restore-test lock, so no live sandbox is swept).
- **The outcome is the exit code** (``reshard.engines.restore.sandbox``): 0 restored, 3 the
archive's fault,
  anything else an attempt that failed; the termination message only explains it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from duckgres_admin.lib import k8s
from duckgres_admin.models import Warehouse
from reshard.engines.restore import sandbox
from reshard.engines.restore.stream import RestoreError
from reshard.launchers import s3scope
from reshard.launchers.base import OP_ID_LABEL, LauncherError, runner_namespace
from reshard.launchers.podspec import S3_SECRET_KEYS, build_sandbox_pod, s3_secret_data

APP_LABEL = "duckgres-restore-test"
COMMAND = ("python", "manage.py", "restore_stream")
PASSWORD_KEY = "scratch-password"
POLL_SECONDS = 1.0
START_ALLOWANCE_SECONDS = 120
_log = logging.getLogger("duckgres.reshard.restore_test")


def pod_name(op_id: int) -> str:
    return f"duckgres-restore-test-op{op_id}"


def _namespace() -> str:
    namespace = runner_namespace()
    if not namespace:
        raise LauncherError("no namespace for the restore test's sandbox pod (POD_NAMESPACE)")
    return namespace


def _environment(job: sandbox.Job, secret: str, keys: list[str]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": n, "value": os.environ[n]} for n in sandbox.PASSED_SETTINGS if n in os.environ
    ]
    env.append({"name": sandbox.JOB_VAR, "value": job.to_json()})
    refs = {sandbox.PASSWORD_VAR: PASSWORD_KEY} | {
        var: key for var, key in S3_SECRET_KEYS.items() if key in keys
    }
    env.extend(
        {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for var, key in refs.items()
    )
    return env


def _secret_data(job: sandbox.Job, password: str, wh: Warehouse, name: str) -> dict[str, str]:
    """The password, and the S3 credentials: a session for the one object, or (ambient) the
    control plane's own keys."""
    session = s3scope.for_object(wh, job.key, name)
    environment = session.environment() if session is not None else os.environ
    return {PASSWORD_KEY: password, **s3_secret_data(environment)}


def restore(
    job: sandbox.Job,
    password: str,
    wh: Warehouse,
    op_id: int,
    *,
    should_stop: Callable[[], bool],
) -> str:
    """Run the sandbox for ``job``; its message when it restored, else ``RestoreError``
    (``archive_fault`` only for exit 3). ``LauncherError`` when it could not be started."""
    namespace, name = _namespace(), pod_name(op_id)
    labels = {"app": APP_LABEL, OP_ID_LABEL: str(op_id)}
    data = _secret_data(job, password, wh, name)
    try:
        own = k8s.read_own_pod()
        k8s.put_secret(namespace, name, data, labels)
        body = build_sandbox_pod(
            name=name,
            labels=labels,
            own_pod=own,
            env=_environment(job, name, list(data)),
            command=COMMAND,
            machine=platform.machine(),
            service_account=settings.DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT,
            deadline_seconds=int(job.timeout_seconds) + START_ALLOWANCE_SECONDS,
        )
        body["metadata"]["namespace"] = namespace
        k8s.create_pod(namespace, body)
    except k8s.KubeError as exc:
        _forget(namespace, name)
        raise LauncherError(
            f"starting the restore test's sandbox pod {name} failed: {exc}"
        ) from None
    try:
        code, message = _wait(namespace, name, job.timeout_seconds, should_stop)
    finally:
        _forget(namespace, name)
    if code == sandbox.EXIT_RESTORED:
        return message
    if code == sandbox.EXIT_ARCHIVE:
        raise RestoreError(message, archive_fault=True)
    raise RestoreError(f"the sandbox pod {name} exited with code {code}: {message}")


def _wait(
    namespace: str, name: str, timeout: float, should_stop: Callable[[], bool]
) -> tuple[int, str]:
    deadline = time.monotonic() + timeout + START_ALLOWANCE_SECONDS
    seen = ""
    while True:
        pod = k8s.read_pod_or_none(namespace, name)
        if pod is None:
            raise RestoreError(f"the sandbox pod {name} vanished before it finished")
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            state = container.get("state") or {}
            terminated = state.get("terminated")
            if terminated:
                message = " ".join(str(terminated.get("message") or "").split())
                return int(terminated.get("exitCode", -1)), message[: sandbox.MESSAGE_LIMIT]
            waiting = (state.get("waiting") or {}).get("reason", "")
            now = f"{status.get('phase', '')} {waiting}".strip()
            if now != seen:
                _log.info("restore test sandbox pod %s: %s", name, now)
                seen = now
        if status.get("phase") == "Failed":  # e.g. activeDeadlineSeconds, before any container
            raise RestoreError(f"the sandbox pod {name} failed: {status.get('reason', '')}")
        if should_stop():
            raise RestoreError("the restore was stopped")
        if time.monotonic() > deadline:
            raise RestoreError(f"the sandbox pod {name} ran past the restore's deadline ({seen})")
        time.sleep(POLL_SECONDS)


def _forget(namespace: str, name: str) -> None:
    with contextlib.suppress(k8s.KubeError):
        k8s.delete_pod(namespace, name, 0)
    with contextlib.suppress(k8s.KubeError):
        k8s.delete_secret(namespace, name)


def sweep() -> list[str]:
    """Delete the sandbox pods (and their Secrets) a killed run left; their names."""
    namespace = _namespace()
    try:
        pods = k8s.list_pods(namespace, f"app={APP_LABEL}")
    except k8s.KubeError as exc:
        _log.warning("restore test: listing leftover sandbox pods failed: %s", exc)
        return []
    names = [str((p.get("metadata") or {}).get("name", "")) for p in pods]
    for name in names:
        _forget(namespace, name)
    return names
