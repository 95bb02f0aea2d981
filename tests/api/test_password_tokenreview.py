"""The password route binds a runner pod's pull to its own identity (safeguard reshard-79).

Against the real kube-apiserver (marker ``kube``): the TokenRequest API mints projected
ServiceAccount tokens bound to real Pod objects (no node runs them), and the API's TokenReview
goes through ``duckgres_admin.lib.k8s`` to that same server. Only a token of the runner
ServiceAccount, with the pull audience, bound to the op's runner pod and the uid its claim
recorded, pulls the password, once.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from duckgres_admin.lib import k8s
from duckgres_admin.models import ReshardLogEntry, ReshardOperation
from reshard.launchers.base import runner_name
from reshard.start import stash
from tests.fixtures.rows import new_op, new_store, new_warehouse

pytestmark = [pytest.mark.kube, pytest.mark.safeguard("reshard-79")]

AUDIENCE = "duckgres-admin-password-pull"
RUNNER_SA = "duckgres-admin-runner"


@dataclass
class World:
    kube: Any
    op: ReshardOperation
    other: ReshardOperation
    password: str
    pods: dict[int, Any]  # op id -> V1Pod

    def token(self, op_id: int, *, audience: str = AUDIENCE, account: str = RUNNER_SA) -> str:
        """A projected token of ``account`` bound to the runner pod of ``op_id``."""
        pod = self.pods[op_id]
        request = self.kube.core.create_namespaced_service_account_token(
            account,
            self.kube.namespace,
            {
                "spec": {
                    "audiences": [audience],
                    "expirationSeconds": 600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod.metadata.name,
                        "uid": pod.metadata.uid,
                    },
                }
            },
        )
        return str(request.status.token)


def _pod(kube: Any, name: str, account: str) -> Any:
    return kube.core.create_namespaced_pod(
        kube.namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": account,
                "automountServiceAccountToken": False,
                "containers": [{"name": "reshard-runner", "image": "registry.example/x:1"}],
            },
        },
    )


def _op(org: str) -> ReshardOperation:
    warehouse = new_warehouse(
        org_id=org,
        store=new_store(name=f"{org}-src"),
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    return new_op(
        warehouse,
        state="running",
        launcher="pod",
        runner_id=f"runner-{org}",
        runner_epoch=2,
        target_endpoint="ext.example",
        target_port=5432,
        target_user="u",
        target_database="d",
        target_password_secret_ref="env:Y",
    )


@pytest.fixture
def world(kube_api, settings, db) -> Iterator[World]:
    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    settings.DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT = RUNNER_SA
    settings.DUCKGRES_PASSWORD_PULL_AUDIENCE = AUDIENCE
    k8s.api_client.cache_clear()
    for account in (RUNNER_SA, "some-other-account"):
        kube_api.core.create_namespaced_service_account(
            kube_api.namespace, {"metadata": {"name": account}}
        )
    op, other = _op("tr-a"), _op("tr-b")
    pods = {o.id: _pod(kube_api, runner_name(o.id), RUNNER_SA) for o in (op, other)}
    for o in (op, other):
        # What the runner's claim records (its POD_UID from the downward API).
        ReshardOperation.objects.filter(pk=o.id).update(runner_pod_uid=pods[o.id].metadata.uid)
        o.refresh_from_db()
    password = secrets.token_urlsafe(30)
    stash.put(op.id, password)
    try:
        yield World(kube_api, op, other, password, pods)
    finally:
        k8s.api_client.cache_clear()


def pull(clients: Any, op: ReshardOperation, token: str, *, epoch: int | None = None) -> Any:
    return clients.runner.get(
        f"/api/v1/reshards/{op.id}/password",
        HTTP_X_DUCKGRES_OP_EPOCH=str(op.runner_epoch if epoch is None else epoch),
        HTTP_X_DUCKGRES_RUNNER_ID=op.runner_id,
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def lines(op_id: int) -> list[str]:
    return list(
        ReshardLogEntry.objects.filter(operation_id=op_id)
        .order_by("id")
        .values_list("message", flat=True)
    )


def test_the_token_of_the_ops_runner_pod_pulls_once(clients, world):
    token = world.token(world.op.id)
    response = pull(clients, world.op, token)
    assert response.status_code == 200, response.content
    assert response.json() == {"password": world.password}
    assert stash.held_ids() == []
    # (e) the second pull, same valid token: the entry is gone.
    again = pull(clients, world.op, token)
    assert again.status_code == 404
    assert again.json() == {"error": "password not available"}
    assert all(token not in line and world.password not in line for line in lines(world.op.id))


def test_a_token_bound_to_another_ops_pod_is_refused_and_the_entry_stays(clients, world):
    # (b) the same ServiceAccount, bound to the runner pod of another operation, presented
    # with this op's (guessable) runner id and epoch.
    token = world.token(world.other.id)
    response = pull(clients, world.op, token)
    assert response.status_code == 403
    assert response.json() == {"error": "runner identity not proven for this operation"}
    assert stash.get(world.op.id) == world.password
    (line,) = lines(world.op.id)
    assert f"the token is bound to pod '{runner_name(world.other.id)}'" in line
    assert token not in line
    # The right pod still pulls afterwards.
    assert pull(clients, world.op, world.token(world.op.id)).status_code == 200


def test_a_token_for_another_audience_is_refused(clients, world):
    # (c) bound to the right pod, but minted for another audience (e.g. the Kubernetes API).
    token = world.token(world.op.id, audience="https://kubernetes.default.svc")
    response = pull(clients, world.op, token)
    assert response.status_code == 403
    assert stash.get(world.op.id) == world.password
    assert "the API server refused the token" in lines(world.op.id)[0]


def test_a_token_of_another_service_account_is_refused(clients, world):
    # (d) a pod of the op's runner name running as another ServiceAccount.
    world.kube.core.delete_namespaced_pod(
        runner_name(world.op.id), world.kube.namespace, grace_period_seconds=0
    )
    impostor = _pod(world.kube, runner_name(world.op.id), "some-other-account")
    world.pods[world.op.id] = impostor
    ReshardOperation.objects.filter(pk=world.op.id).update(runner_pod_uid=impostor.metadata.uid)
    token = world.token(world.op.id, account="some-other-account")
    response = pull(clients, world.op, token)
    assert response.status_code == 403
    assert stash.get(world.op.id) == world.password
    assert "some-other-account" in lines(world.op.id)[0]


def test_a_token_of_an_earlier_pod_of_the_same_name_is_refused(clients, world):
    # The claim recorded the uid of the pod that claimed the current epoch: another pod
    # incarnation's token (same name, other uid) does not pull.
    ReshardOperation.objects.filter(pk=world.op.id).update(runner_pod_uid="not-the-pods-uid")
    response = pull(clients, world.op, world.token(world.op.id))
    assert response.status_code == 403
    assert "not the uid the current runner claimed with" in lines(world.op.id)[0]
    assert stash.get(world.op.id) == world.password


def test_the_right_token_with_a_stale_epoch_is_404(clients, world):
    response = pull(clients, world.op, world.token(world.op.id), epoch=world.op.runner_epoch - 1)
    assert response.status_code == 404
    assert stash.get(world.op.id) == world.password
