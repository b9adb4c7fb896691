"""How the loader explains a value written in the wrong form: the form it takes, with an example of it, in the
file's words (keys as written, no names of the classes that read them), one line per mistake.

The expected lines are written out here from the example file (deploy/queries.example.yaml), not built from the
models' examples, so a message that loses its example or its form fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stream_dp.config import ConfigError, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


@pytest.fixture
def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _query(example: dict, name: str) -> dict:
    return next(q for q in example["queries"] if q["name"] == name)


def _lines(example: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(example, "q.yaml")
    return str(info.value).splitlines()


def _set(name: str, path: tuple[str, ...], value):  # noqa: ANN001, ANN202
    def mutate(example: dict) -> None:
        node = _query(example, name)
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


@pytest.mark.parametrize(("mutate", "expected"), [
    # a scalar or a list where an option's block of settings goes
    (_set("pageviews_today", ("continual",), "1d"),
     "queries[3] (pageviews_today).continual: continual takes its settings as a mapping, got '1d'; write them under "
     "it, e.g. continual: {period: 1d}"),
    (_set("top_pages", ("aggregations", "top_k"), 10),
     "queries[1] (top_pages).aggregations.top_k: top_k takes its settings as a mapping, got 10; write them under it, "
     "e.g. top_k: {k: 10}"),
    (_set("value_quantiles", ("aggregations", "quantiles"), [0.5, 0.9]),
     "queries[2] (value_quantiles).aggregations.quantiles: quantiles takes its settings as a mapping, got [0.5, 0.9]; "
     "write them under it, e.g. quantiles: {field: value, q: [0.5, 0.9, 0.99], bounds: [0, 500]}"),
    (_set("browsers_local", ("local_dp",), "browser"),
     "queries[6] (browsers_local).local_dp: local_dp takes its settings as a mapping, got 'browser'; write them under "
     "it, e.g. local_dp: {field: browser, epsilon: 2.0}"),
    (_set("sensor_means", ("aggregations", "mean_vector"), ["a", "b"]),
     "queries[7] (sensor_means).aggregations.mean_vector: mean_vector takes its settings as a mapping, got ['a', "
     "'b']; write them under it, e.g. mean_vector: {fields: [lat, lon], clip_norm: 10.0}"),
    (_set("sensor_median_temp", ("aggregations", "sample_aggregate"), "statistics:median"),
     "queries[9] (sensor_median_temp).aggregations.sample_aggregate: sample_aggregate takes its settings as a "
     "mapping, got 'statistics:median'; write them under it, e.g. sample_aggregate: {function: statistics:median, "
     "blocks: 50, output_range: [-20, 50]}"),
    (_set("top_pages", ("aggregations",), None),
     "queries[1] (top_pages).aggregations: aggregations takes its settings as a mapping, got None; write them under "
     "it, e.g. aggregations: {count: {}}"),
    # a scalar where a list goes: the value in brackets
    (_set("value_quantiles", ("aggregations", "quantiles", "q"), 0.5),
     "queries[2] (value_quantiles).aggregations.quantiles.q: q is a list in brackets, got 0.5; write it as one, "
     "e.g. q: [0.5]"),
    (_set("pageviews_by_page", ("group_by",), "page"),
     "queries[0] (pageviews_by_page).group_by: group_by is a list, got 'page'; write a YAML list in brackets, "
     "e.g. group_by: [page]"),
    (_set("value_quantiles", ("aggregations", "quantiles", "bounds"), 500),
     "queries[2] (value_quantiles).aggregations.quantiles.bounds: bounds is a list in brackets, got 500; write it "
     "as one, e.g. bounds: [0, 500]"),
    # a word or a fraction where a number goes
    (_set("top_pages", ("aggregations", "top_k", "k"), "ten"),
     "queries[1] (top_pages).aggregations.top_k.k: k must be an integer, got 'ten'; write e.g. k: 10"),
    (_set("top_pages", ("aggregations", "top_k", "k"), 2.5),
     "queries[1] (top_pages).aggregations.top_k.k: k must be an integer, got 2.5; write e.g. k: 10"),
    (_set("sensor_median_temp", ("aggregations", "sample_aggregate", "blocks"), "fifty"),
     "queries[9] (sensor_median_temp).aggregations.sample_aggregate.blocks: blocks must be an integer, got 'fifty'; "
     "write e.g. blocks: 50"),
    (_set("sensor_means", ("aggregations", "mean_vector", "clip_norm"), "big"),
     "queries[7] (sensor_means).aggregations.mean_vector.clip_norm: clip_norm must be a number, got 'big'; write "
     "e.g. clip_norm: 10.0"),
    (_set("pageviews_by_page", ("bounds", "max_groups_per_unit"), "many"),
     "queries[0] (pageviews_by_page).bounds.max_groups_per_unit: max_groups_per_unit must be an integer, got "
     "'many'; write e.g. max_groups_per_unit: 3"),
    # a key misspelt: the key meant, on one line (not also "is required")
    (lambda d: _query(d, "top_pages")["aggregations"].update(top_k={"K": 2}),
     "queries[1] (top_pages).aggregations.top_k.K: unknown field; did you mean k? (required, see "
     "deploy/queries.example.yaml)"),
    (lambda d: _query(d, "sensor_covariance")["aggregations"].update(covarience=
                                                                     _query(d, "sensor_covariance")["aggregations"]
                                                                     .pop("covariance")),
     "queries[8] (sensor_covariance).aggregations.covarience: unknown field; did you mean covariance?"),
])
def test_a_value_in_the_wrong_form_is_told_its_form_with_an_example(example, mutate, expected):
    mutate(example)
    assert _lines(example) == [f"q.yaml: {expected}"]


@pytest.mark.parametrize(("groups", "expected"), [
    ({"public": ["/"], "select": {"delta": 1e-6}},
     "groups: groups gives both public and select: give either public (the groups released every window) or select "
     "(groups chosen privately from the data), not both"),
    # a typo in the branch given is reported in that branch alone
    ({"select": {"dleta": 1e-6}},
     "groups.select.dleta: unknown field; did you mean delta? (required, see deploy/queries.example.yaml)"),
    ({"public": ["/"], "colour": "red"}, "groups.colour: unknown field; remove it or check its spelling against "
                                         "deploy/queries.example.yaml"),
    ({"publc": ["/"]}, "groups: groups needs public or select, got ['publc'] (did you mean public?); write groups: "
                       "{public: [a, b, ...]} (the groups released every window) or groups: {select: {delta: 1e-6}} "
                       "(groups chosen privately from the data)"),
    ("public", "groups: groups takes its settings as a mapping, got 'public'; write groups: {public: [a, b, ...]} "
               "(the groups released every window) or groups: {select: {delta: 1e-6}} (groups chosen privately "
               "from the data)"),
])
def test_groups_take_one_of_public_and_select_and_only_its_problems_are_told(example, groups, expected):
    _query(example, "pageviews_by_page")["groups"] = groups
    assert _lines(example) == [f"q.yaml: queries[0] (pageviews_by_page).{expected}"]


@pytest.mark.parametrize(("name", "path", "expected"), [
    ("top_pages", ("aggregations", "top_k"),
     "aggregations.top_k: top_k is empty; it needs settings, e.g. top_k: {k: 10} (see deploy/queries.example.yaml), "
     "or remove it"),
    ("sensor_covariance", ("aggregations", "covariance"),
     "aggregations.covariance: covariance is empty; it needs settings, e.g. covariance: {fields: [lat, lon], "
     "clip_norm: 10.0} (see deploy/queries.example.yaml), or remove it"),
    ("pageviews_today", ("continual",),
     "continual: continual is empty; it needs settings, e.g. continual: {period: 1d} (see "
     "deploy/queries.example.yaml), or remove it"),
    ("browsers_local", ("local_dp",),
     "local_dp: local_dp is empty; it needs settings, e.g. local_dp: {field: browser, epsilon: 2.0} (see "
     "deploy/queries.example.yaml), or remove it"),
])
def test_an_option_written_empty_is_refused_not_read_as_absent(example, name, path, expected):
    """``top_k:`` (YAML null) asks for a top_k without saying how many: read as no top_k, the release the file
    names would silently not happen."""
    _set(name, path, None)(example)
    index = next(i for i, q in enumerate(example["queries"]) if q["name"] == name)
    assert _lines(example) == [f"q.yaml: queries[{index}] ({name}).{expected}"]


def test_an_option_whose_settings_are_all_optional_written_empty_is_that_option(example):
    query = _query(example, "top_pages")
    query["aggregations"] = {"count": None, "top_k": {"k": 2}}
    assert parse_config(example).query("top_pages").aggregations.names() == {"count", "top_k"}
    query["aggregations"] = {"count": None}
    assert parse_config(example).query("top_pages").aggregations.names() == {"count"}

