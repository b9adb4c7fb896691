"""check-config's bound on release time of quantiles, mean_vector and covariance queries over selected groups.

Each released group takes OpenDP draws (one per group and q, or one per noised coordinate), and a
producer can make up any number of groups that pass selection, so these queries must cap the groups a
window releases (``max_released_groups``), and that many groups' estimated release time must fit the
window. The expected figures are worked out here by hand from the per-group times the README states:
a quantile draw about 200 us + 0.025 us per bin, a vector 60 us per group + 17 us per coordinate.
"""

from __future__ import annotations

import re

import pytest

from stream_dp.config import parse_config
from tests.config.test_queries import _error, example  # noqa: F401 (fixture)

SELECTED = {"select": {"delta": 1e-6}}


def _minute_quantiles(example: dict) -> dict:
    """The example's quantiles query on 1 min windows with 3 q at 256 bins (its 3 public pages kept)."""
    query = example["queries"][2]
    assert query["name"] == "value_quantiles"
    query["window"] = {"size": "1m", "allowed_lateness": "10s"}
    query["aggregations"]["quantiles"].update(q=[0.5, 0.9, 0.99], bounds=[0, 500], bins=256)
    return query


def _hourly(example: dict, index: int) -> dict:
    """The example's query ``index`` on 1 h windows."""
    query = example["queries"][index]
    query["window"] = {"size": "1h", "allowed_lateness": "1m"}
    return query


def _alone(example: dict, index: int, name: str, **changes) -> dict:
    """The example's query ``index`` as the only query of the file (other queries' release time aside); its
    quantiles on 1 min windows with 3 q at 256 bins, its vectors on 1 h windows."""
    query = example["queries"][index]
    assert query["name"] == name
    if "quantiles" in query.get("aggregations", {}):
        _minute_quantiles(example)
        query["aggregations"]["quantiles"].pop("value_interval", None)  # draws alone; intervals are tested apart
    else:
        _hourly(example, index)
    query.update(changes)
    example["queries"] = [query]
    return query


# value_quantiles: 3 q at 256 bins, 1 min windows: 3 x (200 + 0.025 x 256) us = 0.6192 ms per group,
# so 60,000 ms hold 96,899 groups (96,899.2)
@pytest.mark.parametrize(("groups", "cap", "expected"), [
    (SELECTED, None,
     r"quantiles needs max_released_groups with privately selected groups: the most groups a window releases "
     r"\(those with the largest noisy counts\), which bounds the release's work .*; e\.g\. max_released_groups: "
     r"96899 fits the 60 s window at 3 quantiles x about 0\.206 ms at 256 bins per group$"),
    (SELECTED, 96_900,
     r"quantiles needs a release time within the window: max_released_groups 96900 x 3 quantiles x about 0\.206 ms "
     r"at 256 bins per group = about 60 s per window of 60 s; lower max_released_groups, q or bins, or use longer "
     r"windows$"),
    ({"public": ["/", "/pricing"]}, 2,
     r"quantiles needs no max_released_groups with groups\.public \(every listed group is released"),
])
def test_quantiles_over_selected_groups_need_a_cap_that_fits_the_window(example, groups, cap, expected):
    query = _alone(example, 2, "value_quantiles", groups=groups)
    if cap is not None:
        query["aggregations"]["quantiles"]["max_released_groups"] = cap
    message = _error(example)
    assert re.search(r"queries\[0\] \(value_quantiles\): " + expected, message), message


def test_value_intervals_add_their_histogram_to_a_groups_release_time(example):
    # + 256 bins x (0.5 + 0.5 x 3 q) us = 0.512 ms: 1.1312 ms per group, 60,000 ms hold 53,041 groups (53,041.0)
    query = _alone(example, 2, "value_quantiles", groups=SELECTED)
    query["aggregations"]["quantiles"]["value_interval"] = True
    message = _error(example)
    assert re.search(r"e\.g\. max_released_groups: 53041 fits the 60 s window at 3 quantiles x about 0\.206 ms at "
                     r"256 bins \+ about 0\.512 ms of value intervals per group$", message), message


