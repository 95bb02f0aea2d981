"""The pod launcher against the real kube-apiserver (spec reshard §4.13; safeguards 26, 40, 50, 58).

There is no scheduler or kubelet: pods stay Pending unless a test patches their status or binds
them to a (nonexistent) node, which is what makes a default-grace delete leave them terminating.
"""

from __future__ import annotations

import base64
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.lib import k8s, secretrefs
from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.launchers import login
from reshard.launchers.base import LauncherError, StillTerminating
from reshard.launchers.pod import PodLauncher, pinned_image, resolve_control_plane_image
from tests.fixtures.kube_pods import (
    OWN_IMAGE,
    bind_to_node,
    control_plane_env,
    control_plane_pod,
    read,
    set_status,
)

# The launcher mints each op's config-store login (real roles, rolled back with the test).
pytestmark = [pytest.mark.kube, pytest.mark.django_db]


def new_op(**fields: Any) -> ReshardOperation:
    """An unsaved op: the pod launcher reads its id, runner_image, password_url and the
    references it mounts (none here: no warehouse or store rows exist for it)."""
    return ReshardOperation(id=secrets.randbelow(10**9) + 1, launcher="pod", **fields)


def runner_pods(kube) -> list[str]:
    pods = kube.core.list_namespaced_pod(kube.namespace, label_selector="app=duckgres-reshard")
    return sorted(p.metadata.name for p in pods.items)


@pytest.mark.safeguard("reshard-137")
@pytest.mark.parametrize("scope", ["operation", "ambient"])
def test_the_runner_pod_gets_its_operations_s3_session_through_its_login_secret(
    kube, s3_bucket, monkeypatch, settings, scope
):
    for name, value in s3_bucket.env().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = s3_bucket.endpoint_url
    settings.DUCKGRES_AWS_REGION = s3_bucket.region
    settings.DUCKGRES_RUNNER_S3_CREDENTIALS = scope
    warehouse = Warehouse.objects.create(
        org_id=f"org-{secrets.token_hex(4)}", data_bucket=s3_bucket.bucket
    )
    op = new_op(org_id=warehouse.org_id)
    PodLauncher().create(op, replace=False)
    pod = read(kube, f"duckgres-reshard-op-{op.id}")
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    secret = f"duckgres-reshard-op-{op.id}-login"
    stored = kube.core.read_namespaced_secret(secret, kube.namespace).data
    PodLauncher().forget_login(op.id)
    login.drop(login.role_name(op.id))
    if scope == "ambient":  # the old way, for S3 servers without STS: the control plane's keys
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "duckgres-aws"
        assert "DUCKGRES_RESHARD_S3_SESSION" not in env
        assert "aws-session-token" not in stored
        return
    for var, key in (
        ("AWS_ACCESS_KEY_ID", "aws-access-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-access-key"),
        ("AWS_SESSION_TOKEN", "aws-session-token"),
    ):
        assert env[var]["valueFrom"] == {"secretKeyRef": {"name": secret, "key": key}}
        value = base64.b64decode(stored[key]).decode()
        assert value
        assert value != "testing"
        assert value not in json.dumps(pod)  # the pod spec names the Secret, never a value
    session = env["DUCKGRES_RESHARD_S3_SESSION"]["value"]
    assert f"bucket {s3_bucket.bucket}, own keys _reshard_catalog_backups/op-{op.id}-*" in session


