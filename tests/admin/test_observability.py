"""Observability as operators scrape it (issue 6 item 5; docs/admin.md "Observability").

The control worker's exporter serves the spec §7 names on its port, and the manifests publish
both exporters (control 9108, Trino 9109) through a Service port named ``metrics`` whose target
is the container port of the same name, so an endpoints-based Prometheus job finds them.
"""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest
import yaml

from tests.fixtures.processes import ROOT

SPEC_METRICS = (
    "duckgres_reshard_active_operations",
    "duckgres_reshard_stale_operations",
    "duckgres_reshard_recovery_required_operations",
    "duckgres_reshard_runner_respawns_total",
    "duckgres_reshard_step_duration_seconds",
    "duckgres_reshard_maintenance_window_seconds",
    "duckgres_janitor_is_leader",
    "duckgres_janitor_lease_epoch",
)


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "k8s" / name).read_text()) if d]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("manifest", "component", "port"),
    [("control-worker.yaml", "control-worker", 9108), ("trino-worker.yaml", "trino-worker", 9109)],
)
def test_each_exporter_is_published_by_a_metrics_service(manifest: str, component: str, port: int):
    docs = _docs(manifest)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    ports = {
        p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
    }
    assert ports.get("metrics") == port
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == {"app": "duckgres-admin", "component": component}
    assert pod["metadata"]["labels"]["component"] == component
    assert {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"} in service[
        "spec"
    ]["ports"]


def test_the_control_exporter_serves_the_spec_metrics():
    from reshard import metrics

    port = _free_port()
    assert metrics.start_exporter(port) is True
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    for name in SPEC_METRICS:
        assert f"# TYPE {name.removesuffix('_total')}" in body, name
