"""The query file: the example loads, and each mistake gets a message naming file, query and field."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from stream_dp.config import ConfigError, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


@pytest.fixture
def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_file_is_valid():
    config = load_config(EXAMPLE)
    query = config.queries[0]
    assert query.window.size_ms == 30_000
    assert query.window.allowed_lateness_ms == 10_000
    assert query.public_group_keys() == [("/",), ("/pricing",), ("/docs",)]
    assert query.aggregations.names() == {"count", "sum", "mean"}
    assert query.aggregations.value_field == "value"
    users = config.namespaces["users"]
    assert users.accounting == "epsilon"
    assert [(b.horizon_ms, b.limit) for b in users.budgets] == [(3_600_000, 10.0), (86_400_000, 30.0)]


def test_geometric_is_read_as_laplace_and_staircase_is_kept(example):
    example["queries"][0]["mechanism"] = "geometric"
    config = parse_config(example, "queries.yaml")
    assert config.queries[0].mechanism == "laplace"
    assert [q.mechanism for q in config.queries if q.name == "session_minutes"] == ["staircase"]


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "queries.yaml")
    return str(info.value)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["queries"][0]["window"].update(size="soon"), r"queries\[0\] \(pageviews_by_page\)\.window\.size: 'soon' is not a duration"),
        (lambda d: d["queries"][0].update(mechanism="gaussian", delta=0.0), r"gaussian needs delta > 0"),
        (lambda d: d["queries"][0].update(epsilon=-1), r"\.epsilon: .*greater than 0"),
        (lambda d: d["queries"][0]["aggregations"]["sum"].update(clip=[5, 1]), r"clip \[5.0, 1.0\] must be two finite numbers"),
        (lambda d: d["queries"][0]["privacy_unit"].update(namespace="sessions"), r"namespace 'sessions', which is not defined"),
        (lambda d: d["queries"][0].update(colour="blue"), r"\.colour: unknown field"),
        (lambda d: d["queries"][0].pop("timestamp_field"), r"\.timestamp_field: is required"),
        (lambda d: d["queries"][0]["groups"].update(public=[["/", "x"]]), r"does not match group_by"),
        (lambda d: d["queries"].append(copy.deepcopy(d["queries"][0])), r"used more than once"),
        (lambda d: d["namespaces"]["users"].update(alert_at=[1.5]), r"not a fraction of the limit"),
        (lambda d: d["namespaces"]["users"]["budgets"].append({"horizon": "2h", "rho": 0.1}), r"mix of epsilon and rho"),
        (lambda d: d["namespaces"]["users"]["budgets"][0].update(rho=0.5), r"exactly one of epsilon or rho"),
        (lambda d: d["queries"][0]["aggregations"].pop("sum"), r"mean needs a sum"),
        (lambda d: d["queries"][0].update(output_topic=d["queries"][0]["input_topic"]), r"releases must go to their own topic"),
        (lambda d: d["queries"][0].update(mechanism="staircase", delta=1e-6), r"mechanism staircase is pure DP"),
        (lambda d: d["queries"][0].update(mechanism="exponential"), r"'laplace', 'gaussian', 'staircase' or 'geometric'"),
        (lambda d: d["queries"][3].update(mechanism="staircase"), r"continual releases use the binary tree mechanism"),
        (lambda d: d["queries"][3]["continual"].update(period="45s"), r"period of 45000 ms is not a multiple of at least two"),
        (lambda d: d["queries"][3]["continual"].update(max_windows_per_unit=3000), r"exceeds the 2880 windows of a period"),
        (lambda d: d["queries"][3].update(groups={"select": {"delta": 1e-6}}), r"continual releases keep a running total"),
        (lambda d: d["queries"][3]["aggregations"].update(top_k={"k": 1}), r"\['top_k'\] cannot be released continually"),
        (lambda d: d["queries"][3].update(hierarchy=True), r"continual and hierarchy cannot be combined"),
        (lambda d: d["queries"][4]["hierarchy"].update(split=[1, 1]), r"hierarchy\.split has 2 weights for 3 levels"),
        (lambda d: d["queries"][4].update(group_by=["city"], groups={"public": ["Paris"]}),
         r"hierarchy needs at least two group_by fields"),
        (lambda d: d["queries"][4].update(groups={"select": {"delta": 1e-6}}), r"hierarchy releases every level of the public"),
        (lambda d: d["queries"][2]["aggregations"]["quantiles"].update(q=[0.9, 0.5]), r"distinct and in increasing order"),
        (lambda d: d["queries"][2]["aggregations"]["quantiles"].update(q=[0.5, 1.5]), r"quantile 1\.5 is not strictly between 0 and 1"),
        (lambda d: d["queries"][2]["aggregations"]["quantiles"].update(bounds=[500, 0]), r"quantiles\.bounds: .*with lo < hi"),
        (lambda d: d["queries"][1]["aggregations"]["top_k"].update(k=10), r"top_k\.k is 10 but there are only 3 public groups"),
        (lambda d: d["queries"][1]["aggregations"]["top_k"].update(k=3),
         r"top_k\.k is 3 but there are only 3 public groups, .* forced; set k to at most 2"),
        (lambda d: (d["queries"][1]["aggregations"]["top_k"].update(k=1), d["queries"][1]["groups"].update(public=["/"])),
         r"top_k\.k is 1 .* only 1 public groups.*list at least two public groups"),
        (lambda d: d["queries"][6]["local_dp"].update(epsilon=15.0), r"local_dp\.epsilon: .*less than or equal to 10"),
        (lambda d: d["queries"][1]["aggregations"].update(top_k={"k": 0}), r"top_k\.k"),
        (lambda d: d["queries"][6].update(epsilon=1.0), r"\(browsers_local\): set the query's epsilon: 2\.0 to match local_dp\.epsilon \(what a window costs a unit: its "
         r"one report\), not 1\.0; or leave it out, and it is local_dp\.epsilon$"),
        (lambda d: d["queries"][6]["bounds"].update(max_events_per_group=3), r"one report per unit per window"),
        (lambda d: d["queries"][6].update(group_by=["os"]), r"local_dp needs group_by: \[browser\]"),
        (lambda d: d["queries"][6].update(groups={"select": {"delta": 1e-6}}), r"groups\.public listing the field's domain"),
        (lambda d: d["queries"][6]["local_dp"].update(mechanism="rappor"), r"local_dp\.mechanism"),
        (lambda d: d["queries"][7].update(mechanism="laplace", delta=0.0), r"mean_vector needs mechanism: gaussian"),
        (lambda d: d["queries"][8]["aggregations"].update(sum={"field": "v", "clip": [0, 1]}),
         r"covariance needs no \['sum'\] beside it"),
        (lambda d: d["queries"][8].update(group_by=["accel_x"], groups={"public": ["a"]}), r"serve more than one role"),
        (lambda d: d["queries"][7]["aggregations"]["mean_vector"].update(clip_norm=0), r"clip_norm 0.0 must be a positive"),
        (lambda d: d["queries"][7]["aggregations"]["mean_vector"].update(fields=["a", "a"]), r"name a field twice"),
        (lambda d: d["queries"][8]["aggregations"].update(mean_vector={"fields": ["a"], "clip_norm": 1}),
         r"keep covariance"),
        (lambda d: d["queries"][7].update(groups={"select": {"delta": 1e-6}}), r"count: \{\} or groups.public"),
        (lambda d: d["queries"][4].update(mechanism="staircase"), r"hierarchy releases use mechanism: laplace or gaussian"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(function="statistics"),
         r"package\.module:function"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(output_range=[5, 5]),
         r"output_range"),
        (lambda d: d["queries"][9].update(mechanism="staircase"), r"sample_aggregate needs mechanism: laplace or gaussian"),
        (lambda d: (d["queries"][9]["aggregations"]["sample_aggregate"].update(aggregate="median"),
                    d["queries"][9].update(mechanism="gaussian", delta=1e-6)), r"laplace with aggregate: median"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(bins=10), r"aggregate: median with bins"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(aggregate="mode"),
         r"sample_aggregate\.aggregate"),
        # a bound says the value it got and what to do; a list too short points at an example
        (lambda d: d["queries"][3]["continual"].update(max_windows_per_unit=0),
         r"max_windows_per_unit: Input should be greater than or equal to 1, got 0; change it to a value in that range"),
        (lambda d: d["queries"][2]["aggregations"]["quantiles"].update(bins=5000), r"bins: .*4096, got 5000; change it"),
        (lambda d: d["queries"][2]["aggregations"]["quantiles"].update(q=[]), r"at least 1 item.*see deploy/queries"),
        (lambda d: d["queries"][0].update(epsilon="lots"), r"\.epsilon: epsilon must be a number, got 'lots'; write e\.g\. epsilon: 0\.5"),
        # a typo must not switch on every level's release
        (lambda d: d["queries"][4].update(hierarchy="yes"), r"hierarchy must be true, false or \{split.*got 'yes'"),
        (lambda d: d["queries"][4].update(hierarchy=1), r"hierarchy must be true, false or \{split.*got 1"),
        # a capitalised key the file holds is named, not taken for the name of a union branch
        (lambda d: d["queries"][3].update(Continual=d["queries"][3].pop("continual")),
         r"queries\[3\] \(pageviews_today\)\.Continual: unknown field"),
        (lambda d: d["queries"][1]["aggregations"].update(top_k={"K": 2}), r"aggregations\.top_k\.K: unknown field"),
        # a choice says the value it got, the choices, and that names are lower-case
        (lambda d: d["queries"][0].update(mechanism="Laplace"),
         r"\.mechanism: got 'Laplace'; names are lower-case: write mechanism: laplace"),
        (lambda d: d["queries"][0].update(mechanism="stairs"),
         r"\.mechanism: got 'stairs'; choose one of 'laplace', 'gaussian', 'staircase' or 'geometric'"),
        (lambda d: d["queries"][6]["local_dp"].update(mechanism="rappor"),
         r"local_dp\.mechanism: got 'rappor'; choose one of 'krr' or 'oue'"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(aggregate="Median"),
         r"sample_aggregate\.aggregate: got 'Median'; names are lower-case: write aggregate: median"),
        # a duration's limit with its unit
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(timeout="2m"),
         r"sample_aggregate\.timeout: .*at most 60000 ms \(1m\), got 120000 ms \(2m\)"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(timeout=0),
         r"sample_aggregate\.timeout: must be at least 1 ms \(1ms\), got 0 ms"),
        # a vector query has one working mechanism: the hint goes straight to it
        (lambda d: d["queries"][7].update(mechanism="laplace", delta=1e-6),
         r"mean_vector needs mechanism: gaussian.*write mechanism: gaussian and keep delta: 1e-06"),
        (lambda d: d["queries"][7].update(delta=0.0),
         r"mean_vector has no pure-DP form: keep mechanism: gaussian and set delta > 0 \(e\.g\. delta: 1\.0e-7\)"),
        (lambda d: d["queries"][8].update(mechanism="laplace", delta=1e-6),
         r"covariance needs mechanism: gaussian.*write mechanism: gaussian and keep delta: 1e-06"),
        (lambda d: d["queries"][8].update(delta=0.0), r"covariance has no pure-DP form: keep mechanism: gaussian"),
        # a string where a function path or a list goes says how to write it
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(function=""),
         r"sample_aggregate\.function: function '' is not an import path; write it as package\.module:function"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(output_range="[-20,50]"),
         r"output_range: .*got '\[-20,50\]'; write a YAML list, not a quoted string: output_range: \[-20,50\]"),
        # weights whose sum or shares leave floating point
        (lambda d: d["queries"][4].update(hierarchy={"split": [1e308, 1e308, 1]}),
         r"hierarchy\.split \[1e\+308, 1e\+308, 1\.0\] sums to infinity; .*e\.g\. \[1, 1, 2\]"),
        (lambda d: d["queries"][4].update(hierarchy={"split": [1e-300, 1, 1]}),
         r"hierarchy\.split \[1e-300, 1\.0, 1\.0\] gives level 0 a share of 5e-301 .*at least 1e-06"),
        # a clip norm beyond what an event may carry overflows its noise's calibration
        (lambda d: d["queries"][7]["aggregations"]["mean_vector"].update(clip_norm=1e160),
         r"mean_vector\.clip_norm: clip_norm 1e\+160 exceeds 1\.414e\+15"),
        (lambda d: d["queries"][8]["aggregations"]["covariance"].update(clip_norm=1e160),
         r"covariance\.clip_norm: clip_norm 1e\+160 exceeds 1\.732e\+15"),
        # an output range beyond what values may be overflows the noise's calibration
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(output_range=[-1e308, 1e308]),
         r"sample_aggregate\.output_range: output_range \[-1e\+308, 1e\+308\] reaches beyond ±1e\+15.*narrow it"),
        (lambda d: d["queries"][9]["aggregations"]["sample_aggregate"].update(output_range=[0, 2e15]),
         r"sample_aggregate\.output_range: output_range \[0, 2e\+15\] reaches beyond ±1e\+15"),
        # a group listed twice would be released twice (twice its noise-only row, twice in a top_k, a k-RR
        # domain with a value no report can be told apart from its twin)
        (lambda d: d["queries"][1]["groups"].update(public=["/", "/", "/docs"]),
         r"\(top_pages\).*public group \['/'\] is listed twice in groups\.public; list each group once"),
        (lambda d: d["queries"][6]["groups"].update(public=["chrome", "safari", "chrome", "edge", "chrome"]),
         r"public group \['chrome'\] is listed 3 times in groups\.public; list each group once"),
        (lambda d: d["queries"][4]["groups"]["public"].append(list(d["queries"][4]["groups"]["public"][0])),
         r"\(visits_by_place\).*public group \['[^]]*', '[^]]*', '[^]]*'\] is listed twice in groups\.public"),
    ],
)
def test_mistakes_are_explained(example, mutate, expected):
    mutate(example)
    message = _error(example)
    assert message.startswith("queries.yaml: ")
    assert __import__("re").search(expected, message), message


def test_groups_alike_only_in_type_are_two_groups(example):
    """A group is matched by type and value ("1" and 1 are two groups, as in events), so both may be listed."""
    query = example["queries"][0]
    query["groups"]["public"] = ["1", 1, "/"]
    assert parse_config(example, "queries.yaml").queries[0].public_group_keys() == [("1",), (1,), ("/",)]


def test_sample_aggregate_as_short_as_function_blocks_and_range_reads_the_value_field(example):
    query = _hourly_sample_aggregate(example)
    query["aggregations"] = {"sample_aggregate": {"function": "statistics:median", "blocks": 50,
                                                  "output_range": [-20, 50]}}
    sa = parse_config(example).query(query["name"]).aggregations.sample_aggregate
    assert (sa.field, sa.aggregate, sa.timeout_ms) == ("value", "mean", 1000)


def test_a_bad_hierarchy_split_is_one_line_not_a_union_branch_per_type(example):
    example["queries"][4]["hierarchy"].update(split=[1, 0, 1])
    lines = _error(example).splitlines()
    assert lines == ["queries.yaml: queries[4] (visits_by_place).hierarchy.split: hierarchy.split [1.0, 0.0, 1.0] must "
                     "be positive weights, one per group_by level, e.g. [1, 1, 2]"]


def test_unreadable_and_non_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("queries: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar)


def test_hierarchy_true_gives_every_level_the_same_share(example):
    places = next(q for q in example["queries"] if q["name"] == "visits_by_place")
    assert parse_config(example, "queries.yaml").queries[4].hierarchy_split == [0.25, 0.25, 0.5]  # split [1, 1, 2]
    places["hierarchy"] = True
    query = parse_config(example, "queries.yaml").queries[4]
    assert query.name == "visits_by_place" and query.hierarchy_split == pytest.approx([1 / 3] * 3)
    places["hierarchy"] = False
    assert parse_config(example, "queries.yaml").queries[4].hierarchy_split is None


def _hourly_sample_aggregate(example: dict) -> dict:
    """The example's sample_aggregate query on 1 h windows with 50 blocks and a timeout of 1 s (its 2 public
    sites kept): at worst 2 x 50 x 1 s = 100 s an hour."""
    query = example["queries"][9]
    assert query["name"] == "sensor_median_temp"
    query["window"] = {"size": "1h", "allowed_lateness": "1m"}
    query["aggregations"]["sample_aggregate"].update(blocks=50, timeout="1s")
    return query


def _sample_aggregate_over(example: dict, groups: dict, **options) -> dict:
    """The example's sample_aggregate query (2 public sites, 50 blocks, timeout 1 s, 1 h windows) over
    ``groups``, with a count beside it (selected groups come from a count release) and ``options``."""
    query = _hourly_sample_aggregate(example)
    query["groups"] = groups
    query["aggregations"] = {"count": {}, "sample_aggregate": {**query["aggregations"]["sample_aggregate"], **options}}
    return query


SELECTED = {"select": {"delta": 1e-6}}


@pytest.mark.parametrize(("groups", "options", "expected"), [
    # nothing else bounds how many groups pass selection: a producer can make up any number
    (SELECTED, {}, r"sample_aggregate needs max_released_groups with privately selected groups: the most groups a "
                   r"window releases \(those with the largest noisy counts\), which bounds the function's work: .*; "
                   r"e\.g\. max_released_groups: 72 fits the 3600 s window at 50 blocks x timeout 1000 ms"),
    # at worst every block of every released group runs out its timeout, one after another
    (SELECTED, {"max_released_groups": 73},
     r"sample_aggregate needs a worst-case release time within the window: max_released_groups 73 x 50 blocks x "
     r"timeout 1000 ms = 3650 s per window of 3600 s; lower max_released_groups, timeout or blocks, or use longer"),
    ({"public": ["north", "south"]}, {"max_released_groups": 2},
     r"sample_aggregate needs no max_released_groups with groups\.public \(every listed group is released"),
])
def test_a_sample_aggregate_over_selected_groups_needs_a_cap_its_worst_case_fits(example, groups, options, expected):
    _sample_aggregate_over(example, groups, **options)
    message = _error(example)
    assert re.search(r"queries\[9\] \(sensor_median_temp\): " + expected, message), message


def _second_sample_aggregate(example: dict, window: str, timeout_ms: int) -> dict:
    """A copy of the example's sample_aggregate query (2 public sites, 50 blocks) on its own topics, with
    ``window`` and a block timeout of ``timeout_ms``: at worst 2 x 50 x timeout_ms per window."""
    query = copy.deepcopy(_hourly_sample_aggregate(example))
    query.update(name="sensor_median_temp_2", input_topic="events.sensors_2", output_topic="dp.sensor_median_temp_2")
    query["window"] = {"size": window}
    query["aggregations"]["sample_aggregate"]["timeout"] = f"{timeout_ms}ms"
    example["queries"].append(query)
    return query


# One worker releases every query of the file in turn, so the worst cases (groups x blocks x timeout) of
# all its sample_aggregate queries add up, each per its own window, and must not take more than the whole
# of the release stage's time: here the example's query, 2 x 50 x 1 s = 100 s an hour (2.78%; its other
# group-by-group queries take about 0.01%), and a copy, 2 x 50 x timeout per window.
@pytest.mark.parametrize(("window", "timeout_ms", "accepted"), [
    ("1h", 34_900, True),  # 100 s + 3490 s an hour: 99.72%
    ("1h", 35_001, False),  # 100 s + 3500.1 s an hour: each within its window, not both
    ("2h", 60_000, True),  # 100 s an hour + 6000 s every two hours: 86.1%
    ("30m", 17_400, True),  # 100 s an hour + 1740 s every 30 minutes: 99.44%
    ("30m", 17_600, False),  # 100 s an hour + 1760 s every 30 minutes: 100.56%, though within its own 30 min
])
def test_the_sample_aggregate_queries_of_a_file_must_fit_the_release_stage_together(example, window, timeout_ms,
                                                                                   accepted):
    _second_sample_aggregate(example, window, timeout_ms)
    if accepted:
        parse_config(example, "queries.yaml")
        return
    message = _error(example)
    assert message.startswith("queries.yaml: queries: the queries releasing group by group keep the release stage "
                              "busy 100."), message
    assert (f"sensor_median_temp 100 s per 3600 s window (sample_aggregate), sensor_median_temp_2 "
            f"{2 * 50 * timeout_ms / 1000:g} s per") in message
    assert "one worker releases every query of the file one after another" in message
    assert "lower their max_released_groups (or q, bins, fields; timeout or blocks), or use longer windows" in message
    assert "\n" not in message  # one problem, one line: each query alone is accepted


def test_check_config_adds_up_the_sample_aggregate_queries_of_a_file(example, tmp_path, capsys):
    from stream_dp.cli.main import main

    _second_sample_aggregate(example, "1h", 35_001)  # 100 s + 3500.1 s an hour
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(example))
    assert main(["check-config", str(path)]) == 1
    assert "keep the release stage busy 100.01" in capsys.readouterr().err  # the other queries take ~0.01%


def test_check_config_and_plan_state_the_worst_case_of_a_capped_selection(example, tmp_path, capsys):
    from stream_dp.cli.main import main

    query = _sample_aggregate_over(example, SELECTED, max_released_groups=73)
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(example))
    assert main(["check-config", str(path)]) == 1
    assert "max_released_groups 73 x 50 blocks x timeout 1000 ms = 3650 s" in capsys.readouterr().err
    # 72 fits the window alone, but the file's quantiles take a little of the release stage's time too
    query["aggregations"]["sample_aggregate"]["max_released_groups"] = 71
    path.write_text(yaml.safe_dump(example))
    assert main(["check-config", str(path)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["plan", str(path)]) == 0
    assert ("sample_aggregate release time: at worst (every block running out its 1 s timeout) 3550 s per window "
            "(at most 71 released groups, max_released_groups: those with the largest noisy counts)"
            in capsys.readouterr().out)


def test_each_requirement_of_an_option_is_its_own_line(example):
    """A sample_aggregate over selected groups without a count misses two things: each is stated on its own line
    with the query named, not run together into one sentence."""
    query = _hourly_sample_aggregate(example)
    query["groups"] = SELECTED
    lines = _error(example).splitlines()
    assert [line.split(": sample_aggregate needs ")[0] for line in lines] == ["queries.yaml: queries[9] "
                                                                              "(sensor_median_temp)"] * 2
    assert lines[0].endswith("e.g. max_released_groups: 72 fits the 3600 s window at 50 blocks x timeout 1000 ms")
    assert lines[1].endswith("sample_aggregate needs count: {} or groups.public (privately selected groups come "
                             "from a count release)")


def test_publish_from_is_a_time_with_its_zone_and_only_for_public_groups(example):
    """Where a public query starts publishing (``docs/privacy/publication-rule.md``): an instant no reading of
    which depends on the machine, written quoted or as the timestamp YAML reads unquoted."""
    import datetime

    for written in ("2026-01-01T00:00:00Z", "2026-01-01T09:00:00+09:00", " 2026-01-01T00:00:00.000+00:00",
                    datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)):
        example["queries"][0]["window"]["publish_from"] = written
        assert parse_config(example).queries[0].window.publish_from_ms == 1_767_225_600_000, written
    unquoted = yaml.safe_load("window: {size: 30s, publish_from: 2026-01-01T00:00:00Z}")["window"]
    example["queries"][0]["window"] = unquoted
    assert parse_config(example).queries[0].window.publish_from_ms == 1_767_225_600_000
    for written, why in (("2026-01-01T00:00:00", "has no zone"), ("2026-01-01", "is a date, not a time"),
                         (1_767_225_600_000, "is not a time"), ("yesterday", "is not a time")):
        example["queries"][0]["window"]["publish_from"] = written
        if written == "2026-01-01":
            example["queries"][0]["window"]["publish_from"] = datetime.date(2026, 1, 1)  # YAML's unquoted date
        assert why in _error(example), written
    example["queries"][0]["window"]["publish_from"] = "2026-01-01T00:00:00Z"
    example["queries"][0]["groups"] = {"select": {"delta": 1e-6}}
    assert re.search(r"window\.publish_from .* selected groups .* remove publish_from", _error(example))