@pytest.mark.safeguard("reshard-138")
def test_a_runner_pod_in_the_runner_namespace_references_only_its_own_operations_secret(
    kube, monkeypatch, settings
):
    """The control plane's Secrets and ConfigMaps do not resolve in the runner namespace: what
    the runner needs of them is copied into its per-op Secret there, never into the spec."""
    from kubernetes import client

    runners = f"{kube.namespace}-runners"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=runners)))
    try:
        settings.DUCKGRES_RESHARD_RUNNER_NAMESPACE = runners
        runner_secret = "runner-" + secrets.token_hex(8)
        tenant_password = "tenant-" + secrets.token_hex(8)
        for name, data in (
            ("duckgres-admin", {"runner-secret": runner_secret, "internal-secret": "no"}),
            ("duckgres-tenant-acme", {"password": tenant_password}),
        ):
            kube.core.create_namespaced_secret(
                kube.namespace,
                client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=data),
            )
        monkeypatch.setenv("DUCKGRES_LOG_LEVEL", "DEBUG")  # this container's ConfigMap value
        tenant_ref = f"k8s:{kube.namespace}/duckgres-tenant-acme#password"
        missing_ref = f"k8s:{kube.namespace}/duckgres-tenant-acme#no-such-key"
        op = new_op(source_password_secret_ref=tenant_ref, target_password_secret_ref=missing_ref)
        PodLauncher().create(op, replace=False)

        name = f"duckgres-reshard-op-{op.id}"
        assert not kube.core.list_namespaced_pod(
            kube.namespace, label_selector="app=duckgres-reshard"
        ).items
        pod = kube.api_client.sanitize_for_serialization(
            kube.core.read_namespaced_pod(name, runners)
        )
        login_secret = f"{name}-login"
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        refs = {
            n: e["valueFrom"]["secretKeyRef"]
            for n, e in env.items()
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        assert refs, env
        assert {r["name"] for r in refs.values()} == {login_secret}  # nothing else resolves
        assert env["DUCKGRES_LOG_LEVEL"] == {"name": "DUCKGRES_LOG_LEVEL", "value": "DEBUG"}
        # `k8s:<prefix>*` entries (endpoint bindings) still mean the control plane's namespace.
        assert env[secretrefs.CONTROL_NAMESPACE_VAR]["value"] == kube.namespace
        tenant_var = secretrefs.mounted_variable(secretrefs.parse(tenant_ref, launcher="pod"))
        gone_var = secretrefs.mounted_variable(secretrefs.parse(missing_ref, launcher="pod"))
        assert gone_var not in env  # absent at launch: the runner names it when it resolves it
        stored = kube.core.read_namespaced_secret(login_secret, runners).data
        assert base64.b64decode(stored[refs["DUCKGRES_RUNNER_SECRET"]["key"]]).decode() == (
            runner_secret
        )
        assert base64.b64decode(stored[refs[tenant_var]["key"]]).decode() == tenant_password
        text = json.dumps(pod)
        for value in (runner_secret, tenant_password, "internal-secret"):
            assert value not in text
        PodLauncher().delete(op.id, grace_seconds=0)
        PodLauncher().forget_login(op.id)
        names = {x.metadata.name for x in kube.core.list_namespaced_secret(runners).items}
        assert login_secret not in names
        login.drop(login.role_name(op.id))
    finally:
        kube.core.delete_collection_namespaced_pod(runners, grace_period_seconds=0)
        kube.core.delete_namespace(runners)


@pytest.mark.safeguard("reshard-26")
@pytest.mark.safeguard("reshard-50")
@pytest.mark.safeguard("reshard-128")
@pytest.mark.safeguard("reshard-133")
def test_the_runner_pod_is_created_field_by_field(kube):
    op = new_op()
    before = datetime.now(UTC) - timedelta(seconds=2)
    status = PodLauncher().create(op, replace=False)

    pod = read(kube, f"duckgres-reshard-op-{op.id}")
    meta, spec = pod["metadata"], pod["spec"]
    assert status.phase == "Pending"
    assert status.uid == meta["uid"]
    assert status.spawned_at is not None
    assert before <= status.spawned_at <= datetime.now(UTC) + timedelta(seconds=2)
    assert meta["namespace"] == kube.namespace
    assert meta["labels"] == {"app": "duckgres-reshard", "duckgres-op-id": str(op.id)}
    assert meta["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert meta["annotations"][
        "duckgres.posthog.com/runner-spawned-at"
    ] == status.spawned_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "ownerReferences" not in meta
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 600
    assert spec["serviceAccountName"] == "duckgres-admin-runner"
    assert spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"]["duckgres.posthog.com/pool"] == "control"
    assert spec["nodeSelector"]["kubernetes.io/arch"] in ("amd64", "arm64")
    # The control plane's node.kubernetes.io/* tolerations are not copied; the apiserver's
    # DefaultTolerationSeconds admission then adds its own not-ready/unreachable ones (300 s).
    tolerations = {t["key"]: t for t in spec["tolerations"]}
    assert tolerations["dedicated"] == {
        "key": "dedicated",
        "operator": "Equal",
        "value": "control",
        "effect": "NoSchedule",
    }
    assert "node.kubernetes.io/disk-pressure" not in tolerations
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert tolerations.get(key, {}).get("tolerationSeconds", 300) == 300
    [container] = spec["containers"]
    assert container["name"] == "reshard-runner"
    assert container["command"] == ["python", "manage.py", "reshard_runner"]
    assert container["image"] == OWN_IMAGE
    assert container["imagePullPolicy"] == "IfNotPresent"
    # The restricted Pod Security level, whatever the control-plane container says.
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }
    env = {e["name"]: e for e in container["env"]}
    assert list(env) == [
        "DJANGO_SETTINGS_MODULE",
        "DUCKGRES_CONFIG_STORE",
        "DUCKGRES_RUNNER_SECRET",
        "DUCKGRES_AWS_REGION",
        "DUCKGRES_LOG_LEVEL",
        "DUCKGRES_RESHARD_OP_ID",
        "POD_NAME",
        "POD_UID",
        "NODE_NAME",
        "POD_NAMESPACE",
        "DUCKGRES_SECRET_REFS_MOUNTED",
    ]
    # Secret-bearing names stay references; nothing carries a value of theirs.
    assert env["DUCKGRES_RUNNER_SECRET"] == {
        "name": "DUCKGRES_RUNNER_SECRET",
        "valueFrom": {"secretKeyRef": {"name": "duckgres-admin", "key": "runner-secret"}},
    }
    # Its own config-store login, in a Secret of its own (safeguard reshard-133).
    assert env["DUCKGRES_CONFIG_STORE"]["valueFrom"] == {
        "secretKeyRef": {"name": f"duckgres-reshard-op-{op.id}-login", "key": "config-store-dsn"}
    }
    stored = kube.core.read_namespaced_secret(f"duckgres-reshard-op-{op.id}-login", kube.namespace)
    dsn = base64.b64decode(stored.data["config-store-dsn"]).decode()
    assert conninfo_to_dict(dsn)["user"] == login.role_name(op.id)
    assert login.role_name(op.id) in login.logins()
    assert stored.metadata.labels == {
        "app": "duckgres-reshard-login", "duckgres-op-id": str(op.id)
    }  # fmt: skip
    PodLauncher().forget_login(op.id)
    PodLauncher().forget_login(op.id)  # gone already: no error
    assert not kube.core.list_namespaced_secret(
        kube.namespace, label_selector=f"duckgres-op-id={op.id}"
    ).items
    # Never the control plane's AWS keys (its container has them from Secret duckgres-aws);
    # this op's warehouse has no bucket, so it gets no S3 session either (safeguard reshard-137).
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert env["DUCKGRES_LOG_LEVEL"]["valueFrom"] == {
        "configMapKeyRef": {"name": "duckgres-admin", "key": "log-level"}
    }
    assert env["DUCKGRES_RESHARD_OP_ID"] == {"name": "DUCKGRES_RESHARD_OP_ID", "value": str(op.id)}
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    for absent in (
        "DUCKGRES_INTERNAL_SECRET",
        "DUCKGRES_DATAPLANE_SECRET",
        "DJANGO_SECRET_KEY",  # a runner signs nothing (issue 25 item 3)
        "DUCKGRES_BROKER_URL",
        "DUCKGRES_RESHARD_POD_MEMORY",
        "TRINO_SOMETHING",
        "DUCKGRES_RESHARD_PASSWORD_URL",
    ):
        assert absent not in env


