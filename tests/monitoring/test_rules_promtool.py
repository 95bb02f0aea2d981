"""The alert rules through ``promtool`` (Debian's ``prometheus`` package, ``.ci/promtool.sh``).

The PrometheusRule's ``spec`` is written to a temporary plain rule file; ``promtool check
rules`` must accept it, and ``promtool test rules`` must pass the unit tests in
``tests/monitoring/promtool/`` (input series and the alerts expected at each time), where every
alert has at least one firing and one not-firing case. The dashboard's queries are checked as
PromQL by the same ``promtool`` (as recording rules of a throw-away file).

These tests never skip: without promtool they FAIL, in CI and locally, with the command that
installs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring import monitoring_files as files

PROMTOOL = "/usr/bin/promtool"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def promtool() -> str:
    path = PROMTOOL if Path(PROMTOOL).is_file() else shutil.which("promtool")
    if not path:
        pytest.fail(
            f"promtool is missing ({PROMTOOL}): install it with `.ci/promtool.sh` (Debian's "
            "prometheus package, --no-install-recommends); the monitoring rule tests never skip"
        )
    return path


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)


def _test_files() -> list[Path]:
    return sorted(files.PROMTOOL_TESTS.glob("*.test.yml"))


def test_the_prometheusrule_is_a_prometheus_operator_resource() -> None:
    document = files.prometheus_rule()
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert document["kind"] == "PrometheusRule"
    assert document["metadata"]["namespace"] == "duckgres"
    assert set(document["spec"]) == {"groups"}, "the spec is a plain rule file, nothing else"
    names = [group["name"] for group in document["spec"]["groups"]]
    assert names == ["duckgres-reshard-janitor", "duckgres-platform", "duckgres-trino-pools"]


def test_promtool_check_rules(promtool: str, tmp_path: Path) -> None:
    rule_file = files.write_rule_file(tmp_path)
    result = _run(promtool, "check", "rules", rule_file.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(list(files.rules()))} rules found" in result.stdout


def test_promtool_unit_tests(promtool: str, tmp_path: Path) -> None:
    files.write_rule_file(tmp_path)
    tests = _test_files()
    assert [p.name for p in tests] == ["janitor.test.yml", "platform.test.yml", "trino.test.yml"]
    for path in tests:
        shutil.copy(path, tmp_path / path.name)
    result = _run(promtool, "test", "rules", *(p.name for p in tests), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests), result.stdout


def test_a_broken_rule_fails_the_unit_tests(promtool: str, tmp_path: Path) -> None:
    """The harness really compares: the liveness alert with a threshold no test reaches."""
    spec = files.rule_spec()
    for group in spec["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "DuckgresJanitorReconcileStale":
                rule["expr"] = rule["expr"].replace("> 120", "> 100000")
    (tmp_path / files.RULES_FILE_NAME).write_text(yaml.safe_dump(spec))
    shutil.copy(files.PROMTOOL_TESTS / "janitor.test.yml", tmp_path / "janitor.test.yml")
    result = _run(promtool, "test", "rules", "janitor.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "DuckgresJanitorReconcileStale" in result.stdout + result.stderr


def _alert_cases() -> dict[str, dict[str, int]]:
    cases: dict[str, dict[str, int]] = {}
    for path in _test_files():
        document: dict[str, Any] = yaml.safe_load(path.read_text())
        assert document["rule_files"] == [files.RULES_FILE_NAME], path.name
        for test in document["tests"]:
            for case in test.get("alert_rule_test") or []:
                kind = "firing" if case.get("exp_alerts") else "not firing"
                counts = cases.setdefault(case["alertname"], {"firing": 0, "not firing": 0})
                counts[kind] += 1
    return cases


def test_every_alert_has_a_firing_and_a_not_firing_case() -> None:
    cases = _alert_cases()
    alert_names = [rule["alert"] for rule in files.alerts()]
    assert len(alert_names) == len(set(alert_names))
    missing = [
        f"{name}: no {kind} case"
        for name in alert_names
        for kind in ("firing", "not firing")
        if cases.get(name, {}).get(kind, 0) == 0
    ]
    assert missing == []
    assert set(cases) <= set(alert_names), "a test names an alert that does not exist"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section() -> None:
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in doc.splitlines()
        if line.startswith("#")
    }
    for rule in files.alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"], name
        assert rule["annotations"]["runbook"] == f"docs/monitoring.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/monitoring.md has no section {name}"


def test_the_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    queries = files.dashboard_queries()
    rule_file = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": files.grafana_to_promql(expr)}
                    for i, (_, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rule_file))
    result = _run(promtool, "check", "rules", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kustomization_ships_the_rule_and_the_dashboard() -> None:
    document = yaml.safe_load(files.KUSTOMIZATION.read_text())
    assert document["resources"] == ["prometheusrule.yaml"]
    (generator,) = document["configMapGenerator"]
    assert generator["files"] == ["duckgres-admin.json=grafana-dashboard.json"]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"
    for name in ("prometheusrule.yaml", "grafana-dashboard.json"):
        assert (files.MONITORING / name).is_file()


def test_the_promtool_installer_is_idempotent_and_minimal() -> None:
    script = (ROOT / ".ci" / "promtool.sh").read_text()
    assert "--no-install-recommends prometheus" in script
    assert re.search(r'if \[ -x "\$PROMTOOL" \]; then', script), "returns when present"
    assert (ROOT / ".ci" / "promtool.sh").stat().st_mode & 0o111
