"""An upgrade with an operation in flight, and the rollback (docs/kubernetes.md "Upgrade" and
"Rollback"; issue 26 item 3), on the real one-node cluster.

The control plane of the release before the newest migration (``make previous-image``: the
parent of the last commit that changed ``duckgres_admin/migrations``, with that commit's own
test overlay) is installed and starts a reshard; its runner is held in the propagation wait by a
long poll interval. This tree is then applied over it as the docs' upgrade says (``--force`` for
the migration Job); the new migrations land while the operation is active, its runner (the
earlier image, as pinned on the operation) copies against the migrated schema, and the operation
must end ``succeeded`` with the catalog intact on the target. Then the previous release's
manifests are applied again (the rollback) and its control plane answers on the newer schema.
The file sorts before the session deployment (``test_deployment.py``) and removes what it
installed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.docs import documented_command
from tests.fixtures.pods import (
    DEPLOYMENTS,
    KUBECONFIG,
    NAMESPACE,
    OVERLAY,
    ROOT,
    Deployed,
    deploy_product,
    kubectl,
    reset_namespaces,
    wait_until,
)
from tests.pods.tenants import Tenant
from tests.pods.tenants import messages as _messages

pytestmark = [pytest.mark.pods, pytest.mark.timeout(2400)]
PREVIOUS = ROOT / "var" / "previous"
PREVIOUS_IMAGE = "localhost/duckgres-admin-previous"
POLL_INTERVAL = "45"  # the runner's propagation wait is twice this: the window of the upgrade


def _previous_overlay(tmp_path: Path) -> tuple[Path, Path]:
    revision = (PREVIOUS / "REVISION").read_text().strip()
    archive = PREVIOUS / f"{revision}.oci.tar"
    overlay = tmp_path / "previous"
    overlay.mkdir()
    inner = os.path.relpath(PREVIOUS / "src" / "tests" / "pods" / "overlay", overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n- {inner}\n"
        "images:\n- name: localhost/duckgres-admin\n"
        f"  newName: {PREVIOUS_IMAGE}\n  newTag: 0.1.0\n"
        # The launching worker's env (runner pods inherit only its allowlisted env entries).
        "patches:\n- target: {kind: Deployment, name: duckgres-admin-worker}\n  patch: |-\n"
        "    - op: add\n      path: /spec/template/spec/containers/0/env/-\n"
        f'      value: {{name: DUCKGRES_CONFIG_POLL_INTERVAL, value: "{POLL_INTERVAL}"}}\n'
    )
    return overlay, archive


def _run(command: str, timeout: float) -> str:
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip
    assert done.returncode == 0, (command, done.stderr[-2000:])
    return done.stdout


def _upgrade() -> None:
    """docs/kubernetes.md "Upgrade" step 2, over this tree's test overlay (k8s/ plus the test
    cluster's differences) instead of k8s/."""
    apply = documented_command("apply -k k8s/ --force", section="Upgrade")
    _run(apply.replace("k8s/", f"{OVERLAY}/"), timeout=300)
    _run(documented_command("wait --for=condition=complete", section="Upgrade"), timeout=960)
    _run(documented_command("rollout status", section="Upgrade"), timeout=660)


def _images(product: Deployed) -> set[str]:
    """The images of the control plane's live pods (terminating ones left out)."""
    return {
        p["spec"]["containers"][0]["image"]
        for p in product.pods("app=duckgres-admin")
        if p["metadata"].get("deletionTimestamp") is None and p["status"].get("phase") == "Running"
    }


def _step(product: Deployed, op_id: int) -> str:
    return str(product.one("SELECT step FROM duckgres_reshard_operations WHERE id=%s", op_id))


def test_an_upgrade_with_an_operation_in_flight_then_a_rollback(store_clusters, tmp_path):
    overlay, archive = _previous_overlay(tmp_path)
    assert archive.exists(), f"{archive} is missing: run make previous-image"
    reset_namespaces()
    product, teardown = deploy_product(store_clusters, overlay=overlay, archive=archive)
    try:
        assert _images(product) == {f"{PREVIOUS_IMAGE}:0.1.0"}
        t = Tenant(product, tables=300)
        t.catalog.row_counts()
        op_id = t.to_cnpg_target()
        wait_until(lambda: "observe the block" in _messages(product.api.log_entries(op_id)),
                   "the runner's propagation wait", 240, poll=2)  # fmt: skip
        migrations_before = product.one("SELECT count(*) FROM django_migrations")

        started = time.monotonic()
        _upgrade()
        upgraded_in = time.monotonic() - started
        assert product.one("SELECT count(*) FROM django_migrations") > migrations_before
        state = product.one("SELECT state FROM duckgres_reshard_operations WHERE id=%s", op_id)
        assert state == "running", (state, _step(product, op_id), upgraded_in)
        wait_until(lambda: _images(product) == {"localhost/duckgres-admin:0.1.0"},
                   "every control-plane pod on the new image", 120, poll=2)  # fmt: skip

        op = product.api.wait_terminal(op_id, timeout=900, poll=2)
        text = _messages(product.api.log_entries(op_id))
        assert op["state"] == "succeeded", (op, text[-4000:])
        wh = product.api.get(f"warehouses/{t.org}").body
        assert (wh["state"], wh["metadata_store_name"]) == ("ready", "pods-target"), wh

        # Rollback: the previous release's manifests again; its code on the newer schema.
        kubectl("apply", "-k", str(overlay), "--force", timeout=300)
        kubectl("-n", NAMESPACE, "wait", "--for=condition=complete", "--timeout=600s",
                "job/duckgres-admin-migrate", timeout=620)  # fmt: skip
        for name in DEPLOYMENTS:
            kubectl("-n", NAMESPACE, "rollout", "status", f"deploy/{name}", "--timeout=300s",
                    timeout=320)  # fmt: skip
        wait_until(lambda: _images(product) == {f"{PREVIOUS_IMAGE}:0.1.0"},
                   "every control-plane pod on the previous image", 120, poll=2)  # fmt: skip
        listed = wait_until(lambda: product.api.answers(f"warehouses/{t.org}"),
                            "the rolled-back API", 120)  # fmt: skip
        assert listed
        done = product.api.get(f"reshards/{op_id}")
        assert done.status == 200
        assert done.body["state"] == "succeeded", done.body
    finally:
        teardown()
        reset_namespaces()