@pytest.mark.safeguard("reshard-26")
def test_the_per_op_image_and_password_url_are_used(kube):
    op = new_op(
        runner_image="registry.example/duckgres-admin:pinned",
        password_url="http://10.1.2.3:8080/api/v1/reshards/1/password",
    )
    PodLauncher().create(op, replace=False)
    container = read(kube, f"duckgres-reshard-op-{op.id}")["spec"]["containers"][0]
    assert container["image"] == "registry.example/duckgres-admin:pinned"
    assert container["env"][-2] == {
        "name": "DUCKGRES_RESHARD_PASSWORD_URL",
        "value": "http://10.1.2.3:8080/api/v1/reshards/1/password",
    }


@pytest.mark.safeguard("reshard-79")
def test_the_api_server_accepts_the_pull_token_volume(kube):
    op = new_op(password_url="http://10.1.2.3:8081/api/v1/reshards/1/password")
    PodLauncher().create(op, replace=False)
    spec = read(kube, f"duckgres-reshard-op-{op.id}")["spec"]
    assert spec["automountServiceAccountToken"] is False
    [token] = [v for v in spec["volumes"] if v["name"] == "password-pull-token"]
    source = token["projected"]["sources"][0]["serviceAccountToken"]
    assert source == {
        "audience": "duckgres-admin-password-pull",
        "expirationSeconds": 600,
        "path": "token",
    }
    mounts = spec["containers"][0]["volumeMounts"]
    assert {
        "name": "password-pull-token",
        "mountPath": "/var/run/secrets/duckgres-admin/password-pull",
        "readOnly": True,
    } in mounts


