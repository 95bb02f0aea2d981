"""Every PromQL expression of the monitoring files names only metrics the product exports.

The known names come from the product's own registries (``tests.monitoring.promql``): a typo,
a renamed metric or a series suffix that does not exist (a counter without ``_total``, a
histogram without ``_bucket``/``_sum``/``_count``) fails here instead of producing an alert that
can never fire or an empty panel. The dashboard shows every product metric, and every product
metric is documented.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.monitoring import monitoring_files as files
from tests.monitoring.promql import (
    exported_families,
    exported_series_names,
    metric_names,
    product_metric_modules,
    series_names,
)

ROOT = Path(__file__).resolve().parents[2]
METRIC_DOCS = ("docs/janitor.md", "docs/trino-metrics.md", "docs/api.md", "docs/monitoring.md")


@pytest.fixture(scope="module")
def known() -> set[str]:
    return exported_series_names()


def _product_families() -> dict[str, str]:
    return {
        name: kind for name, kind in exported_families().items() if name.startswith("duckgres_")
    }


def test_the_known_names_come_from_every_product_registry(known: set[str]) -> None:
    assert set(product_metric_modules()) >= {
        "reshard.control.metrics",
        "trino_pools.metrics",
        "trino_pools.term_metrics",
    }
    # One of each kind and each registry: the collection is not vacuous.
    assert "duckgres_janitor_last_reconcile_timestamp_seconds" in known  # default registry
    assert "duckgres_trino_pool_configured" in known  # TRINO_REGISTRY, custom collector
    assert "duckgres_trino_pool_snapshot_timestamp_seconds" in known  # term collector
    assert "duckgres_reshard_runner_respawns_total" in known  # counter: _total only
    assert "duckgres_reshard_runner_respawns" not in known
    assert "duckgres_trino_pool_reconcile_failures_total" in known
    assert {
        "duckgres_reshard_step_duration_seconds_bucket",
        "duckgres_reshard_step_duration_seconds_sum",
        "duckgres_reshard_step_duration_seconds_count",
    } <= known
    assert "duckgres_reshard_step_duration_seconds" not in known  # histogram: suffixes only


def test_the_lexer_finds_metric_names_and_nothing_else() -> None:
    expr = (
        'sum by (pool, reason) (increase(duckgres_a_total{pool=~"$pool", reason!="x y"}'
        "[$__rate_interval])) > 0 and on(pool) (time() - max without (instance) "
        "(duckgres_b offset 5m) < 1e3) unless ignoring(phase) "
        'label_replace(duckgres_c, "dst", "$1", "src", "(.*)") or vector(0)'
    )
    assert metric_names(expr) == {"duckgres_a_total", "duckgres_b", "duckgres_c"}
    assert metric_names("histogram_quantile(0.95, sum(rate(x_bucket[5m])) by (le))") == {"x_bucket"}
    with pytest.raises(ValueError, match="unknown PromQL function"):
        metric_names("no_such_function(duckgres_a)")


def test_series_names_follow_the_exposition_format() -> None:
    assert series_names("x", "counter") == {"x_total"}
    assert series_names("h", "histogram") == {"h_bucket", "h_sum", "h_count"}
    assert series_names("g", "gauge") == {"g"}


def _unknown(queries: list[tuple[str, str]], known: set[str]) -> list[str]:
    problems = []
    for where, expr in queries:
        names = metric_names(expr)
        if not names:
            problems.append(f"{where}: names no metric at all: {expr}")
        for name in sorted(names - known):
            problems.append(f"{where}: {name} is not exported by the product")
    return problems


def test_every_rule_expression_names_only_exported_metrics(known: set[str]) -> None:
    queries = files.rule_expressions()
    assert len(queries) >= 14
    assert _unknown(queries, known) == []


def test_every_dashboard_query_names_only_exported_metrics(known: set[str]) -> None:
    queries = files.dashboard_queries()
    assert len(queries) >= 20
    assert any(where.startswith("variable") for where, _ in queries)
    assert _unknown(queries, known) == []


def test_a_misspelt_metric_would_be_caught(known: set[str]) -> None:
    assert _unknown([("t", "max(duckgres_janitor_is_leaderr)")], known) == [
        "t: duckgres_janitor_is_leaderr is not exported by the product"
    ]
    assert _unknown([("t", "increase(duckgres_reshard_runner_respawns[5m])")], known)


def test_the_dashboard_shows_every_product_metric() -> None:
    used: set[str] = set()
    for _, expr in files.dashboard_queries():
        used |= metric_names(expr)
    missing = [
        family
        for family, kind in sorted(_product_families().items())
        if not series_names(family, kind) & used
    ]
    assert missing == []


def test_the_rules_cover_the_liveness_gauge() -> None:
    names: set[str] = set()
    for _, expr in files.rule_expressions():
        names |= metric_names(expr)
    assert "duckgres_janitor_last_reconcile_timestamp_seconds" in names


def test_every_product_metric_is_documented() -> None:
    docs = "\n".join((ROOT / path).read_text() for path in METRIC_DOCS)
    missing = []
    for family, kind in sorted(_product_families().items()):
        shown = family + "_total" if kind == "counter" else family
        if f"`{shown}`" not in docs:
            missing.append(shown)
    assert missing == []
