"""What the deploy tests need to know about PromQL, the worker's metrics and the
repository's monitoring files. Pure functions, no services.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stream_dp.metrics.budget import BudgetMetrics, BulkHistogram
from stream_dp.metrics.worker import WorkerMetrics

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
RULES_DIR = PROMETHEUS_DIR / "rules"
RULE_TESTS_DIR = PROMETHEUS_DIR / "tests"
DASHBOARD_JSON = REPO / "deploy" / "grafana" / "dashboards" / "stream-dp.json"
DASHBOARD_GENERATOR = REPO / "deploy" / "grafana" / "dashboard.py"

# Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
PROMETHEUS_SERIES = {"up": frozenset()}

_SELECTOR = re.compile(r"\b((?:stream_dp_[a-z0-9_]+)|up)\b\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Series:
    """One exposed series name: its metric family, type and label names."""

    name: str
    family: str
    kind: str  # counter, gauge, histogram
    labels: frozenset[str]


def metric_catalogue() -> dict[str, Series]:
    """Every series name the worker exposes, from the metric classes themselves."""
    registry = CollectorRegistry()
    holders = [WorkerMetrics(registry), BudgetMetrics(registry)]
    catalogue: dict[str, Series] = {}
    for holder in holders:
        for metric in vars(holder).values():
            if isinstance(metric, BulkHistogram):
                family, kind, labels = metric.name, "histogram", frozenset(metric.labelnames)
            elif isinstance(metric, Counter | Gauge | Histogram):
                family = metric._name  # prometheus_client keeps no public name or label names
                kind = metric._type
                labels = frozenset(metric._labelnames)
            else:
                continue
            if kind == "counter":
                names = {f"{family}_total": labels}
            elif kind == "histogram":
                names = {f"{family}_bucket": labels | {"le"}, f"{family}_sum": labels, f"{family}_count": labels}
            else:
                names = {family: labels}
            for name, series_labels in names.items():
                catalogue[name] = Series(name, family, kind, series_labels)
    for name, labels in PROMETHEUS_SERIES.items():
        catalogue[name] = Series(name, name, "gauge", labels)
    return catalogue


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


def selectors(expr: str) -> list[Selector]:
    """Vector selectors of an expression (metric name with optional ``{...}`` matchers)."""
    found = []
    for match in _SELECTOR.finditer(expr):
        body = (match.group(2) or "{}")[1:-1]
        matchers = tuple((m.group(1), m.group(2), m.group(3)) for m in _MATCHER.finditer(body))
        consumed = "".join(m.group(0) for m in _MATCHER.finditer(body))
        if consumed.strip() != body.strip():
            raise ValueError(f"cannot read the matchers {{{body}}} of {expr!r}")
        found.append(Selector(match.group(1), matchers))
    return found


def grouping_labels(expr: str) -> set[str]:
    """Labels named in ``by``/``on``/``without``/``ignoring`` clauses."""
    labels: set[str] = set()
    for match in _GROUPING.finditer(expr):
        labels |= {label.strip() for label in match.group(1).split(",") if label.strip()}
    return labels


def label_problems(expr: str, catalogue: dict[str, Series]) -> list[str]:
    """What is wrong with the metric and label names of ``expr`` (empty when nothing)."""
    problems = []
    found = selectors(expr)
    if not found:
        problems.append(f"no worker metric in {expr!r}")
    known: set[str] = set(TARGET_LABELS)
    for selector in found:
        series = catalogue.get(selector.metric)
        if series is None:
            problems.append(f"{selector.metric} is not exposed by the worker (in {expr!r})")
            continue
        known |= series.labels
        for label, _op, value in selector.matchers:
            if label not in series.labels | TARGET_LABELS:
                problems.append(f"{selector.metric} has no label {label!r} (it has {sorted(series.labels)})")
            if label == "threshold" and "$" not in value and repr(float(value)) != value:
                # BudgetMetrics labels thresholds with repr(float(t)): "1.0", never "1".
                problems.append(f"threshold={value!r} never matches; write {repr(float(value))!r}")
    for label in grouping_labels(expr) - known:
        problems.append(f"grouping by {label!r}, which no series in {expr!r} has")
    return problems


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of deploy/prometheus/rules/*.yml, with its file name under ``_file``."""
    rules = []
    for path in sorted(RULES_DIR.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                rules.append({**rule, "_file": path.name})
    return rules


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text())


def dashboard_generator() -> ModuleType:
    """deploy/grafana/dashboard.py, imported from its path (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("stream_dp_dashboard", DASHBOARD_GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels with queries (rows left out; panels nested in collapsed rows included)."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace Grafana variables (``$name`` and ``${name}``) with values."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    leftover = re.search(r"\$\{?[A-Za-z_]\w*", expr)
    if leftover:
        raise ValueError(f"no value for the variable {leftover.group(0)} in {expr!r}")
    return expr
