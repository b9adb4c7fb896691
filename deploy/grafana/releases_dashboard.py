"""Generates the Grafana dashboard ``dashboards/stream-dp-releases.json``: the released values themselves.

    python deploy/grafana/releases_dashboard.py            # rewrite dashboards/stream-dp-releases.json
    python deploy/grafana/releases_dashboard.py --check    # exit 1 if the committed JSON is stale

Every expression reads the series ``stream-dp export`` serves (``stream_dp/export/samples.py`` ``FAMILIES``):
each query's latest release, per group. Released values are DP outputs, so they may be shown to anyone.
A row per selected query (Grafana repeats it), with noisy values and their 95% bands, the top-k table,
quantiles, running totals, mean vectors, sample-and-aggregate statistics, covariances and local-DP
reports. Panels are built as in ``dashboard.py``
(the operations dashboard), whose pieces this reuses. Standard library only.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "dashboards" / "stream-dp-releases.json"


def _operations_generator():  # type: ignore[no-untyped-def]
    """dashboard.py beside this file (a script, not a package): its Panel, Target and rendering."""
    spec = importlib.util.spec_from_file_location("stream_dp_operations_dashboard", HERE / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


ops = _operations_generator()
Panel, Target = ops.Panel, ops.Target
SELECT = 'query=~"$query", group=~"$group"'


def _band(metric: str, statistic: str | None, legend: str) -> tuple[Any, ...]:
    """The value and the ends of its 95% interval: value -/+ the half-width of the same series."""
    where = SELECT + (f', statistic="{statistic}"' if statistic else "")
    value = f"{metric}{{{where}}}"
    half = f"{metric}_ci95{{{where}}}"
    return (Target(value, legend),
            Target(f"{value} - on(query, group, statistic) {half}", f"{legend} 95% lower"),
            Target(f"{value} + on(query, group, statistic) {half}", f"{legend} 95% upper"))


def released_values() -> list[Any]:
    def band_panel(title: str, statistic: str, description: str) -> Any:
        return Panel(title, description, _band("stream_dp_release_value", statistic, "{{group}}"), width=8)

    return [
        band_panel("Noisy counts", "count", "Each group's noisy count in the query's latest window, with its 95% "
                   "interval (dashed). A count's half-width is the same every window: its noise does not depend "
                   "on the data. Local-DP queries: the debiased frequency estimate."),
        band_panel("Noisy sums", "sum", "Each group's noisy sum of clipped values, with its 95% interval."),
        band_panel("Noisy means", "mean", "Each group's noisy mean (noisy sum over noisy count, clamped into the "
                   "clip range), with its 95% interval; wide when the noisy count is small."),
        Panel("Top-k groups", "The latest window's top-k list: each ranked group and its rank (1 = most bounded "
              "events), chosen by permute-and-flip among the released groups.",
              (Target('stream_dp_release_top_k_rank{query=~"$query"}', "{{group}}"),), kind="table", width=6,
              extra={"instant": True}),
        Panel("Quantiles", "Each group's quantiles (q) of its clipped values, with the 95% interval holding the "
              "true quantile where the query has value_interval: true (dashed).",
              (Target(f"stream_dp_release_quantile{{{SELECT}}}", "{{group}} q{{q}}"),
               Target(f"stream_dp_release_quantile_lower{{{SELECT}}}", "{{group}} q{{q}} 95% lower"),
               Target(f"stream_dp_release_quantile_upper{{{SELECT}}}", "{{group}} q{{q}} 95% upper")),
              width=9),
        Panel("Running totals", "Continual queries: each group's noisy count and sum from the start of the "
              "period through the latest window, with 95% intervals (dashed); they restart each period.",
              _band("stream_dp_release_running_total", None, "{{group}} {{statistic}}"), width=9),
        Panel("Mean vectors", "Mean-vector and covariance queries: the mean of each field, with the 95% "
              "interval of a mean vector's (dashed).",
              (Target(f"stream_dp_release_vector_mean{{{SELECT}}}", "{{group}} {{field}}"),
               Target(f"stream_dp_release_vector_mean{{{SELECT}}} - on(query, group, field) "
                      f"stream_dp_release_vector_mean_ci95{{{SELECT}}}", "{{group}} {{field}} 95% lower"),
               Target(f"stream_dp_release_vector_mean{{{SELECT}}} + on(query, group, field) "
                      f"stream_dp_release_vector_mean_ci95{{{SELECT}}}", "{{group}} {{field}} 95% upper")),
              width=8),
        Panel("Sample-and-aggregate", "Sample-and-aggregate queries: the noisy statistic of the query's "
              "function over the blocks, with the 95% interval of a mean's noise (dashed).",
              (Target(f"stream_dp_release_sample_aggregate{{{SELECT}}}", "{{group}}"),
               Target(f"stream_dp_release_sample_aggregate{{{SELECT}}} - on(query, group) "
                      f"stream_dp_release_sample_aggregate_ci95{{{SELECT}}}", "{{group}} 95% lower"),
               Target(f"stream_dp_release_sample_aggregate{{{SELECT}}} + on(query, group) "
                      f"stream_dp_release_sample_aggregate_ci95{{{SELECT}}}", "{{group}} 95% upper")),
              width=12),
        Panel("Covariance", "Covariance queries: each entry (field, other) of the matrix, positive "
              "semi-definite by construction.",
              (Target(f"stream_dp_release_covariance{{{SELECT}}}", "{{group}} {{field}} x {{other}}"),),
              width=12),
        Panel("Local-DP reports", "Local-DP queries: randomized reports in the latest window (each unit sends "
              "at most one per window).",
              (Target(f"stream_dp_release_local_dp_reports{{{SELECT}}}", "{{group}}"),), width=8),
        Panel("Latest window", "Per query: the end of the latest window released, the epsilon it spent per "
              "unit, and 1 when it was released as if empty (noise only; the record says why).",
              (Target('stream_dp_release_window_end_seconds{query=~"$query"} * 1000', "{{query}} window end (ms)"),
               Target('stream_dp_release_epsilon{query=~"$query"}', "{{query}} epsilon"),
               Target('stream_dp_release_as_if_empty{query=~"$query"}', "{{query}} as if empty")),
              kind="table", width=8, extra={"instant": True}),
    ]


def _render(panel: Any, panel_id: int, x: int, y: int) -> dict[str, Any]:
    if panel.kind != "table":
        rendered = ops.render_panel(panel, panel_id, x, y)
        # the interval ends: dashed, unfilled
        rendered["fieldConfig"]["overrides"] = [{
            "matcher": {"id": "byRegexp", "options": ".* 95% (lower|upper)$"},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [6, 4]}},
                           {"id": "custom.fillOpacity", "value": 0}],
        }]
        return rendered
    targets = [{"refId": ref, "datasource": ops.DATASOURCE, "expr": target.expr, "legendFormat": target.legend,
                "format": "table", "instant": True, "range": False}
               for ref, target in zip("ABCDEFGH", panel.targets, strict=False)]
    return {
        "id": panel_id, "type": "table", "title": panel.title, "description": panel.description,
        "datasource": ops.DATASOURCE, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": False}]},
        "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}],
        "targets": targets,
    }


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model: one row repeated per selected query."""
    panels: list[dict[str, Any]] = [{
        "id": 1, "type": "row", "title": "$query", "collapsed": False, "panels": [], "repeat": "query",
        "gridPos": {"h": 1, "w": ops.GRID_WIDTH, "x": 0, "y": 0},
    }]
    x, y, row_height = 0, 1, 0
    for number, panel in enumerate(released_values(), start=2):
        if x + panel.width > ops.GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_render(panel, number, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return {
        "uid": "stream-dp-releases",
        "title": "stream-dp releases",
        "description": "The noisy releases of each query (stream-dp export): values with 95% intervals, top-k, "
                       "quantiles, running totals. Every number is a DP output.",
        "tags": ["stream-dp", "differential-privacy"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [{"title": "stream-dp (operations)", "type": "link", "url": "/d/stream-dp"}],
        "templating": {"list": [
            ops.variable("query", "Query", "label_values(stream_dp_release_window_end_seconds, query)", multi=True),
            ops.variable("group", "Group", 'label_values(stream_dp_release_value{query=~"$query"}, group)',
                         multi=True),
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    return ops.write_or_check(render, OUTPUT, Path(__file__).name, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
