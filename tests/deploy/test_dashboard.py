"""The Grafana dashboard: generated, provisioned where compose mounts it, and made
only of queries on metrics the worker exposes. (Its queries are run against a
real Prometheus in test_live_monitoring.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .promql import (
    DASHBOARD_JSON,
    REPO,
    label_problems,
    load_dashboard,
    metric_catalogue,
    panels,
    selectors,
)

GRAFANA_DIR = REPO / "deploy" / "grafana"
VARIABLES = {"query", "namespace", "horizon"}
GRAFANA_BUILTINS = {"__rate_interval"}
_LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")


def _datasource_uid() -> str:
    provisioning = yaml.safe_load((GRAFANA_DIR / "provisioning/datasources/prometheus.yml").read_text())
    (datasource,) = provisioning["datasources"]
    return datasource["uid"]


def _targets():
    for panel in panels(load_dashboard()):
        for target in panel["targets"]:
            yield panel, target


def test_committed_json_is_the_generators_output():
    from .promql import dashboard_generator

    generator = dashboard_generator()
    assert DASHBOARD_JSON.read_text() == generator.render(), (
        "deploy/grafana/dashboards/stream-dp.json is stale: run `python deploy/grafana/dashboard.py`"
    )
    assert generator.main(["--check"]) == 0


def test_grafana_provisions_the_dashboard_directory_compose_mounts():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = dict(volume.split(":")[:2] for volume in compose["services"]["grafana"]["volumes"])
    provider = yaml.safe_load((GRAFANA_DIR / "provisioning/dashboards/stream-dp.yml").read_text())
    (entry,) = provider["providers"]
    assert mounts["./deploy/grafana/dashboards"] == entry["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert DASHBOARD_JSON.parent == (REPO / "deploy/grafana/dashboards")


def test_every_panel_and_query_uses_the_provisioned_datasource():
    uid = _datasource_uid()
    for panel in panels(load_dashboard()):
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid, panel["title"]
    for variable in load_dashboard()["templating"]["list"]:
        assert variable["datasource"]["uid"] == uid, variable["name"]


def test_panels_have_unique_ids_titles_and_do_not_overlap():
    dashboard = load_dashboard()
    every = dashboard["panels"] + [p for row in dashboard["panels"] for p in row.get("panels", [])]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids))
    titles = [panel["title"] for panel in panels(dashboard)]
    assert len(titles) == len(set(titles))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_every_panel_explains_itself():
    for panel in panels(load_dashboard()):
        assert len(panel.get("description", "")) > 20, panel["title"]
        for target in panel["targets"]:
            if panel["type"] == "timeseries" and len(panel["targets"]) > 1:
                assert target["legendFormat"], f"{panel['title']!r}: several series need legends"


def test_queries_use_only_metrics_labels_and_variables_that_exist():
    catalogue = metric_catalogue()
    defined = {variable["name"] for variable in load_dashboard()["templating"]["list"]}
    assert defined == VARIABLES
    problems = []
    for panel, target in _targets():
        problems += [f"{panel['title']}: {p}" for p in label_problems(target["expr"], catalogue)]
        used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
        problems += [f"{panel['title']}: unknown variable ${v}" for v in used - defined - GRAFANA_BUILTINS]
        if re.search(r"\b(rate|increase|deriv)\(", target["expr"]):
            # Ranges follow Grafana's interval, sized from the scrape interval.
            assert "[$__rate_interval]" in target["expr"], panel["title"]
    assert problems == []


def test_variables_list_label_values_of_exposed_metrics():
    catalogue = metric_catalogue()
    for variable in load_dashboard()["templating"]["list"]:
        match = _LABEL_VALUES.fullmatch(variable["definition"])
        assert match, variable["definition"]
        metric, label = match.groups()
        assert label in catalogue[metric].labels, variable["definition"]
        assert variable["query"]["query"] == variable["definition"]


def test_every_metric_the_worker_exposes_is_on_the_dashboard():
    catalogue = metric_catalogue()
    shown = {catalogue[s.metric].family for _panel, target in _targets() for s in selectors(target["expr"])}
    families = {series.family for series in catalogue.values()}
    assert families - shown == set()


def test_the_heatmap_reads_the_spend_fraction_histogram_by_bucket():
    (heatmap,) = [panel for panel in panels(load_dashboard()) if panel["type"] == "heatmap"]
    (target,) = heatmap["targets"]
    assert target["format"] == "heatmap"
    assert "stream_dp_budget_spend_fraction_bucket" in target["expr"]
    assert re.match(r"sum by \(le\)", target["expr"])
    assert heatmap["options"]["calculate"] is False  # the buckets are Prometheus'


def test_the_operations_and_releases_dashboards_are_the_ones_provisioned():
    files = sorted(Path(DASHBOARD_JSON.parent).glob("*.json"))
    assert [f.name for f in files] == ["stream-dp-releases.json", "stream-dp.json"]  # tests/deploy/test_releases_dashboard.py
    assert load_dashboard()["uid"] == "stream-dp"
