"""Generates the Grafana dashboard ``dashboards/stream-dp.json`` (dashboards as code).

    python deploy/grafana/dashboard.py            # rewrite dashboards/stream-dp.json
    python deploy/grafana/dashboard.py --check    # exit 1 if the committed JSON is stale

The JSON is committed: Grafana's file provider reads it from
``/var/lib/grafana/dashboards`` (see docker-compose.yml). Every expression uses
the metrics of ``stream_dp/metrics`` (WorkerMetrics, BudgetMetrics) and
Prometheus' ``up``; none carries a unit id. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "stream-dp.json"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # provisioning/datasources/prometheus.yml
JOB = 'job="stream-dp"'  # the scrape job of deploy/prometheus/prometheus*.yml
Q = 'query=~"$query"'
NS = 'namespace=~"$namespace"'
RATE = "[$__rate_interval]"
GRID_WIDTH = 24


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    heatmap: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | heatmap
    width: int = 12
    height: int = 8
    no_value: str | None = None  # what to show instead of "No data" (counters that only faults create)
    extra: dict[str, Any] = field(default_factory=dict)


def quantiles(metric: str, by: str, matcher: str, legend: str) -> tuple[Target, ...]:
    """p50, p90 and p99 of a Prometheus histogram, per ``by`` label."""
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{matcher}}}{RATE})))",
            f"{legend} p{round(q * 100)}",
        )
        for q in (0.5, 0.9, 0.99)
    )


def overview() -> list[Panel]:
    def stat(title: str, description: str, expr: str, unit: str = "short", red_at: float | None = None) -> Panel:
        steps = [{"color": "green", "value": None}]
        if red_at is not None:
            steps.append({"color": "red", "value": red_at})
        return Panel(title, description, (Target(expr),), unit=unit, kind="stat", width=4, height=4,
                     extra={"thresholds": {"mode": "absolute", "steps": steps}})

    return [
        stat("Workers up", "Workers answering Prometheus' scrape.", f"sum(up{{{JOB}}})"),
        stat("Events accepted", "Valid, on-time events per second, all selected queries.",
             f'sum(rate(stream_dp_events_total{{outcome="accepted", {Q}}}{RATE}))', "ops"),
        stat("Windows released", "Windows released per minute, all selected queries.",
             f"sum(rate(stream_dp_windows_released_total{{{Q}}}{RATE})) * 60"),
        stat("Units at the limit", "Units that reached a budget limit within its horizon (alert threshold 1.0).",
             f'sum(stream_dp_budget_units_at_threshold{{threshold="1.0", {NS}}})', red_at=1),
        stat("Windows waiting for Redis", "Closed windows held because the budget store could not be charged.",
             f"sum(stream_dp_pending_charges{{{Q}}})", red_at=1),
        stat("Consumer lag", "Records not yet consumed, all input partitions.", "sum(stream_dp_consumer_lag)"),
    ]


def ingest() -> list[Panel]:
    return [
        Panel("Events by outcome", "Input events per second: accepted, rejected (invalid), late (window closed), "
              "replayed (skipped after a restart).",
              (Target(f"sum by (query, outcome) (rate(stream_dp_events_total{{{Q}}}{RATE}))",
                      "{{query}} {{outcome}}"),),
              unit="ops"),
        Panel("Rejected events by reason", "Invalid events per second by reason code; the dead-letter topic has "
              "each one with `reason` and `detail` headers.",
              (Target(f"sum by (query, reason) (rate(stream_dp_events_rejected_total{{{Q}}}{RATE}))",
                      "{{query}} {{reason}}"),), unit="ops"),
        Panel("Late events", "Events whose window had closed (older than the watermark minus allowed lateness).",
              (Target(f'sum by (query) (rate(stream_dp_events_total{{outcome="late", {Q}}}{RATE}))', "{{query}}"),),
              unit="ops", width=8),
        Panel("Late and rejected share", "Shares of events late and rejected; the alerts fire above 5% late "
              "(StreamDpLateEventsHigh) and 1% rejected (StreamDpRejectedEventsHigh).",
              tuple(
                  Target(f'sum by (query) (rate(stream_dp_events_total{{outcome="{outcome}", {Q}}}{RATE})) / '
                         f'sum by (query) (rate(stream_dp_events_total{{outcome!="replayed", {Q}}}{RATE}))',
                         f"{{{{query}}}} {outcome}")
                  for outcome in ("late", "rejected")
              ), unit="percentunit", width=8),
        Panel("Dead letters", "Records written to the dead-letter topic per second (rejected and late events).",
              (Target(f"sum by (query) (rate(stream_dp_dead_letters_total{{{Q}}}{RATE}))", "{{query}}"),),
              unit="ops", width=8),
    ]


def windows() -> list[Panel]:
    return [
        Panel("Windows open", "Windows receiving events, summed over workers.",
              (Target(f"sum by (query) (stream_dp_windows_open{{{Q}}})", "{{query}}"),), width=8),
        Panel("Contribution rows held", "Bounded (unit, group) rows of open windows held in memory.",
              (Target(f"sum by (query) (stream_dp_open_rows{{{Q}}})", "{{query}}"),), width=8),
        Panel("Closed-through lag", "Wall clock minus the event time through which every window is closed: how "
              "far window closing trails real time (window size + allowed lateness when healthy).",
              (Target(f"time() - min by (query) (stream_dp_closed_through_seconds{{{Q}}})", "{{query}}"),),
              unit="s", width=8),
        Panel("Windows closed and released per minute", "Per-partition partials closed by ingest, windows "
              "released once, and per-group records published.",
              (Target(f"sum by (query) (rate(stream_dp_windows_closed_total{{{Q}}}{RATE})) * 60",
                      "{{query}} partials closed"),
               Target(f"sum by (query) (rate(stream_dp_windows_released_total{{{Q}}}{RATE})) * 60",
                      "{{query}} windows released"),
               Target(f"sum by (query) (rate(stream_dp_groups_released_total{{{Q}}}{RATE})) * 60",
                      "{{query}} group records")),
              ),
        Panel("Windows waiting for a partition", "Windows past their release timeout that wait for an input "
              "partition whose records may still hold their events (its worker is behind, down or held by the "
              "budget store): never released without it (StreamDpReleaseWaitingForPartition). Wait: how long the "
              "oldest has waited since its first partial. The releasing worker's log names the partitions.",
              (Target(f"max by (query) (stream_dp_release_waiting_windows{{{Q}}})", "{{query}} windows"),
               Target(f"max by (query) (stream_dp_release_wait_seconds{{{Q}}})", "{{query}} oldest wait (s)")),
              no_value="0"),
        Panel("Release latency", "From a window closing (watermark past its end) to its last record published.",
              quantiles("stream_dp_release_latency_seconds", "query", Q, "{{query}}"), unit="s"),
        Panel("Noise time per release", "Time drawing OpenDP noise for one window (mean and p99).",
              (Target(f"sum by (query) (rate(stream_dp_noise_seconds_sum{{{Q}}}{RATE})) / "
                      f"sum by (query) (rate(stream_dp_noise_seconds_count{{{Q}}}{RATE}))", "{{query}} mean"),
               quantiles("stream_dp_noise_seconds", "query", Q, "{{query}}")[-1]),
              unit="s"),
        Panel("Release time by stage", "Mean seconds per window in each stage between its close and its last "
              "record: charge and partial_send (ingest), decode, combine, noise, encode, ledger, render and "
              "publish (release). A stage that grows with the window's groups shows where a big window spends.",
              (Target(f"sum by (operation) (rate(stream_dp_release_stage_seconds_sum{{{Q}}}{RATE})) / "
                      f"sum by (operation) (rate(stream_dp_release_stage_seconds_count{{{Q}}}{RATE}))",
                      "{{operation}}"),),
              unit="s"),
        Panel("Replays and late data", "Zero when healthy. Republished: a stored release published again after "
              "a retry or replay (same values, no new noise). Late partials: dropped after their window was "
              "released. Expired partials and windows: older than the release ledger keeps entries, so never "
              "released (again). Missing partitions: left out of a release, the broker having shown they held nothing more "
              "for the window. Charge replays: "
              "a charge id already charged (after a restart). Withheld: windows released noise-only because "
              "their partitions were checked against different partition counts. Partition count changes: "
              "an input topic gained partitions.",
              (Target(f"sum by (query) (increase(stream_dp_windows_republished_total{{{Q}}}{RATE}))",
                      "{{query}} republished"),
               Target(f"sum by (query) (increase(stream_dp_late_partials_total{{{Q}}}{RATE}))",
                      "{{query}} late partials"),
               Target(f"sum by (query) (increase(stream_dp_partials_expired_total{{{Q}}}{RATE}))",
                      "{{query}} expired partials"),
               Target(f"sum by (query) (increase(stream_dp_windows_expired_total{{{Q}}}{RATE}))",
                      "{{query}} expired windows"),
               Target(f"sum by (query) (increase(stream_dp_release_partitions_missing_total{{{Q}}}{RATE}))",
                      "{{query}} missing partitions"),
               Target(f"sum by (namespace) (increase(stream_dp_budget_charge_replays_total{{{NS}}}{RATE}))",
                      "{{namespace}} charge replays"),
               Target(f"sum by (query, reason) (increase(stream_dp_windows_withheld_total{{{Q}}}{RATE}))",
                      "{{query}} withheld ({{reason}})"),
               Target(f"sum by (topic) (increase(stream_dp_partition_count_changes_total{RATE}))",
                      "{{topic}} partition count changes")),
              no_value="0"),
        Panel("Unreleasable partials", "Partials of public-group windows that are never released, data or not: "
              "before their query's publication start (before_start: a backlog older than the query's first run; "
              "window.publish_from publishes one) or behind their home's released mark with no release stored "
              "(behind_mark). Their units stay charged. Zero when no backlog predates the query.",
              (Target(f"sum by (query, reason) (increase(stream_dp_partials_unreleasable_total{{{Q}}}{RATE}))",
                      "{{query}} {{reason}}"),),
              no_value="0"),
        Panel("Sample-and-aggregate failed blocks", "Blocks whose user function raised, returned no finite "
              "number, ran past its timeout, ended its process or could not be loaded; each counts as its output "
              "range's midpoint and the window is still released. Zero when the functions are healthy.",
              (Target(f"sum by (query, reason) (increase(stream_dp_sample_aggregate_failed_blocks_total{{{Q}}}{RATE}))",
                      "{{query}} {{reason}}"),),
              no_value="0"),
    ]


def budget() -> list[Panel]:
    return [
        Panel("Epsilon released per hour", "Per-unit privacy loss released per hour by each query: what a unit "
              "active in every window would spend. Compare with the namespace's limits.",
              (Target(f"sum by (namespace, query) (rate(stream_dp_epsilon_released_total{{{Q}, {NS}}}{RATE})) * 3600",
                      "{{namespace}} {{query}}"),)),
        Panel("Per-unit spend fraction", "Heatmap of units charged by their spend as a fraction of the horizon's "
              "limit, at charge time (select one horizon).", kind="heatmap",
              targets=(Target(f"sum by (le) (increase(stream_dp_budget_spend_fraction_bucket"
                              f'{{{NS}, horizon=~"$horizon"}}{RATE}))', "{{le}}", heatmap=True),)),
        Panel("Units at or above each alert threshold", "Units that reached a threshold of a horizon's limit "
              "within the last horizon, summed over workers (StreamDpUnitsNearBudgetLimit, "
              "StreamDpUnitsBudgetExhausted).",
              (Target(f"sum by (namespace, horizon, threshold) (stream_dp_budget_units_at_threshold{{{NS}}})",
                      "{{namespace}} {{horizon}} >= {{threshold}}"),)),
        Panel("Units charged and excluded", "Units charged for a window, and units excluded from one because its "
              "charge would break a limit, per second.",
              (Target(f"sum by (namespace) (rate(stream_dp_budget_units_charged_total{{{NS}}}{RATE}))",
                      "{{namespace}} charged"),
               Target(f"sum by (namespace) (rate(stream_dp_budget_units_excluded_total{{{NS}}}{RATE}))",
                      "{{namespace}} excluded")),
              unit="ops"),
        Panel("Excluded share by query", "Share of the units in a query's closed windows excluded for lack of "
              "budget (the namespace-wide share alerts above 10%: StreamDpBudgetExclusionsHigh), and of continual "
              "queries' units left out because their windows of the period were used up.",
              (Target(f'sum by (query) (rate(stream_dp_window_units_total{{outcome="excluded", {Q}}}{RATE})) / '
                      f"sum by (query) (rate(stream_dp_window_units_total{{{Q}}}{RATE}))", "{{query}}"),
               Target(f'sum by (query) (rate(stream_dp_window_units_total{{outcome="over_period_cap", {Q}}}{RATE})) / '
                      f"sum by (query) (rate(stream_dp_window_units_total{{{Q}}}{RATE}))", "{{query}} over period cap")),
              unit="percentunit", width=8),
        Panel("Refusals by horizon", "Charges refused per second by each horizon's limit (a unit refused by two "
              "horizons counts in both).",
              (Target(f"sum by (namespace, horizon) (rate(stream_dp_budget_refusals_total{{{NS}}}{RATE}))",
                      "{{namespace}} {{horizon}}"),), unit="ops", width=8),
        Panel("Budget alerts published", "Threshold records written to the alerts topic per second (they carry "
              "the unit ids; the metrics do not).",
              (Target(f"sum by (namespace) (rate(stream_dp_budget_alerts_published_total{{{NS}}}{RATE}))",
                      "{{namespace}}"),), unit="ops", width=8),
    ]


def dependencies() -> list[Panel]:
    return [
        Panel("Budget store errors", "Errors talking to Redis by operation and kind (connection, timeout, "
              "script, ...), per second, retried ones included.",
              (Target(f"sum by (namespace, operation, kind) (rate(stream_dp_budget_store_errors_total{{{NS}}}{RATE}))",
                      "{{namespace}} {{operation}} {{kind}}"),), unit="ops", width=8),
        Panel("Failed window charges", "Window charges that failed, per second: unavailable (held and retried), "
              "conflict (replayed window), rejected (dropped).",
              (Target(f"sum by (query, kind) (rate(stream_dp_budget_failures_total{{{Q}}}{RATE}))",
                      "{{query}} {{kind}}"),), unit="ops", width=8),
        Panel("Windows waiting for the budget store", "Closed windows held until Redis can charge them; nothing "
              "is released for them meanwhile (StreamDpBudgetStoreUnavailable).",
              (Target(f"sum by (query) (stream_dp_pending_charges{{{Q}}})", "{{query}}"),), width=8),
        Panel("Budget charge latency", "Time to check and charge one window's units in Redis, retries included.",
              quantiles("stream_dp_budget_charge_seconds", "namespace", NS, "{{namespace}}"), unit="s", width=8),
        Panel("Internal errors", "Unexpected internal records or failures per second, by worker and kind "
              "(ledger_unavailable is the release ledger in Redis); and checks that found Redis unanswering or "
              "not the store the group charged on (StreamDpStoreUnverified).",
              (Target("sum by (instance, kind) (rate(stream_dp_internal_errors_total[$__rate_interval]))",
                      "{{instance}} {{kind}}"),
               Target('sum by (instance, outcome) (rate(stream_dp_store_checks_total{outcome!="verified"}'
                      "[$__rate_interval]))", "{{instance}} store {{outcome}}")), unit="ops", width=8),
        Panel("Scrape health", "1 when Prometheus scraped the worker, 0 when it could not (StreamDpWorkerDown).",
              (Target(f"min by (instance) (up{{{JOB}}})", "{{instance}}"),), width=8),
        Panel("Consumer lag by partition", "Records between each input partition's end and the consumer "
              "position, as last seen by the worker that owns it (StreamDpConsumerLagGrowing).",
              (Target("sum by (topic, partition) (stream_dp_consumer_lag)", "{{topic}}[{{partition}}]"),),
              width=24),
    ]


ROWS: tuple[tuple[str, Any], ...] = (
    ("Overview", overview),
    ("Ingest", ingest),
    ("Windows and releases", windows),
    ("Privacy budget", budget),
    ("Redis and Kafka", dependencies),
)


def variable(name: str, label: str, definition: str, *, multi: bool) -> dict[str, Any]:
    current = {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {}
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": definition,
        "query": {"query": definition, "refId": f"{name}-variable"},
        "refresh": 2,  # on time range change: new queries and namespaces appear
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*" if multi else None,
        "current": current,
        "sort": 1,
        "hide": 0,
    }


def render_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.no_value is not None:
        defaults["noValue"] = panel.no_value
    if "thresholds" in panel.extra:
        defaults["thresholds"] = panel.extra["thresholds"]
    if panel.kind == "timeseries":
        defaults["custom"] = {"fillOpacity": 10, "showPoints": "never", "spanNulls": False}
        options: dict[str, Any] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "textMode": "auto"}
    else:
        options = {
            "calculate": False,
            "yAxis": {"axisPlacement": "left", "unit": "percentunit"},
            "rowsFrame": {"layout": "le"},
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64},
            "cellGap": 1,
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
        }
    targets = []
    if len(panel.targets) > 8:
        raise ValueError(f"panel {panel.title!r} has {len(panel.targets)} targets; split it (at most 8 per panel)")
    for ref, target in zip("ABCDEFGH", panel.targets, strict=False):
        rendered: dict[str, Any] = {"refId": ref, "datasource": DATASOURCE, "expr": target.expr,
                                    "legendFormat": target.legend, "range": True}
        if target.heatmap:
            rendered["format"] = "heatmap"
        targets.append(rendered)
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model: rows of panels laid out left to right."""
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for title, make in ROWS:
        panels.append({"id": next_id, "type": "row", "title": title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}})
        next_id += 1
        y += 1
        x = 0
        row_height = 0
        for panel in make():
            if x + panel.width > GRID_WIDTH:
                x, y, row_height = 0, y + row_height, 0
            panels.append(render_panel(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            row_height = max(row_height, panel.height)
        y += row_height
    return {
        "uid": "stream-dp",
        "title": "stream-dp",
        "description": "Streaming DP aggregation: ingest, windows, releases, per-unit budgets, Redis and Kafka.",
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
        "links": [],
        "templating": {"list": [
            variable("query", "Query", "label_values(stream_dp_events_total, query)", multi=True),
            variable("namespace", "Namespace", "label_values(stream_dp_budget_units_charged_total, namespace)",
                     multi=True),
            variable("horizon", "Horizon (heatmap)", "label_values(stream_dp_budget_spend_fraction_bucket, horizon)",
                     multi=False),
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def write_or_check(render_json: Callable[[], str], output: Path, script: str, description: str,
                   argv: list[str] | None = None) -> int:
    """The command line of a dashboard generator: rewrite ``output``, or with ``--check`` exit 1 if it is stale."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="only compare with the committed JSON")
    args = parser.parse_args(argv)
    text = render_json()
    if args.check:
        if not output.is_file() or output.read_text() != text:
            print(f"{output} is stale: run python {script} and commit the result", file=sys.stderr)
            return 1
        return 0
    output.write_text(text)
    print(f"wrote {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return write_or_check(render, OUTPUT, Path(__file__).name, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