DIGEST = "sha256:" + "ab" * 32
REG = "registry.example"


@pytest.mark.parametrize(
    ("image", "image_id", "pinned"),
    [
        (f"{REG}/a:1.2.3", f"{REG}/a@{DIGEST}", f"{REG}/a@{DIGEST}"),
        (f"{REG}:5000/a:1", f"docker-pullable://x/a@{DIGEST}", f"{REG}:5000/a@{DIGEST}"),
        (f"{REG}:5000/a", f"{REG}:5000/a@{DIGEST}", f"{REG}:5000/a@{DIGEST}"),
        (f"{REG}/a@{DIGEST}", f"{REG}/a@sha256:" + "cd" * 32, f"{REG}/a@{DIGEST}"),
        (f"{REG}/a:1", DIGEST, f"{REG}/a:1"),  # a node that reports a local image id only
        (f"{REG}/a:1", "", f"{REG}/a:1"),
        (f"{REG}/a:1", "x/a@sha256:short", f"{REG}/a:1"),
    ],
)
def test_the_runner_image_is_pinned_to_the_digest_the_node_resolved(image, image_id, pinned):
    assert pinned_image(image, image_id) == pinned


def test_resolve_control_plane_image_reads_its_own_pod(kube, settings):
    assert resolve_control_plane_image() == OWN_IMAGE
    name = settings.POD_NAME
    resolved = {"name": "worker", "image": OWN_IMAGE, "imageID": f"{REG}/duckgres-admin@{DIGEST}"}
    running = {"ready": True, "restartCount": 0, "state": {"running": {}}}
    status = {"phase": "Running", "containerStatuses": [{**resolved, **running}]}
    kube.core.patch_namespaced_pod_status(name, kube.namespace, {"status": status})
    assert resolve_control_plane_image() == f"registry.example/duckgres-admin@{DIGEST}"
    settings.POD_NAME = "no-such-pod"
    with pytest.raises(LauncherError, match=r"^cannot read own control-plane pod no-such-pod: "):
        resolve_control_plane_image()


