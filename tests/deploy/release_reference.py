"""What the releases dashboard must show, worked out from the records on the output topics, and a reader of
the few PromQL forms its panels use. Pure functions, no services.

The reference is written from the record format (docs/reference/output-records.md, the release schema)
and the series names of docs/operations/releases.md, not from ``stream_dp.export``: each query's newest
window (the largest ``window.start_ms``) gives, per group, its numbers under the documented names and
labels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

Key = tuple[str, frozenset[tuple[str, str]]]  # (metric, labels without job/instance/__name__)
SCRAPE_LABELS = {"job", "instance", "__name__"}


def _put(out: dict[Key, float], metric: str, value: Any, **labels: str) -> None:
    if value is None:
        return
    out[(metric, frozenset(labels.items()))] = float(value)


def _capped(records: list[Mapping[str, Any]], max_groups: int) -> list[Mapping[str, Any]]:
    """Under selected groups, the group records of the ``max_groups`` largest noisy counts (ties by group)."""
    groups = [r for r in records if r.get("kind") != "top_k"]
    if not groups or groups[0]["privacy"]["groups"] != "selected":
        return records
    label = lambda r: ",".join(str(v) for v in r["group"].values())  # noqa: E731
    kept = sorted(groups, key=lambda r: (-(r["count"] if r["count"] is not None else -math.inf), label(r)))
    return [r for r in records if r.get("kind") == "top_k"] + kept[:max_groups]


def window_series(records: Iterable[Mapping[str, Any]], max_groups: int) -> dict[Key, float]:
    """The series of one window's records of one query, at most ``max_groups`` of them under selected groups."""
    records = list(records)
    shown = _capped(records, max_groups)
    out: dict[Key, float] = {}
    for record in records:
        if record not in shown:
            continue
        query = record["query"]
        _put(out, "stream_dp_release_window_end_seconds", record["window"]["end_ms"] / 1000, query=query)
        # what the window spent: a group record's epsilon, a top_k record's window_epsilon (its epsilon is its share)
        privacy = record["privacy"]
        _put(out, "stream_dp_release_epsilon", privacy.get("window_epsilon", privacy["epsilon"]), query=query)
        if record.get("kind") == "top_k":
            for entry in record["top"]:
                group = ",".join(str(v) for v in entry["group"].values())
                _put(out, "stream_dp_release_top_k_rank", entry["rank"], query=query, group=group)
            continue
        group = ",".join(str(v) for v in record["group"].values())
        name = "stream_dp_release_running_total" if "continual" in record else "stream_dp_release_value"
        for statistic in ("count", "sum", "mean"):
            if record[statistic] is not None:
                _put(out, name, record[statistic], query=query, group=group, statistic=statistic)
                _put(out, f"{name}_ci95", record["ci95"][statistic], query=query, group=group, statistic=statistic)
        for q, answer in (record.get("quantiles") or {}).items():
            _put(out, "stream_dp_release_quantile", answer["value"], query=query, group=group, q=str(float(q)))
            low, high = answer.get("value_ci95") or (None, None)
            _put(out, "stream_dp_release_quantile_lower", low, query=query, group=group, q=str(float(q)))
            _put(out, "stream_dp_release_quantile_upper", high, query=query, group=group, q=str(float(q)))
        vector = record.get("mean_vector")
        if vector and vector["mean"] is not None:
            for name_, mean, half in zip(vector["fields"], vector["mean"], vector["mean_ci95"], strict=True):
                _put(out, "stream_dp_release_vector_mean", mean, query=query, group=group, field=name_)
                _put(out, "stream_dp_release_vector_mean_ci95", half, query=query, group=group, field=name_)
        covariance = record.get("covariance")
        if covariance and covariance["covariance"] is not None:
            fields = covariance["fields"]
            for name_, mean in zip(fields, covariance["mean"], strict=True):
                _put(out, "stream_dp_release_vector_mean", mean, query=query, group=group, field=name_)
            for name_, row in zip(fields, covariance["covariance"], strict=True):
                for other, entry in zip(fields, row, strict=True):
                    _put(out, "stream_dp_release_covariance", entry, query=query, group=group, field=name_,
                         other=other)
        statistic = record.get("sample_aggregate")
        if statistic:
            _put(out, "stream_dp_release_sample_aggregate", statistic["value"], query=query, group=group)
            _put(out, "stream_dp_release_sample_aggregate_ci95", statistic.get("ci95"), query=query, group=group)
        if record.get("local_dp"):
            _put(out, "stream_dp_release_local_dp_reports", record["local_dp"]["reports"], query=query, group=group)
    as_if_empty = any("as_if_empty" in r for r in records)
    for key in [k for k in out if k[0] == "stream_dp_release_window_end_seconds"]:
        out[("stream_dp_release_as_if_empty", key[1])] = float(as_if_empty)
    return out


