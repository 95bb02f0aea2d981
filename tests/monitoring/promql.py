"""Metric names in PromQL expressions and the metric names the product exports (test helpers).

``metric_names(expr)`` is a small lexer, not a parser: it drops string literals, Grafana
variables, range/subquery brackets, label matchers and grouping label lists, then keeps every
identifier that is neither a keyword nor followed by ``(`` (a function or an aggregation). The
syntax of the expressions themselves is checked by ``promtool check rules``
(tests/monitoring/test_rules_promtool.py).

``exported_series_names()`` imports every product module that uses ``prometheus_client`` and
collects the families of every registry it finds (the default ``REGISTRY`` and module-level
``CollectorRegistry`` objects such as ``TRINO_REGISTRY``), so a metric is "known" only when the
product really registers it. A family yields the series names Prometheus stores: the name for
a gauge (or untyped/info-less family), ``_total`` for a counter, ``_bucket``/``_sum``/``_count``
for a histogram, ``_sum``/``_count`` (and the name) for a summary.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("duckgres_admin", "reshard", "trino_pools")

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
     "group_right", "inf", "nan", "start", "end", "atan2"}
)  # fmt: skip

FUNCTIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
     "bottomk", "topk", "quantile", "abs", "absent", "absent_over_time", "ceil", "changes",
     "clamp", "clamp_max", "clamp_min", "day_of_month", "day_of_week", "day_of_year",
     "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
     "hour", "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log2",
     "log10", "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn",
     "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year", "avg_over_time",
     "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
     "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
     "present_over_time"}
)  # fmt: skip

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_TOKEN = re.compile(r"(?P<number>\d[\w.]*)|(?P<ident>[A-Za-z_:][\w:]*)(?P<call>\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<expr>.*),)?\s*\w+\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects; raises ValueError on an unknown function."""
    text = _STRINGS.sub('""', expr)
    text = _GRAFANA_VARIABLE.sub("", text)
    text = _BRACKETS.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names: set[str] = set()
    for match in _TOKEN.finditer(text):
        ident = match["ident"]
        if ident is None or ident in KEYWORDS:
            continue
        if match["call"]:
            if ident not in FUNCTIONS:
                raise ValueError(f"unknown PromQL function {ident!r} in {expr!r}")
            continue
        names.add(ident)
    return names


def grafana_query_expr(query: str) -> str | None:
    """The PromQL part of a Grafana Prometheus variable query (``label_values(expr, label)``),
    the query itself when it is plain PromQL, or ``None`` (``label_values(label)``)."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        return query
    return match["expr"]


def product_metric_modules() -> list[str]:
    """Product modules that import prometheus_client (found by reading the sources)."""
    modules = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            if re.search(r"^\s*(from|import) prometheus_client", path.read_text(), re.M):
                modules.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return modules


def product_registries() -> list[CollectorRegistry]:
    # The API's per-route request metrics: django-prometheus's middleware (settings.MIDDLEWARE)
    # registers them in the default registry when the API first builds it.
    importlib.import_module("django_prometheus.middleware").Metrics.get_instance()
    registries: list[CollectorRegistry] = [REGISTRY]
    for name in product_metric_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, CollectorRegistry) and all(value is not r for r in registries):
                registries.append(value)
    return registries


def exported_families() -> dict[str, str]:
    """Family name -> type for every family of every product registry."""
    families: dict[str, str] = {}
    for registry in product_registries():
        for family in registry.collect():
            families[family.name] = family.type
    return families


_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
}


def series_names(family: str, kind: str) -> set[str]:
    return {family + suffix for suffix in _SUFFIXES.get(kind, ("",))}


def exported_series_names() -> set[str]:
    names: set[str] = set()
    for family, kind in exported_families().items():
        names |= series_names(family, kind)
    return names