@pytest.mark.safeguard("reshard-26")
def test_a_missing_own_pod_refuses_the_launch(kube, settings):
    settings.POD_NAME = "no-such-pod"
    op = new_op()
    with pytest.raises(
        LauncherError, match=r"^cannot read own control-plane pod no-such-pod: .*not found"
    ):
        PodLauncher().create(op, replace=False)
    assert runner_pods(kube) == []


@pytest.mark.safeguard("reshard-26")
def test_a_literal_secret_on_the_control_plane_refuses_the_launch(kube, settings):
    env = [
        *control_plane_env(),
        {"name": "DUCKGRES_RUNNER_SECRET", "value": "literal-runner-secret-0123456789abcdef"},
    ]
    env = [e for e in env if not (e["name"] == "DUCKGRES_RUNNER_SECRET" and "valueFrom" in e)]
    literal = control_plane_pod(env)
    literal["metadata"]["name"] = "control-plane-literal"
    kube.core.create_namespaced_pod(kube.namespace, literal)
    settings.POD_NAME = "control-plane-literal"
    with pytest.raises(LauncherError) as err:
        PodLauncher().create(new_op(), replace=False)
    assert str(err.value) == (
        "DUCKGRES_RUNNER_SECRET must be a secretKeyRef on the control-plane container to be "
        "passed to runner pods"
    )
    assert "literal-runner-secret" not in str(err.value)
    assert runner_pods(kube) == []


@pytest.mark.safeguard("reshard-26")
def test_an_invalid_pod_size_is_an_error_not_a_crash(kube, settings):
    settings.DUCKGRES_RESHARD_POD_MEMORY = "8 gigs"
    with pytest.raises(
        LauncherError, match=r"^invalid reshard pod CPU/memory: DUCKGRES_RESHARD_POD_MEMORY="
    ):
        PodLauncher().create(new_op(), replace=False)
    assert runner_pods(kube) == []


