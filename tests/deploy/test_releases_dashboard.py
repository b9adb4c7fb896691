"""The "stream-dp releases" dashboard: generated like the operations one, committed beside it, and made only
of the series ``stream-dp export`` serves. (Its queries run against a real Prometheus in
test_live_releases.py.)"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from types import ModuleType

import pytest

from stream_dp.export.samples import FAMILIES

from .promql import REPO, panels

GENERATOR = REPO / "deploy" / "grafana" / "releases_dashboard.py"
COMMITTED = REPO / "deploy" / "grafana" / "dashboards" / "stream-dp-releases.json"
_SELECTOR = re.compile(r"\b(stream_dp_\w+)\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(?:=~|=|!=|!~)\s*"')


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stream_dp_releases_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _dashboard() -> dict:
    return json.loads(COMMITTED.read_text())


def test_the_committed_json_is_the_generators_output():
    generator = _generator()
    assert COMMITTED.read_text() == generator.render(), (
        "deploy/grafana/dashboards/stream-dp-releases.json is stale: run `python deploy/grafana/releases_dashboard.py`")
    assert generator.main(["--check"]) == 0


def test_the_staleness_check_fails_on_a_json_that_differs_from_the_generator(tmp_path, monkeypatch, capsys):
    generator = _generator()
    doctored = json.loads(COMMITTED.read_text())
    doctored["panels"][1]["targets"][0]["expr"] = "stream_dp_release_value"
    stale = tmp_path / "stream-dp-releases.json"
    stale.write_text(json.dumps(doctored, indent=2) + "\n")
    monkeypatch.setattr(generator, "OUTPUT", stale)
    assert generator.main(["--check"]) == 1
    assert "is stale" in capsys.readouterr().err


def test_every_query_reads_series_the_exporter_serves_with_their_labels():
    problems = []
    for panel in panels(_dashboard()):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            found = _SELECTOR.findall(target["expr"])
            if not found:
                problems.append(f"{panel['title']}: no exporter series in {target['expr']!r}")
            for metric, matchers in found:
                if metric not in FAMILIES:
                    problems.append(f"{panel['title']}: {metric} is not served by stream-dp export")
                    continue
                labels = {"query", *FAMILIES[metric][1]}
                problems += [f"{panel['title']}: {metric} has no label {label!r}"
                             for label in _MATCHER.findall(matchers) if label not in labels]
            for grouping in re.findall(r"on\(([^)]*)\)", target["expr"]):
                for label in (name.strip() for name in grouping.split(",")):
                    if not all(label in {"query", *FAMILIES[m][1]} for m, _ in found if m in FAMILIES):
                        problems.append(f"{panel['title']}: matching on {label!r}, which a side lacks")
    assert problems == []


@pytest.mark.parametrize("shown", ["stream_dp_release_value", "stream_dp_release_value_ci95",
                                   "stream_dp_release_top_k_rank", "stream_dp_release_quantile",
                                   "stream_dp_release_running_total", "stream_dp_release_running_total_ci95"])
def test_the_dashboard_shows_values_bands_top_k_quantiles_and_running_totals(shown):
    exprs = [target["expr"] for panel in panels(_dashboard()) for target in panel["targets"]]
    assert any(re.search(rf"\b{shown}\{{", expr) for expr in exprs)


def test_a_row_per_query_with_variables_for_query_and_group():
    dashboard = _dashboard()
    (row,) = [panel for panel in dashboard["panels"] if panel["type"] == "row"]
    assert row["repeat"] == "query"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"query", "group"}
    for variable in variables.values():
        metric = variable["definition"].removeprefix("label_values(").split("{")[0].split(",")[0]
        assert metric in FAMILIES, variable["definition"]
    for panel in panels(dashboard):
        assert len(panel["description"]) > 20, panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= set(variables), (panel["title"], used)


def test_panels_do_not_overlap_and_have_unique_ids():
    dashboard = _dashboard()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