def by_window(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, list[Mapping[str, Any]]]]:
    """query -> window start -> its records."""
    out: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for record in records:
        out.setdefault(record["query"], {}).setdefault(record["window"]["start_ms"], []).append(record)
    return out


def latest_series(records: Iterable[Mapping[str, Any]], max_groups: int) -> dict[Key, float]:
    """The series of each query's newest window."""
    out: dict[Key, float] = {}
    for windows in by_window(records).values():
        out.update(window_series(windows[max(windows)], max_groups))
    return out


def every_value(records: Iterable[Mapping[str, Any]], max_groups: int) -> dict[Key, set[float]]:
    """Every value each series took over all windows."""
    out: dict[Key, set[float]] = {}
    for windows in by_window(records).values():
        for window in windows.values():
            for key, value in window_series(window, max_groups).items():
                out.setdefault(key, set()).add(value)
    return out


_SELECTOR = r'(stream_dp_release_\w+)\{([^}]*)\}'
_FORM = re.compile(rf"^{_SELECTOR}(?:\s*([-+*])\s*(?:on\(([\w, ]+)\)\s*{_SELECTOR}|(\d+)))?$")
_MATCHER = re.compile(r'(\w+)(=~|=)"([^"]*)"')


def _select(series: Mapping[Key, float], metric: str, matchers: str) -> dict[frozenset, float]:
    rules = _MATCHER.findall(matchers)
    out = {}
    for (name, labels), value in series.items():
        as_dict = dict(labels)
        if name == metric and all(
            (re.fullmatch(v, as_dict.get(label, "")) if op == "=~" else as_dict.get(label, "") == v)
            for label, op, v in rules
        ):
            out[labels] = value
    return out


def evaluate(expr: str, series: Mapping[Key, float]) -> dict[frozenset, float]:
    """``expr`` (a selector, a selector -/+ on(...) another, or a selector * a number) on ``series``: label set
    (as Prometheus returns it, without job and instance) -> value. Raises on any other form, so a panel
    written otherwise cannot pass unread."""
    match = _FORM.match(expr.strip())
    if match is None:
        raise ValueError(f"the reference cannot read {expr!r}; extend tests/deploy/release_reference.py")
    metric, matchers, op, on, metric_b, matchers_b, number = match.groups()
    left = _select(series, metric, matchers)
    if op is None:
        return left
    if number is not None:
        return {labels: value * float(number) for labels, value in left.items()}
    on_labels = [label.strip() for label in on.split(",")]
    right = {frozenset((k, v) for k, v in labels if k in on_labels): value
             for labels, value in _select(series, metric_b, matchers_b).items()}
    out = {}
    for labels, value in left.items():
        other = right.get(frozenset((k, v) for k, v in labels if k in on_labels))
        if other is not None:
            out[labels] = value - other if op == "-" else value + other
    return out


def prometheus_series(result: list[dict[str, Any]]) -> dict[frozenset, float]:
    """An instant query's result as label set (without job, instance, __name__) -> value."""
    return {frozenset((k, v) for k, v in item["metric"].items() if k not in SCRAPE_LABELS): float(item["value"][1])
            for item in result}


def _show(key: Any) -> str:
    if isinstance(key, tuple):
        return f"{key[0]}{dict(key[1])}"
    return str(dict(key))


def differences(expected: Mapping[Any, float], got: Mapping[Any, float]) -> list[str]:
    """What differs between two sets of series (label sets, or (metric, label set) pairs), in words (empty
    when they agree)."""
    found = [f"missing {_show(labels)} = {value!r}" for labels, value in expected.items() if labels not in got]
    found += [f"unexpected {_show(labels)} = {value!r}" for labels, value in got.items() if labels not in expected]
    found += [f"{_show(labels)}: {got[labels]!r} shown, {value!r} released" for labels, value in expected.items()
              if labels in got and not math.isclose(got[labels], value, rel_tol=1e-12, abs_tol=1e-12)]
    return found
