"""Runner pod start latency on the one-node cluster (issue: real pods), with its baseline.

    .ci/kube-node.sh start && make image
    .venv/bin/python scripts/with_test_env.py bench/bench_pod_start.py [--starts 20] [--kills 3]

It deploys the product from the test overlay (tests/pods, the same as the pods suite), then:

- baseline: a bare pod of the same image (``python -c pass``, restartPolicy Never) created
  through the API server until the kubelet reports it Running, ``--starts`` times;
- API start -> runner pod Running: ``POST /warehouses/<org>/reshards`` through the API Service
  until the runner pod ``duckgres-reshard-op-<id>`` is observed Running, for ``--starts``
  reshards of small catalogs, one at a time (each must succeed);
- runner pod Running -> claimed: the op row's first claim time (``started_at``, the database
  clock, the same machine's clock) minus the moment the pod was observed Running;
- relaunch after ``kill -9`` of the runner's container (through containerd) mid-copy of a
  1,500-table catalog: from the kill until the op row shows the next runner's claim
  (``runner_epoch`` 2, polled every 0.2 s), ``--kills`` times (each op must then succeed).

Pods are observed through the apiserver with the Kubernetes client (admin kubeconfig), one
read every 50 ms. Prints the machine, p50/p95/max of each and the ratio of the start latency to
the bare-pod baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _line(name: str, values: list[float], base: float | None = None) -> str:
    p50, p95 = statistics.median(values), _pct(values, 0.95)
    ratio = f" ({p50 / base:.2f}x the bare-pod p50)" if base else ""
    return (
        f"{name}: p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(values):.2f} s, n={len(values)}{ratio}"
    )


_CORE: Any = None


def _core() -> Any:
    global _CORE
    if _CORE is None:
        from kubernetes import client, config

        from tests.fixtures.pods import KUBECONFIG

        api = config.new_client_from_config(config_file=str(KUBECONFIG))  # type: ignore[no-untyped-call]
        _CORE = client.CoreV1Api(api)
    return _CORE


def _observe_running(name: str, timeout: float = 120) -> float:
    """The monotonic time at which pod ``name`` is first seen Running (or already finished)."""
    from kubernetes.client.exceptions import ApiException

    from tests.fixtures.pods import NAMESPACE

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            phase = _core().read_namespaced_pod(name, NAMESPACE, _request_timeout=5).status.phase
        except ApiException as exc:
            if exc.status != 404:
                raise
            phase = None
        if phase in ("Running", "Succeeded", "Failed"):
            return time.monotonic()
        time.sleep(0.05)
    raise RuntimeError(f"pod {name} not Running after {timeout} s")


def bare_pod_starts(n: int) -> list[float]:
    import json

    from tests.fixtures.pods import NAMESPACE, kubectl

    out: list[float] = []
    for i in range(n):
        name = f"bench-bare-{os.getpid()}-{i}"
        doc = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "c", "image": "localhost/duckgres-admin:0.1.0",
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", "import time; time.sleep(2)"],
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}},
                }],
            },
        }  # fmt: skip
        started = time.monotonic()
        kubectl("apply", "-f", "-", input=json.dumps(doc))
        out.append(_observe_running(name) - started)
        kubectl("-n", NAMESPACE, "delete", "pod", name, "--grace-period=0", "--force",
                "--wait=false", check=False)  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")
    django.setup()
    from tests.fixtures.pods import deploy_product
    from tests.fixtures.stores import StoreCluster, StoreClusters

    clusters = StoreClusters(
        source=StoreCluster("ci_source", "127.0.0.1", 5433),
        target=StoreCluster("ci_target", "127.0.0.1", 5434),
    )
    deployed, teardown = deploy_product(clusters)
    try:
        return _measure(deployed, args)
    finally:
        teardown()


def _wait_succeeded(deployed: Any, op_id: int, timeout: float) -> None:
    op = deployed.api.wait_terminal(op_id, timeout=timeout)
    if op.get("state") != "succeeded":
        raise RuntimeError(f"op {op_id} ended {op.get('state')}: {op.get('error')}")


def _measure(deployed: Any, args: argparse.Namespace) -> int:
    import subprocess

    from tests.fixtures.pods import NODE_DIR, container_id, runner_pod, wait_step
    from tests.pods.tenants import Tenant

    bare = bare_pod_starts(args.starts)
    to_running: list[float] = []
    to_claim: list[float] = []
    relaunch: list[float] = []
    tenants: list[Tenant] = []
    try:
        for _ in range(args.starts):
            t = Tenant(deployed, rows=2)
            tenants.append(t)
            started = time.monotonic()
            op_id = t.to_cnpg_target()
            running = _observe_running(f"duckgres-reshard-op-{op_id}")
            to_running.append(running - started)
            running_wall = time.time() - (time.monotonic() - running)
            _wait_succeeded(deployed, op_id, 300)
            claimed = deployed.one(
                "SELECT extract(epoch FROM started_at) FROM duckgres_reshard_operations "
                "WHERE id=%s", op_id,
            )  # fmt: skip
            to_claim.append(float(claimed) - running_wall)
        for _ in range(args.kills):
            t = Tenant(deployed, tables=1500)
            tenants.append(t)
            op_id = t.to_cnpg_target()
            wait_step(deployed, op_id, {"copying"}, 180)
            pod = runner_pod(op_id)
            assert pod is not None
            killed = time.monotonic()
            subprocess.run(
                ["ctr", "--address", str(NODE_DIR / "containerd" / "containerd.sock"), "-n",
                 "k8s.io", "tasks", "kill", "-s", "KILL", container_id(pod)],
                check=True, capture_output=True,
            )  # fmt: skip
            deadline = killed + 600
            while time.monotonic() < deadline:
                epoch = deployed.one(
                    "SELECT runner_epoch FROM duckgres_reshard_operations WHERE id=%s", op_id
                )
                if int(epoch) >= 2:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"op {op_id}: no runner claimed within 600 s of the kill")
            relaunch.append(time.monotonic() - killed)
            _wait_succeeded(deployed, op_id, 600)
    finally:
        for t in tenants:
            t.cleanup()
    base = statistics.median(bare)
    print(
        f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"{args.starts} starts, {args.kills} kills"
    )
    print(_line("baseline: bare pod create -> Running", bare))
    print(_line("API start -> runner pod Running", to_running, base))
    print(_line("runner pod Running -> claimed", to_claim))
    if relaunch:
        print(_line("kill -9 of the runner -> next runner claimed", relaunch))
    for label, values in (("bare", bare), ("start", to_running), ("claim", to_claim),
                          ("relaunch", relaunch)):  # fmt: skip
        print(f"  {label}: " + " ".join(f"{v:.2f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
