"""A runner's S3 session used from a pod of the one-node cluster (safeguard reshard-137). Named
to sort before test_reshard_pods.py, whose node drain must stay the last test of the suite.

The deployed control plane's S3 server is moto, which accepts any credentials, so this test
takes its S3 from the Ceph RGW of ``.ci/rgw.sh`` (which enforces session policies; the role
``duckgres-data`` is set up there), reached from the pod network through a forwarder on the pod
bridge. The session is minted by the product's own code (``s3scope.session_policy``,
``lib.s3.mint_session``) exactly as a launcher mints it for operation 77, and handed to a pod in
the runner namespace through a Secret, as the launcher does: from there it reads its own
operation's backup and gets ``AccessDenied`` on another operation's and on a listing.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from duckgres_admin.lib.s3 import S3, mint_session
from reshard.engines.backup import KEY_PREFIX
from reshard.launchers.s3scope import session_policy
from tests.fixtures.availability import RGW_URL_DEFAULT, rgw_unavailable
from tests.fixtures.pods import (
    NODE_IP,
    RUNNERS_NAMESPACE,
    Deployed,
    kubectl,
    kubectl_json,
    wait_until,
)
from tests.fixtures.runner import TcpProxy

pytestmark = [pytest.mark.pods, pytest.mark.timeout(600)]
ROLE = "arn:aws:iam:::role/duckgres-data"
FORWARD_PORT = 17480

PROBE = """
import json, os, boto3, botocore.exceptions
s3 = boto3.client("s3", endpoint_url=os.environ["PROBE_S3"], region_name="us-east-1",
                  config=boto3.session.Config(s3={"addressing_style": "path"}))
bucket = os.environ["PROBE_BUCKET"]
def read(key):
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
out = {}
for what, call in (
    ("own", lambda: read(os.environ["PROBE_OWN"])),
    ("other", lambda: read(os.environ["PROBE_OTHER"])),
    ("list", lambda: str(len(s3.list_objects_v2(Bucket=bucket).get("Contents", [])))),
):
    try:
        out[what] = call()
    except botocore.exceptions.ClientError as exc:
        out[what] = exc.response["Error"]["Code"]
print("PROBE " + json.dumps(out), flush=True)
"""


@pytest.fixture
def rgw_on_the_pod_network() -> Iterator[str]:
    """RGW (loopback only) reachable from pods at http://NODE_IP:FORWARD_PORT."""
    reason = rgw_unavailable()
    assert reason is None, reason  # the pods suite runs in CI, where .ci/services.sh starts it
    host, port = RGW_URL_DEFAULT.split("//", 1)[1].split(":")
    proxy = TcpProxy(host, int(port), listen=(NODE_IP, FORWARD_PORT))
    try:
        yield f"http://{NODE_IP}:{FORWARD_PORT}"
    finally:
        proxy.cut()


@pytest.mark.safeguard("reshard-137")
def test_a_runner_session_in_a_pod_reads_its_own_operations_backup_and_no_other(
    deployed: Deployed, rgw_on_the_pod_network: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # the control plane's keys on RGW
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    settings.DUCKGRES_S3_ENDPOINT_URL = RGW_URL_DEFAULT
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    admin = S3()
    bucket = f"pods-{secrets.token_hex(4)}"
    admin.client.create_bucket(Bucket=bucket)
    own, other = (
        f"{KEY_PREFIX}op-77-20261206T000000Z.dump",
        f"{KEY_PREFIX}op-7-20261206T000000Z.dump",
    )
    for key in (own, other):
        admin.client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    policy = session_policy(bucket=bucket, op_id=77, restore=None, partition="aws")
    session = mint_session(
        region="us-east-1", role_arn=ROLE, session_name="duckgres-reshard-op-77",
        policy=policy, seconds=900,
    )  # fmt: skip
    name = f"duckgres-s3-probe-{secrets.token_hex(3)}"
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": RUNNERS_NAMESPACE},
        "stringData": {"aws-access-key-id": session.access_key_id,
                       "aws-secret-access-key": session.secret_access_key,
                       "aws-session-token": session.session_token},
    }  # fmt: skip
    refs = [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}
        for var, key in (("AWS_ACCESS_KEY_ID", "aws-access-key-id"),
                         ("AWS_SECRET_ACCESS_KEY", "aws-secret-access-key"),
                         ("AWS_SESSION_TOKEN", "aws-session-token"))
    ]  # fmt: skip
    plain = {"PROBE_S3": rgw_on_the_pod_network, "PROBE_BUCKET": bucket, "PROBE_OWN": own,
             "PROBE_OTHER": other, "HOME": "/tmp"}  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": RUNNERS_NAMESPACE},
        "spec": {
            "restartPolicy": "Never", "serviceAccountName": "duckgres-admin-runner",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "probe", "image": "localhost/duckgres-admin:0.1.0",
                "imagePullPolicy": "Never", "command": ["python", "-c", PROBE],
                "env": [*refs, *({"name": k, "value": v} for k, v in plain.items())],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True},
            }],
        },
    }  # fmt: skip
    kubectl("apply", "-f", "-", input=json.dumps(secret))
    kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        done = wait_until(
            lambda: (p := kubectl_json("-n", RUNNERS_NAMESPACE, "get", "pod", name))["status"].get(
                "phase") in ("Succeeded", "Failed") and p,
            "the S3 probe pod to finish", 180,
        )  # fmt: skip
        log = kubectl("-n", RUNNERS_NAMESPACE, "logs", name)
        assert done["status"]["phase"] == "Succeeded", log
    finally:
        kubectl("-n", RUNNERS_NAMESPACE, "delete", "pod,secret", name, "--wait=false", check=False)
        for key in (own, other):
            admin.delete_object(bucket, key)
        admin.client.delete_bucket(Bucket=bucket)
    found = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    assert found == {"own": own, "other": "AccessDenied", "list": "AccessDenied"}, found
    assert session.secret_access_key not in json.dumps(pod)
    assert os.environ.get("AWS_SESSION_TOKEN") is None
