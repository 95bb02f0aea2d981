"""The monitoring-as-code files (k8s/monitoring/) and their PromQL, read the way the tests need.

- ``rule_spec()``: the PrometheusRule's ``spec``, which is a plain Prometheus rule file.
- ``rule_expressions()``: every alert (or recording rule) name with its expression.
- ``dashboard_queries()``: every PromQL query of the Grafana dashboard (panel targets, nested
  row panels, variable queries), as ``(where, expr)``.
- ``grafana_to_promql(expr)``: Grafana's variables replaced by values PromQL accepts, so that
  ``promtool`` can check the dashboard's queries too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring.promql import grafana_query_expr

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "k8s" / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
KUSTOMIZATION = MONITORING / "kustomization.yaml"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "promtool"
RULES_FILE_NAME = "duckgres-admin.rules.yml"  # what the promtool test files name in rule_files


def prometheus_rule() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(PROMETHEUS_RULE.read_text())
    return document


def rule_spec() -> dict[str, Any]:
    spec: dict[str, Any] = prometheus_rule()["spec"]
    return spec


def write_rule_file(directory: Path) -> Path:
    """The PrometheusRule's ``spec`` as a plain rule file in ``directory``."""
    path = directory / RULES_FILE_NAME
    path.write_text(yaml.safe_dump(rule_spec(), sort_keys=False))
    return path


def rules() -> Iterator[dict[str, Any]]:
    for group in rule_spec()["groups"]:
        yield from group["rules"]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def rule_expressions() -> list[tuple[str, str]]:
    return [(rule.get("alert") or rule["record"], str(rule["expr"])) for rule in rules()]


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_panels() -> list[dict[str, Any]]:
    return list(_panels(dashboard()["panels"]))


def dashboard_queries() -> list[tuple[str, str]]:
    queries: list[tuple[str, str]] = []
    for panel in dashboard_panels():
        for target in panel.get("targets") or []:
            if "expr" in target:
                queries.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard()["templating"]["list"]:
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        expr = grafana_query_expr(text)
        if expr is not None:
            queries.append((f"variable {variable['name']!r}", expr))
    return queries


_GRAFANA_DURATIONS = re.compile(
    r"\$__(?:rate_interval|interval|range)\b|\$\{__(?:rate_interval|interval|range)\}"
)
_GRAFANA_VARIABLES = re.compile(r"\$\{\w+\}|\$\w+")


def grafana_to_promql(expr: str) -> str:
    return _GRAFANA_VARIABLES.sub(".*", _GRAFANA_DURATIONS.sub("5m", expr))
