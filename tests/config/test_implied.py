"""A query that leaves out the count its quantiles or top_k need, or repeats no epsilon beside local_dp,
is built exactly as the same query written out in full: same query, plan, charge and settings fingerprint."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from stream_dp.budget import StoreOptions
from stream_dp.budget.store import DEFAULT_INPUT_RETENTION_MS
from stream_dp.cli.plan import plan_config
from stream_dp.config import ConfigError, parse_config
from stream_dp.config.implied import implied_settings
from stream_dp.worker.assemble.runtimes import build_worker_parts
from stream_dp.worker.query.runtime import charged_settings, settings_fingerprint

CORPUS = Path(__file__).resolve().parent / "corpus"


def _load(name: str) -> dict:
    return yaml.safe_load((CORPUS / name).read_text())


def _with_count(data: dict) -> dict:
    data = copy.deepcopy(data)
    data["queries"][0]["aggregations"]["count"] = {}
    return data


def _with_epsilon(data: dict) -> dict:
    data = copy.deepcopy(data)
    data["queries"][0]["epsilon"] = data["queries"][0]["local_dp"]["epsilon"]
    return data


def written_out(data: dict) -> dict:
    """A corpus query with what the loader would add written into it (the other tests' reference form)."""
    return _with_epsilon(data) if "local_dp" in data["queries"][0] else _with_count(data)


CASES = [
    ("ok_quantiles_without_a_count.yaml", _with_count,
     "count added beside quantiles: each group's noisy count sizes its 95% q_interval; it takes its equal share "
     "of epsilon"),
    ("ok_top_k_over_selected_groups_without_a_count.yaml", _with_count,
     "count added beside top_k over selected groups: partition selection of the noisy counts picks the groups "
     "top_k ranks; it takes its equal share of epsilon"),
    ("ok_local_dp_without_the_querys_epsilon.yaml", _with_epsilon,
     "epsilon 2 taken from local_dp.epsilon: what a window costs a unit is its one report"),
]


def _fingerprints(config) -> list[tuple[str, dict]]:
    parts = build_worker_parts(config, source="queries.yaml", secret=b"0123456789abcdef" * 2,
                               store_options=StoreOptions.for_input_retention(DEFAULT_INPUT_RETENTION_MS),
                               clock_ms=lambda: 0)
    try:
        return [(settings_fingerprint(r), charged_settings(r)) for r in parts.runtimes]
    finally:
        parts.close()


@pytest.mark.parametrize(("name", "write_out", "line"), CASES, ids=[c[0] for c in CASES])
def test_a_query_leaving_a_setting_out_is_built_as_the_query_written_out(name, write_out, line):
    written = _load(name)
    explicit_data = write_out(written)
    assert explicit_data != written  # the file as it stands leaves the setting out
    implicit, explicit = parse_config(written, name), parse_config(explicit_data, name)
    assert implicit.queries == explicit.queries
    assert implicit.queries[0].model_dump() == explicit.queries[0].model_dump()
    # what was set, as well as what it holds: a dump that leaves out unset fields sees no difference
    assert implicit.queries[0].model_dump(exclude_unset=True) == explicit.queries[0].model_dump(exclude_unset=True)
    assert plan_config(implicit) == plan_config(explicit)
    assert _fingerprints(implicit) == _fingerprints(explicit)
    # ... and the one difference is said: the lines check-config prints under the query
    assert implicit.implied(implicit.queries[0].name) == [line]
    assert explicit.implied(explicit.queries[0].name) == []


def test_the_added_count_is_a_component_with_its_equal_share():
    config = parse_config(_load("ok_quantiles_without_a_count.yaml"))
    query = config.queries[0]
    assert query.aggregations.names() == {"count", "quantiles"}
    [plan] = plan_config(config)
    # two components of epsilon 0.1: the count's share is 0.05, noise scale L0 * Linf / 0.05 = 3 * 2 / 0.05
    assert plan["count_scale"] == pytest.approx(120)


@pytest.mark.parametrize("aggregations", [
    {"count": {}, "quantiles": {"field": "v", "q": [0.5], "bounds": [0, 1]}},
    {"sum": {"field": "v", "clip": [0, 1]}, "mean": {"field": "v"},
     "quantiles": {"field": "v", "q": [0.5], "bounds": [0, 1]}},
    {"sum": {"field": "v", "clip": [0, 1]}, "top_k": {"k": 2}},
    {"sum": {"field": "v", "clip": [0, 1]}},
])
def test_nothing_is_added_to_a_selected_groups_query_that_has_what_it_needs(aggregations):
    query = {"groups": {"select": {"delta": 1e-7}}, "aggregations": aggregations, "epsilon": 1.0}
    assert implied_settings(query) == (query, [])


def test_top_k_over_public_groups_needs_no_count():
    query = {"groups": {"public": ["a", "b", "c"]}, "aggregations": {"top_k": {"k": 2}}, "epsilon": 1.0}
    assert implied_settings(query) == (query, [])


def test_a_written_epsilon_is_kept_and_one_unlike_local_dp_still_refused():
    data = _load("ok_local_dp_without_the_querys_epsilon.yaml")
    data["queries"][0]["epsilon"] = 1.0
    with pytest.raises(ConfigError, match=r"queries\[0\] \(browsers_local\): set the query's epsilon: 2\.0 to match "
                                          r"local_dp\.epsilon .*, not 1\.0; or leave it out"):
        parse_config(data, "queries.yaml")


def test_an_invalid_local_dp_epsilon_is_reported_where_written_not_copied():
    data = _load("ok_local_dp_without_the_querys_epsilon.yaml")
    data["queries"][0]["local_dp"]["epsilon"] = 15.0
    with pytest.raises(ConfigError) as info:
        parse_config(data, "queries.yaml")
    lines = str(info.value).splitlines()
    assert any(".local_dp.epsilon: " in line and "got 15.0" in line for line in lines), lines
    assert "queries.yaml: queries[0] (browsers_local).epsilon: left out, it is local_dp.epsilon, but local_dp is " \
           "not valid (see its line): fix local_dp" in lines
    assert len(lines) == 2, lines


def test_geometric_is_shown_as_written_and_charged_as_laplace():
    data = _load("ok_quantiles_without_a_count.yaml")
    geometric = copy.deepcopy(data)
    geometric["queries"][0]["mechanism"] = "geometric"
    as_geometric, as_laplace = parse_config(geometric), parse_config(data)
    assert as_geometric.queries[0].mechanism == "laplace"
    assert as_geometric.queries[0].mechanism_written == "geometric"
    assert as_laplace.queries[0].mechanism_written == "laplace"
    # the same noise and charge: a file switching between the two words keeps its continual periods and partials
    assert _fingerprints(as_geometric) == _fingerprints(as_laplace)
    [plan] = plan_config(as_geometric)
    assert plan["mechanism"] == "laplace"  # as its records state it
    assert plan["mechanism_label"].startswith("geometric (the discrete Laplace, released as laplace) epsilon=0.1")
