"""The restore test's sandbox pod (``reshard.launchers.sandbox_pod``; safeguard reshard-139) on
the real kube-apiserver (marker ``kube``): what the pod holds, how its exit code decides, and
that nothing is left. There is no kubelet here: the test writes the container's termination
into the pod's status as the kubelet would."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import pytest

from duckgres_admin.lib import k8s
from duckgres_admin.models import Warehouse
from reshard.engines.restore import sandbox
from reshard.engines.restore.stream import RestoreError
from reshard.launchers import sandbox_pod

pytestmark = [pytest.mark.kube, pytest.mark.django_db]
PASSWORD = "scratch-pw-" + "x" * 20


@pytest.fixture
def cluster(kube, settings, s3_bucket, monkeypatch) -> Any:
    """The pod launcher's test cluster, with the S3 server the session is minted on."""
    for name, value in s3_bucket.env().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = s3_bucket.endpoint_url
    settings.DUCKGRES_AWS_REGION = s3_bucket.region
    return kube


def job() -> sandbox.Job:
    return sandbox.Job(
        bucket="b", key="_reshard_catalog_backups/op-5-x.dump", etag="e", sha256="0" * 64,
        size=10, version_id="", host="db.example", port=5432, database="scratch",
        user="scratch", sslmode="verify-full", server_major=15, timeout_seconds=30.0,
    )  # fmt: skip


def terminate_when_seen(kube, op_id: int, code: int, message: str, seen: list[dict[str, Any]]):
    name = sandbox_pod.pod_name(op_id)

    def work() -> None:
        for _ in range(100):
            pods = kube.core.list_namespaced_pod(
                kube.namespace, field_selector=f"metadata.name={name}"
            )
            if pods.items:
                seen.append(kube.api_client.sanitize_for_serialization(pods.items[0]))
                secret = kube.core.read_namespaced_secret(name, kube.namespace).data
                seen.append({k: base64.b64decode(v).decode() for k, v in secret.items()})
                status = {"phase": "Failed" if code else "Succeeded", "containerStatuses": [{
                    "name": "restore-stream", "image": "i", "imageID": "", "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "message": message}},
                }]}  # fmt: skip
                kube.core.patch_namespaced_pod_status(name, kube.namespace, {"status": status})
                return
            time.sleep(0.1)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


@pytest.mark.safeguard("reshard-139")
def test_the_sandbox_pod_holds_one_object_and_the_scratch_login_and_its_exit_code_decides(
    cluster, s3_bucket
) -> None:
    kube = cluster
    wh = Warehouse.objects.create(org_id="org-sandbox", data_bucket=s3_bucket.bucket)
    seen: list[dict[str, Any]] = []
    thread = terminate_when_seen(kube, 5, sandbox.EXIT_ARCHIVE, "pg_restore: error: boom", seen)
    with pytest.raises(RestoreError) as caught:
        sandbox_pod.restore(job(), PASSWORD, wh, 5, should_stop=lambda: False)
    thread.join()
    assert caught.value.archive_fault is True
    assert str(caught.value) == "pg_restore: error: boom"
    pod, secret = seen
    spec = pod["spec"]
    assert pod["metadata"]["labels"] == {"app": "duckgres-restore-test", "duckgres-op-id": "5"}
    assert spec["serviceAccountName"] == "duckgres-admin-runner"
    assert spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] == 30 + sandbox_pod.START_ALLOWANCE_SECONDS
    [container] = spec["containers"]
    assert container["command"] == ["python", "manage.py", "restore_stream"]
    env = {e["name"]: e for e in container["env"]}
    assert json.loads(env[sandbox.JOB_VAR]["value"])["key"] == job().key
    refs = {n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if "valueFrom" in e}
    assert set(refs) == {sandbox.PASSWORD_VAR, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                         "AWS_SESSION_TOKEN"}  # fmt: skip
    assert {r["name"] for r in refs.values()} == {sandbox_pod.pod_name(5)}
    # Nothing of the control plane: no config store, shared secret, signing key or broker.
    assert set(env) - set(refs) <= {*sandbox.PASSED_SETTINGS, sandbox.JOB_VAR}
    assert secret["scratch-password"] == PASSWORD
    assert secret["aws-access-key-id"] != "testing"  # a session for the one object
    assert PASSWORD not in json.dumps(pod)
    # Nothing is left.
    assert not kube.core.list_namespaced_secret(
        kube.namespace, label_selector="app=duckgres-restore-test"
    ).items
    left = kube.core.list_namespaced_pod(kube.namespace, label_selector="app=duckgres-restore-test")
    assert all(p.metadata.deletion_timestamp for p in left.items)


@pytest.mark.safeguard("reshard-139")
def test_a_restored_exit_returns_and_a_stop_ends_the_pod(cluster, s3_bucket) -> None:
    kube = cluster
    wh = Warehouse.objects.create(org_id="org-sandbox-2", data_bucket=s3_bucket.bucket)
    thread = terminate_when_seen(kube, 6, sandbox.EXIT_RESTORED, "restored 10 bytes", [])
    assert sandbox_pod.restore(job(), PASSWORD, wh, 6, should_stop=lambda: False) == (
        "restored 10 bytes"
    )
    thread.join()
    started = time.monotonic()
    with pytest.raises(RestoreError, match="the restore was stopped") as caught:
        sandbox_pod.restore(job(), PASSWORD, wh, 7, should_stop=lambda: True)
    assert caught.value.archive_fault is False
    assert time.monotonic() - started < 10
    # A killed run's leftovers are swept at the next run.
    left = sandbox_pod.pod_name(8)
    labels = {"app": "duckgres-restore-test", "duckgres-op-id": "8"}
    k8s.put_secret(kube.namespace, left, {"scratch-password": PASSWORD}, labels)
    kube.core.create_namespaced_pod(kube.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": left, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    })  # fmt: skip
    assert left in sandbox_pod.sweep()
    assert not kube.core.list_namespaced_secret(
        kube.namespace, label_selector="app=duckgres-restore-test"
    ).items
