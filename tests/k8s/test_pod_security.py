"""Every pod the product renders passes the `restricted` Pod Security level, with a read-only
root filesystem (docs/kubernetes.md "Pod Security"); the namespace asks for it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reshard.launchers.podspec import build_runner_pod
from tests.fixtures.manifests import DOCS, one
from tests.fixtures.pod_security import read_only_root, restricted_violations

pytestmark = pytest.mark.safeguard("reshard-62")


def _pod_specs() -> list[tuple[str, dict[str, Any]]]:
    specs = [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in DOCS
        if d["kind"] in ("Deployment", "Job")
    ]
    return specs


def test_the_namespace_enforces_the_restricted_level():
    labels = one("Namespace", "duckgres")["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


@pytest.mark.parametrize(
    ("name", "spec"), _pod_specs(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_shipped_pod_passes_the_restricted_level(name, spec):
    assert restricted_violations(spec, name) == []
    assert read_only_root(spec) == []


@pytest.mark.parametrize("worker", ["duckgres-admin-worker", "duckgres-admin-control-worker"])
def test_runner_pods_pass_it_even_when_the_launching_pod_does_not(worker):
    template = copy.deepcopy(one("Deployment", worker)["spec"]["template"])
    own = {"metadata": {"name": f"{worker}-0", "namespace": "duckgres"}, "spec": template["spec"]}
    pod = build_runner_pod(
        op_id=3, own_pod=own, runner_image="", password_url="", cpu="1", memory="1Gi",
        machine="x86_64", now=datetime.now(UTC), login_secret="duckgres-reshard-op-1-login",
    )  # fmt: skip
    assert restricted_violations(pod["spec"], "runner") == []
    assert read_only_root(pod["spec"]) == []
    # With the password pull's projected token volume too (safeguard reshard-79).
    pod = build_runner_pod(
        op_id=3, own_pod=own, runner_image="", password_url="http://10.0.0.7:8081/p",
        cpu="1", memory="1Gi", machine="x86_64", now=datetime.now(UTC),
        login_secret="duckgres-reshard-op-1-login", pull_audience="duckgres-admin-password-pull",
    )  # fmt: skip
    assert any("projected" in v for v in pod["spec"]["volumes"])
    assert restricted_violations(pod["spec"], "runner") == []
    assert read_only_root(pod["spec"]) == []
    # A careless control-plane pod (root, privileged, unconfined) yields a restricted runner too.
    bad = copy.deepcopy(own)
    bad["spec"]["securityContext"] = {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    bad["spec"]["containers"][0]["securityContext"] = {
        "privileged": True, "allowPrivilegeEscalation": True, "capabilities": {"add": ["ALL"]},
    }  # fmt: skip
    assert restricted_violations(bad["spec"], "careless")  # the check itself bites
    pod = build_runner_pod(
        op_id=4, own_pod=bad, runner_image="", password_url="", cpu="1", memory="1Gi",
        machine="x86_64", now=datetime.now(UTC), login_secret="duckgres-reshard-op-1-login",
    )  # fmt: skip
    assert restricted_violations(pod["spec"], "runner") == []


def test_the_checker_knows_the_rules():
    assert Path(__file__).exists()
    spec = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "ports": [{"hostPort": 80}]}]}  # fmt: skip
    found = "\n".join(restricted_violations(spec))
    for rule in ("hostNetwork", "hostPath", "hostPort", "allowPrivilegeEscalation",
                 "drop ALL", "runAsNonRoot", "seccompProfile"):  # fmt: skip
        assert rule in found, rule