def test_list_selects_runner_pods_by_label(kube):
    launcher = PodLauncher()
    a, b = new_op(), new_op()
    launcher.create(a, replace=False)
    launcher.create(b, replace=False)
    kube.core.create_namespaced_pod(
        kube.namespace,
        {
            "metadata": {
                "name": "stray",
                "labels": {"app": "duckgres-reshard", "duckgres-op-id": "not-a-number"},
            },
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )
    kube.core.create_namespaced_pod(
        kube.namespace,
        {
            "metadata": {
                "name": "unrelated",
                "labels": {"app": "something-else", "duckgres-op-id": "1"},
            },
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )
    objects = {o.name: o for o in launcher.list()}
    assert set(objects) == {f"duckgres-reshard-op-{a.id}", f"duckgres-reshard-op-{b.id}", "stray"}
    assert objects[f"duckgres-reshard-op-{a.id}"].op_id_label == str(a.id)
    assert objects["stray"].op_id_label == "not-a-number"
    assert objects[f"duckgres-reshard-op-{b.id}"].status.phase == "Pending"


def test_get_phase_reports_absent_exit_reason_and_spawn_time(kube):
    launcher = PodLauncher()
    op = new_op()
    assert launcher.get_phase(op.id).phase == "absent"
    created = launcher.create(op, replace=False)
    name = f"duckgres-reshard-op-{op.id}"
    set_status(kube, name, "Failed", reason="OOMKilled", code=137)
    status = launcher.get_phase(op.id)
    assert (status.phase, status.exited, status.terminating) == ("Failed", True, False)
    assert status.reason == "OOMKilled (exit code 137)"
    assert status.spawned_at == created.spawned_at
    assert status.uid == created.uid
    set_status(kube, name, "Succeeded", code=0)
    assert launcher.get_phase(op.id).phase == "Succeeded"


@pytest.mark.safeguard("reshard-40")
def test_a_duplicate_create_never_kills_a_live_runner(kube):
    launcher = PodLauncher()
    op = new_op()
    first = launcher.create(op, replace=False)
    for replace in (False, True):
        with pytest.raises(StillTerminating, match="previous runner pod still terminating") as err:
            launcher.create(op, replace=replace)
        assert err.value.existing is not None
        assert err.value.existing.exited is False
    assert read(kube, f"duckgres-reshard-op-{op.id}")["metadata"]["uid"] == first.uid
    assert runner_pods(kube) == [f"duckgres-reshard-op-{op.id}"]


def test_replace_deletes_an_exited_runner_and_creates_a_new_one(kube):
    launcher = PodLauncher()
    op = new_op()
    first = launcher.create(op, replace=False)
    set_status(kube, f"duckgres-reshard-op-{op.id}", "Failed", reason="Error", code=1)
    with pytest.raises(StillTerminating) as err:  # without replace an exited runner stays
        launcher.create(op, replace=False)
    assert err.value.existing is not None
    assert err.value.existing.exited
    second = launcher.create(op, replace=True)
    assert second.uid
    assert second.uid != first.uid
    assert read(kube, f"duckgres-reshard-op-{op.id}")["metadata"]["uid"] == second.uid


def test_delete_uses_the_pods_own_grace_unless_told(kube):
    launcher = PodLauncher()
    op, other = new_op(), new_op()
    for o in (op, other):
        launcher.create(o, replace=False)
        bind_to_node(kube, f"duckgres-reshard-op-{o.id}")
    launcher.delete(op.id)
    pod = read(kube, f"duckgres-reshard-op-{op.id}")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 600
    status = launcher.get_phase(op.id)
    assert status.terminating
    assert not status.exited
    launcher.delete(other.id, grace_seconds=30)
    assert (
        read(kube, f"duckgres-reshard-op-{other.id}")["metadata"]["deletionGracePeriodSeconds"]
        == 30
    )
    launcher.delete(new_op().id)  # absent: nothing to do, no error


@pytest.mark.safeguard("reshard-58")
def test_a_terminating_runner_blocks_replacement_until_it_is_gone(kube):
    launcher = PodLauncher()
    op = new_op()
    name = f"duckgres-reshard-op-{op.id}"
    first = launcher.create(op, replace=False)
    kube.core.patch_namespaced_pod(
        name, kube.namespace, {"metadata": {"finalizers": ["duckgres.test/hold"]}}
    )
    launcher.delete(op.id)
    set_status(kube, name, "Failed", reason="Error", code=143)
    status = launcher.get_phase(op.id)
    assert status.terminating
    assert status.exited
    for replace in (True, False):
        with pytest.raises(StillTerminating, match="previous runner pod still terminating"):
            launcher.create(op, replace=replace)
    assert read(kube, name)["metadata"]["uid"] == first.uid
    kube.core.patch_namespaced_pod(name, kube.namespace, {"metadata": {"finalizers": None}})
    assert launcher.get_phase(op.id).phase == "absent"
    second = launcher.create(op, replace=True)
    assert second.uid != first.uid


def test_read_log_errors_name_the_pod(kube):
    launcher = PodLauncher()
    op = new_op()
    with pytest.raises(
        LauncherError, match=rf"reading the log of runner pod duckgres-reshard-op-{op.id} failed"
    ):
        launcher.read_log(op.id)


def test_client_side_validation_errors_never_echo_the_body(kube):
    body = {
        "metadata": {"name": "bad"},
        "spec": {"containers": [{"name": "c", "image": "x", "imagee": "hunter2-in-a-typo"}]},
    }
    with pytest.raises(k8s.KubeError) as err:
        k8s.create_pod(kube.namespace, body)
    message = str(err.value)
    assert message.startswith(
        f"Kubernetes create pods/bad in namespace {kube.namespace} refused by the client: "
    )
    assert "imagee" in message
    assert "hunter2" not in message
