"""The runner pod spec builder (spec reshard §4.13), unit level: no API server, no database."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings

from duckgres_admin.lib import secretrefs
from reshard.launchers.base import LauncherError
from reshard.launchers.envcontract import ALLOWLIST
from reshard.launchers.podspec import (
    build_runner_pod,
    copy_allowlisted_env,
    node_arch,
    parse_spawned_at,
    validate_quantity,
)
from tests.fixtures.pod_security import restricted_violations

NOW = datetime(2026, 11, 30, 9, 30, 5, 123456, tzinfo=UTC)


def secret_ref(secret: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": secret, "key": key}}


def own_pod(**container_overrides: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "worker",
        "image": "registry.example/duckgres-admin:1.2.3",
        "imagePullPolicy": "Always",
        "env": [
            {"name": "DJANGO_SETTINGS_MODULE", "value": "duckgres_admin.settings"},
            {"name": "DJANGO_SECRET_KEY", "valueFrom": secret_ref("duckgres", "django")},
            {"name": "DUCKGRES_CONFIG_STORE", "valueFrom": secret_ref("duckgres", "dsn")},
            {"name": "DUCKGRES_INTERNAL_SECRET", "valueFrom": secret_ref("duckgres", "int")},
            {"name": "DUCKGRES_RUNNER_SECRET", "valueFrom": secret_ref("duckgres", "runner")},
            {"name": "DUCKGRES_DATAPLANE_SECRET", "valueFrom": secret_ref("duckgres", "dp")},
            {"name": "DUCKGRES_BROKER_URL", "value": "redis://redis:6379/0"},
            {"name": "DUCKGRES_RESHARD_POD_CPU", "value": "4"},
            {
                "name": "DUCKGRES_LOG_LEVEL",
                "valueFrom": {"configMapKeyRef": {"name": "duckgres", "key": "log"}},
            },
            {"name": "DUCKGRES_RESHARD_STALE_SECONDS", "value": "300"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    }
    container.update(container_overrides)
    return {
        "metadata": {"name": "duckgres-admin-worker-abc", "namespace": "duckgres"},
        "spec": {
            "serviceAccountName": "duckgres-admin",
            "nodeSelector": {"pool": "control"},
            "tolerations": [
                {
                    "key": "dedicated",
                    "operator": "Equal",
                    "value": "control",
                    "effect": "NoSchedule",
                },
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
                {"operator": "Exists", "effect": "NoExecute"},
            ],
            "containers": [container, {"name": "sidecar", "image": "other:1"}],
        },
    }


def build(pod: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "op_id": 42,
        "own_pod": own_pod() if pod is None else pod,
        "runner_image": "",
        "password_url": "",
        "cpu": "2",
        "memory": "8Gi",
        "machine": "x86_64",
        "now": NOW,
        "login_secret": "duckgres-reshard-op-42-login",
    }
    args.update(kw)
    return build_runner_pod(**args)


@pytest.mark.safeguard("reshard-26")
@pytest.mark.safeguard("reshard-128")
@pytest.mark.safeguard("reshard-133")
def test_the_runner_pod_is_built_field_by_field():
    pod = build(
        password_url="http://10.0.0.7:8080/api/v1/reshards/42/password",
        service_account="duckgres-admin-runner",
    )
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "duckgres-reshard-op-42"
    assert meta["namespace"] == "duckgres"
    assert meta["labels"] == {"app": "duckgres-reshard", "duckgres-op-id": "42"}
    assert meta["annotations"] == {
        "karpenter.sh/do-not-disrupt": "true",
        "duckgres.posthog.com/runner-spawned-at": "2026-11-30T09:30:05Z",
    }
    assert "ownerReferences" not in meta
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 600
    # The runner's own identity, never the control plane's; no API token in the pod.
    assert spec["serviceAccountName"] == "duckgres-admin-runner"
    assert spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == {"pool": "control", "kubernetes.io/arch": "amd64"}
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "control", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute"},
    ]
    [container] = spec["containers"]
    assert container["name"] == "reshard-runner"
    assert container["command"] == ["python", "manage.py", "reshard_runner"]
    assert container["image"] == "registry.example/duckgres-admin:1.2.3"
    assert container["imagePullPolicy"] == "Always"
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

    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}

    # No DJANGO_SECRET_KEY although the control-plane container has one: a runner signs nothing.
    # Its config store is its own login's Secret, never the control plane's (reshard-133).
    assert container["env"] == [
        {"name": "DJANGO_SETTINGS_MODULE", "value": "duckgres_admin.settings"},
        {
            "name": "DUCKGRES_CONFIG_STORE",
            "valueFrom": secret_ref("duckgres-reshard-op-42-login", "config-store-dsn"),
        },
        {"name": "DUCKGRES_RUNNER_SECRET", "valueFrom": secret_ref("duckgres", "runner")},
        {
            "name": "DUCKGRES_LOG_LEVEL",
            "valueFrom": {"configMapKeyRef": {"name": "duckgres", "key": "log"}},
        },
        {"name": "DUCKGRES_RESHARD_STALE_SECONDS", "value": "300"},
        {"name": "DUCKGRES_RESHARD_OP_ID", "value": "42"},
        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "POD_UID", "valueFrom": field("metadata.uid")},
        {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {
            "name": "DUCKGRES_RESHARD_PASSWORD_URL",
            "value": "http://10.0.0.7:8080/api/v1/reshards/42/password",
        },
        {"name": "DUCKGRES_SECRET_REFS_MOUNTED", "value": "1"},
    ]


@pytest.mark.safeguard("reshard-50")
def test_runner_pods_never_get_the_internal_or_dataplane_secret():
    names = {e["name"] for e in build()["spec"]["containers"][0]["env"]}
    assert "DUCKGRES_INTERNAL_SECRET" not in names
    assert "DUCKGRES_DATAPLANE_SECRET" not in names
    assert "DUCKGRES_BROKER_URL" not in names
    assert "DUCKGRES_RESHARD_POD_CPU" not in names


@pytest.mark.safeguard("reshard-79")
def test_the_pull_token_is_projected_for_its_audience_only_and_nothing_is_automounted():
    pod = build(
        password_url="http://10.0.0.7:8081/api/v1/reshards/42/password",
        service_account="duckgres-admin-runner",
        pull_audience="duckgres-admin-password-pull",
    )
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "duckgres-admin-runner"
    projected = [v for v in spec["volumes"] if "projected" in v]
    assert projected == [
        {
            "name": "password-pull-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": "duckgres-admin-password-pull",
                            "expirationSeconds": 600,
                            "path": "token",
                        }
                    }
                ]
            },
        }
    ]
    [container] = spec["containers"]
    assert {
        "name": "password-pull-token",
        "mountPath": "/var/run/secrets/duckgres-admin/password-pull",
        "readOnly": True,
    } in container["volumeMounts"]
    # The token file is where the runner reads it.
    from reshard.runner.password import PULL_TOKEN_PATH

    assert PULL_TOKEN_PATH == "/var/run/secrets/duckgres-admin/password-pull/token"
    # Not the Kubernetes API's default token path: nothing would use it for the API.
    assert not any(
        m["mountPath"].startswith("/var/run/secrets/kubernetes.io")
        for m in container["volumeMounts"]
    )
    # The token itself is never in the spec (the kubelet writes it); no env names it.
    assert "PASSWORD_PULL" not in repr(container["env"])
    assert restricted_violations(spec, "runner") == []


def test_no_password_url_means_no_pull_token():
    spec = build(password_url="", pull_audience="duckgres-admin-password-pull")["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["tmp"]


def test_no_password_url_means_no_variable():
    names = [e["name"] for e in build(password_url="")["spec"]["containers"][0]["env"]]
    assert "DUCKGRES_RESHARD_PASSWORD_URL" not in names
    assert names[-2:] == ["POD_NAMESPACE", "DUCKGRES_SECRET_REFS_MOUNTED"]


@pytest.mark.safeguard("reshard-26")
def test_the_per_op_image_wins_over_the_control_plane_image():
    pod = build(runner_image="registry.example/duckgres-admin:pinned")
    assert pod["spec"]["containers"][0]["image"] == "registry.example/duckgres-admin:pinned"


@pytest.mark.safeguard("reshard-26")
@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64")])
def test_arch_is_pinned_unless_the_control_plane_pins_it(machine, arch):
    assert build(machine=machine)["spec"]["nodeSelector"]["kubernetes.io/arch"] == arch
    pod = own_pod()
    pod["spec"]["nodeSelector"]["kubernetes.io/arch"] = "arm64"
    assert build(pod, machine="x86_64")["spec"]["nodeSelector"]["kubernetes.io/arch"] == "arm64"
    assert node_arch("x86_64") == "amd64"


@pytest.mark.safeguard("reshard-26")
@pytest.mark.parametrize(
    "name",
    [
        "DUCKGRES_CONFIG_STORE",
        "DUCKGRES_RUNNER_SECRET",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ],
)
def test_a_literal_secret_bearing_value_refuses_the_launch(name):
    literal = (
        "postgresql://u:hunter2-literal@db/x"
        if name == "DUCKGRES_CONFIG_STORE"
        else "hunter2-literal"
    )
    pod = own_pod(env=[{"name": name, "value": literal}])
    with pytest.raises(LauncherError) as err:
        build(pod)
    assert str(err.value) == (
        f"{name} must be a secretKeyRef on the control-plane container to be passed to runner pods"
    )
    assert "hunter2" not in str(err.value)


def test_a_secret_bearing_config_map_ref_is_refused_too():
    env = [
        {
            "name": "AWS_SECRET_ACCESS_KEY",
            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
        }
    ]
    with pytest.raises(LauncherError, match="AWS_SECRET_ACCESS_KEY must be a secretKeyRef"):
        build(own_pod(env=env))


@pytest.mark.safeguard("reshard-133")
def test_the_control_planes_config_store_never_reaches_the_runner():
    env = [
        {
            "name": "DUCKGRES_CONFIG_STORE",
            "value": "postgresql://svc@db:5432/duckgres?sslmode=require",
        }
    ]
    # A literal without a password is accepted on the control plane, but the runner gets its
    # own login's Secret instead.
    assert build(own_pod(env=env))["spec"]["containers"][0]["env"][0] == {
        "name": "DUCKGRES_CONFIG_STORE",
        "valueFrom": secret_ref("duckgres-reshard-op-42-login", "config-store-dsn"),
    }
    env = [{"name": "DUCKGRES_CONFIG_STORE", "value": "host=db user=svc password=s3cret dbname=x"}]
    with pytest.raises(LauncherError, match="DUCKGRES_CONFIG_STORE must be a secretKeyRef"):
        build(own_pod(env=env))


def test_the_allowlist_is_complete_and_copied_in_container_order():
    plain: list[dict[str, Any]] = [{"name": n, "value": "v"} for n in reversed(ALLOWLIST)]
    env = [
        {"name": e["name"], "valueFrom": secret_ref("s", "k")}
        if e["name"]
        in {
            "DUCKGRES_CONFIG_STORE",
            "DUCKGRES_RUNNER_SECRET",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        }
        else e
        for e in plain
    ]
    copied = copy_allowlisted_env({"env": env})
    assert [e["name"] for e in copied] == list(reversed(ALLOWLIST))
    assert len(ALLOWLIST) == 27  # DJANGO_SECRET_KEY left it (reshard-128)


@pytest.mark.safeguard("reshard-26")
@pytest.mark.parametrize(
    ("cpu", "memory", "bad"),
    [
        ("two", "8Gi", "DUCKGRES_RESHARD_POD_CPU='two'"),
        ("2", "8GB", "DUCKGRES_RESHARD_POD_MEMORY='8GB'"),
        ("0", "8Gi", "DUCKGRES_RESHARD_POD_CPU='0'"),
        ("-1", "8Gi", "DUCKGRES_RESHARD_POD_CPU='-1'"),
        ("2", "", "DUCKGRES_RESHARD_POD_MEMORY=''"),
    ],
)
def test_an_invalid_quantity_is_a_named_error(cpu, memory, bad):
    with pytest.raises(LauncherError) as err:
        build(cpu=cpu, memory=memory)
    assert str(err.value).startswith("invalid reshard pod CPU/memory: " + bad)


@pytest.mark.parametrize("value", ["2", "500m", "1.5", "8Gi", "512Mi", "1e3", "0.5"])
def test_valid_quantities(value):
    assert validate_quantity("X", value) == value


def test_a_pod_without_containers_is_an_error():
    pod = own_pod()
    pod["spec"]["containers"] = []
    with pytest.raises(
        LauncherError, match="own control-plane pod duckgres-admin-worker-abc has no containers"
    ):
        build(pod)


def test_privileged_is_never_copied_and_escalation_is_forced_off():
    pod = own_pod(
        securityContext={
            "runAsNonRoot": False,
            "runAsUser": 0,
            "privileged": True,
            "allowPrivilegeEscalation": True,
            "capabilities": {"add": ["SYS_ADMIN"]},
            "readOnlyRootFilesystem": False,
            "seccompProfile": {"type": "Unconfined"},
        }
    )
    assert build(pod)["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_the_builder_does_not_mutate_its_input():
    pod = own_pod()
    before = copy.deepcopy(pod)
    build(pod)
    assert pod == before


def test_spawned_at_round_trips():
    assert parse_spawned_at("2026-11-30T09:30:05Z") == NOW.replace(microsecond=0)
    assert parse_spawned_at("") is None
    assert parse_spawned_at("garbage") is None


@pytest.mark.safeguard("reshard-56")
def test_pod_mode_refuses_a_runner_secret_supplied_as_a_file(tmp_path):
    """With the pod launcher a ``_FILE`` secret cannot reach runner pods: startup is refused."""
    secret = "file-runner-secret-0123456789abcdefghijklm"
    path = tmp_path / "runner-secret"
    path.write_text(secret + "\n")
    env = dict(os.environ)
    env.pop("DUCKGRES_RUNNER_SECRET", None)
    env.update(DUCKGRES_RESHARD_LAUNCHER="pod", DUCKGRES_RUNNER_SECRET_FILE=str(path))
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert (
        "DUCKGRES_RUNNER_SECRET is supplied as DUCKGRES_RUNNER_SECRET_FILE, which cannot be "
        "passed to runner pods: supply it as a secretKeyRef env var"
    ) in result.stderr
    assert secret not in result.stdout + result.stderr

    env["DUCKGRES_RESHARD_LAUNCHER"] = "local"  # the same file is fine with the local launcher
    ok = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr


# --- runner pods have no Kubernetes API access (safeguard reshard-78) --------------------------
@pytest.mark.safeguard("reshard-78")
def test_the_ops_secret_references_reach_the_runner_as_secret_key_refs_only():
    refs = [
        "k8s:duckgres/duckgres-tenant-acme#password",
        "k8s:duckgres/duckgres-store-a#provisioner",
        "k8s:duckgres/duckgres-tenant-acme#password",  # the same reference twice: once
        "k8s:other/duckgres-tenant-x#password",  # another namespace: a pod cannot mount it
        "k8s:duckgres/duckgres-admin#internal-secret",  # the control plane's own: never
        "env:DUCKGRES_TEST_PW",
        "",
    ]
    pod = build(service_account="duckgres-admin-runner", secret_refs=refs)
    env = pod["spec"]["containers"][0]["env"]
    mounted = [e for e in env if e["name"].startswith(secretrefs.MOUNTED_PREFIX)]
    assert mounted == [
        {
            "name": secretrefs.mounted_variable(secretrefs.parse(ref, launcher="pod")),
            "valueFrom": {"secretKeyRef": {"name": name, "key": key, "optional": True}},
        }
        for ref, name, key in (
            (refs[0], "duckgres-tenant-acme", "password"),
            (refs[1], "duckgres-store-a", "provisioner"),
        )
    ]
    assert {"name": secretrefs.MOUNTED_MODE_VAR, "value": "1"} in env
    text = repr(env)
    assert "internal-secret" not in text
    assert "duckgres-tenant-x" not in text
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert all("projected" not in v for v in pod["spec"]["volumes"])


@pytest.mark.safeguard("reshard-78")
def test_a_runner_in_mounted_mode_reads_mounted_references_and_never_calls_the_api(monkeypatch):
    from duckgres_admin.lib import k8s

    def no_api(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("a runner pod must never read a Secret through the API")

    monkeypatch.setattr(k8s, "read_secret_key", no_api)  # the one seam, observed
    ref = "k8s:duckgres/duckgres-tenant-acme#password"
    variable = secretrefs.mounted_variable(secretrefs.parse(ref, launcher="pod"))
    monkeypatch.setenv(secretrefs.MOUNTED_MODE_VAR, "1")
    monkeypatch.setenv("POD_NAMESPACE", "duckgres")
    monkeypatch.setenv(variable, "s3cr3t-value")
    assert secretrefs.resolve(ref, launcher="pod") == "s3cr3t-value"
    with pytest.raises(secretrefs.SecretRefError) as info:
        secretrefs.resolve("k8s:other/duckgres-tenant-x#password", launcher="pod")
    assert "is not mounted into this runner pod" in str(info.value)
    assert "those in the control plane's own namespace" in str(info.value)
    with pytest.raises(secretrefs.SecretRefError, match="control plane's own"):
        secretrefs.resolve("k8s:duckgres/duckgres-admin#internal-secret", launcher="pod")
