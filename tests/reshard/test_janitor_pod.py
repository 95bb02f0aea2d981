"""The janitor with the real pod launcher against the real kube-apiserver (spec reshard §4.15
step 2-4; safeguards 24 and 58): a wedged runner pod is deleted with its normal grace, ticks
wait for it without consuming attempts while a finalizer holds it, and once it is gone the
janitor relaunches with attempt 1 and a new uid."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.lib import k8s
from duckgres_admin.platform.leadership import LeaderLease
from reshard.control.janitor import Janitor
from reshard.launchers.base import SPAWNED_AT_ANNOTATION
from reshard.launchers.pod import PodLauncher
from tests.fixtures.janitor import janitor_env, op_log, refresh, stale_running
from tests.fixtures.kube_pods import (
    OWN_POD,
    bind_to_node,
    control_plane_pod,
    read,
    set_status,
)

pytestmark = [pytest.mark.kube, pytest.mark.usefixtures("janitor_env")]
assert janitor_env


@pytest.fixture
def kube_world(kube_api: Any, settings: Any) -> Any:
    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    settings.POD_NAME = OWN_POD
    settings.DUCKGRES_RESHARD_LAUNCHER = "pod"
    k8s.api_client.cache_clear()
    kube_api.core.create_namespaced_pod(kube_api.namespace, control_plane_pod())
    yield kube_api
    k8s.api_client.cache_clear()


@pytest.mark.safeguard("reshard-58")
@pytest.mark.safeguard("reshard-24")
def test_a_wedged_pod_is_deleted_with_grace_and_waited_for_without_counting(
    kube_world: Any,
) -> None:
    kube = kube_world
    op = stale_running(step="copying", launcher="pod")
    name = f"duckgres-reshard-op-{op.id}"
    launcher = PodLauncher()
    first = launcher.create(op, replace=False)
    bind_to_node(kube, name)
    set_status(kube, name, "Running")
    kube.core.patch_namespaced_pod(
        name,
        kube.namespace,
        {
            "metadata": {
                "finalizers": ["duckgres.test/hold"],
                "annotations": {SPAWNED_AT_ANNOTATION: "2020-01-01T00:00:00Z"},
            }
        },
    )
    janitor = Janitor(
        LeaderLease("janitor", holder="kube-test.1.00000000"), launcher_for=lambda kind: launcher
    )

    # Tick 1: Running pod, stale heartbeat, spawned long ago → wedged: deleted with grace 600.
    janitor.reconcile()
    pod = read(kube, name)
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 600, "normal grace, never 0"
    assert f"deleting wedged runner {name} (grace 600 s)" in op_log(op.id)
    assert refresh(op).respawn_attempts == 0

    # Ticks while the finalizer holds it: warn (once a minute), delete again, never count.
    set_status(kube, name, "Failed", reason="Error", code=143)
    for _ in range(3):
        janitor.reconcile()
    assert refresh(op).respawn_attempts == 0
    warnings = [m for m in op_log(op.id) if m.startswith("previous runner pod still terminating")]
    assert len(warnings) == 1
    assert read(kube, name)["metadata"]["uid"] == first.uid

    # It goes away (finalizer removed; the missing kubelet's confirmation done by hand).
    kube.core.patch_namespaced_pod(name, kube.namespace, {"metadata": {"finalizers": None}})
    kube.core.delete_namespaced_pod(name, kube.namespace, grace_period_seconds=0)
    assert launcher.get_phase(op.id).phase == "absent"

    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    new_uid = read(kube, name)["metadata"]["uid"]
    assert new_uid != first.uid
    assert any(
        m == f"runner pod missing or dead (no pod) — respawning {name} (attempt 1/3)"
        for m in op_log(op.id)
    )
    # Right after the relaunch a live pod within the spawn grace does not bump attempts.
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    assert read(kube, name)["metadata"]["uid"] == new_uid


@pytest.mark.safeguard("reshard-70")
def test_a_deleted_runner_pod_with_a_fresh_heartbeat_is_relaunched_at_once(
    kube_world: Any,
) -> None:
    """The pod is gone (deleted, evicted) while the heartbeat is still fresh: the next tick
    relaunches without waiting for staleness (one pod listing per tick, not one read per op)."""
    from tests.fixtures.janitor import age_op, new_op

    kube = kube_world
    op = new_op("running", step="copying", launcher="pod", runner_epoch=1)
    age_op(op.id, created_at="20 minutes", heartbeat_at="5 seconds")
    launcher = PodLauncher()
    janitor = Janitor(
        LeaderLease("janitor", holder="kube-test.1.00000000"), launcher_for=lambda kind: launcher
    )
    janitor.reconcile()
    row = refresh(op)
    assert row.respawn_attempts == 1
    assert row.heartbeat_at is None
    name = f"duckgres-reshard-op-{op.id}"
    assert read(kube, name)["metadata"]["name"] == name
    log = op_log(op.id)
    assert any(f"runner {name} (epoch 1) is gone while its heartbeat was fresh" in m for m in log)
