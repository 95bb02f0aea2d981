"""Observability as operators scrape it (issue 6 item 5; docs/admin.md "Observability").

The manifests publish both exporters (control 9108, Trino 9109) through a Service port named
``metrics`` whose target is the container port of the same name, so an endpoints-based
Prometheus job finds them. That the control exporter serves the spec §7 names is proved in
tests/reshard/test_launch_task.py (one exporter per process, so it is not started here too).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.fixtures.processes import ROOT


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "k8s" / "base" / name).read_text()) if d]


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