def test_quantiles_with_a_cap_that_fits_are_accepted(example):
    query = _alone(example, 2, "value_quantiles", groups=SELECTED)
    query["aggregations"]["quantiles"]["max_released_groups"] = 96_899
    (parsed,) = parse_config(example, "queries.yaml").queries
    assert parsed.aggregations.quantiles.max_released_groups == 96_899


@pytest.mark.parametrize(("index", "name", "kind"), [(7, "sensor_means", "mean_vector"),
                                                    (8, "sensor_covariance", "covariance")])
def test_vectors_over_selected_groups_need_a_cap(example, index, name, kind):
    query = _alone(example, index, name, groups=SELECTED)
    query["aggregations"] = {"count": {}, kind: query["aggregations"][kind]}
    message = _error(example)
    # an hour holds far more groups than the largest cap: the example is the largest cap
    assert re.search(rf"queries\[0\] \({name}\): {kind} needs max_released_groups with privately selected groups: "
                     r".*e\.g\. max_released_groups: 1000000 fits the 3600 s window", message), message
    query["aggregations"][kind]["max_released_groups"] = 1000
    parse_config(example, "queries.yaml")


def test_a_covariance_cap_must_fit_the_window(example):
    # 16 fields: 17 x 18 / 2 = 153 noised coordinates, 60 + 17 x 153 = 2661 us a group: 22,547 groups a minute
    query = _alone(example, 8, "sensor_covariance", groups=SELECTED, window={"size": "1m"})
    fields = [f"x{i}" for i in range(16)]
    query["aggregations"] = {"count": {}, "covariance": {"fields": fields, "clip_norm": 20,
                                                         "max_released_groups": 22_548}}
    message = _error(example)
    assert ("covariance needs a release time within the window: max_released_groups 22548 x about 2.66 ms for 153 "
            "noised coordinates per group = about 60 s per window of 60 s; lower max_released_groups or fields, or "
            "use longer windows") in message, message
    query["aggregations"]["covariance"]["max_released_groups"] = 22_547
    parse_config(example, "queries.yaml")


def test_the_file_adds_up_quantiles_and_sample_aggregate_release_times(example):
    # the sample_aggregate on 1 h windows takes at worst 100 s an hour (2.78% of the time); quantiles capped at
    # 95,000 groups take 95,000 x 0.6192 ms = 58.8 s a minute (98.04%): each fits its window, not both
    _minute_quantiles(example)
    _hourly(example, 9)["aggregations"]["sample_aggregate"].update(blocks=50, timeout="1s")
    example["queries"][2]["groups"] = SELECTED
    example["queries"][2]["aggregations"]["quantiles"].pop("value_interval")  # the draws alone: 0.6192 ms
    example["queries"][2]["aggregations"]["quantiles"]["max_released_groups"] = 95_000
    message = _error(example)
    assert message.startswith("queries.yaml: queries: the queries releasing group by group keep the release stage "
                              "busy 100.8"), message
    assert "value_quantiles 58.824 s per 60 s window (quantiles)" in message
    assert "sensor_median_temp 100 s per 3600 s window (sample_aggregate)" in message
    example["queries"][2]["aggregations"]["quantiles"]["max_released_groups"] = 90_000  # 55.7 s: 95.7% in all
    parse_config(example, "queries.yaml")


def test_plan_states_the_release_time_of_a_capped_quantiles_query(example, tmp_path, capsys):
    import yaml

    from stream_dp.cli.main import main

    query = _alone(example, 2, "value_quantiles", groups=SELECTED)
    query["aggregations"]["quantiles"]["max_released_groups"] = 50_000
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(example))
    assert main(["plan", str(path)]) == 0
    assert ("quantiles release time: about 30.96 s per window at most (50000 released groups, max_released_groups: "
            "those with the largest noisy counts, x 3 quantiles x about 0.206 ms at 256 bins per group)"
            in capsys.readouterr().out)
