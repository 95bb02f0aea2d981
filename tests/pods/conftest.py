"""The product deployed on the real one-node cluster (marker ``pods``; docs/testing.md).

Once per session ``deployed`` installs the control plane exactly as an operator does — the
namespace, the Secret, ``kubectl apply -k`` of the test overlay over ``k8s/`` — after importing
the image built by ``make image`` into the node's containerd, then waits for the migration Job
and every Deployment. What stays on the host, reached by the pods at the bridge address
10.244.0.1: the config store (a fresh database ``duckgres_pods`` with a password login, so no
pytest-django database is shared with the pods), Redis (db 4), the two store clusters
(5433/5434), an S3 server (moto, 10.244.0.1:19000) and, for the one Trino pool wired in the
overlay (tests/pods/overlay/trino.yaml), its catalog store (a fresh database
``duckgres_pods_trino`` with its own password login) and its Gateway (the double of
tests/trino/gateway_double.py over HTTPS on 10.244.0.1:443, certificate from the test CA). The
cell namespace ``duckgres-trino-cell`` is recreated per session with
k8s/trino-rbac/cell-rolebinding.yaml applied in it, as docs/kubernetes.md says. The tests drive
the API only through its Service and read what they check from the cluster, the config store,
the catalog store, the Gateway double and S3 directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.availability import pods_unavailable
from tests.fixtures.pods import Deployed, deploy_product
from tests.fixtures.stores import StoreClusters


@pytest.fixture(scope="session")
def deployed(store_clusters: StoreClusters) -> Iterator[Deployed]:
    reason = pods_unavailable()
    if reason:
        pytest.skip(f"[pods] {reason}")
    product, teardown = deploy_product(store_clusters)
    try:
        yield product
    finally:
        teardown()
