"""``plan`` and ``check-config`` set each 95% error beside the value it qualifies at a query's ``expected`` counts,
and warn, naming the settings that fix it, when the error is the larger.

The count case is worked out here from the documented noise alone: a count-only Laplace query whose unit adds
at most L0 x Linf = 2 events draws discrete Laplace noise of scale 2 / epsilon (P(z) proportional to
exp(-|z| / scale)), whose 95% half-width is the least integer t with
P(|Z| > t) = 2 exp(-(t + 1) / scale) / (1 + exp(-1 / scale)) <= 0.05. The epsilon a warning names is, as
documented, the error-to-value ratio times the query's epsilon rounded up to two significant digits, raised
by 10% (rounded up again) while the error at it still exceeds the value.
"""

from __future__ import annotations

import json
import math
from decimal import ROUND_CEILING, Decimal
from pathlib import Path

import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.cli.plan_expected import ceil_significant
from stream_dp.config import ConfigError, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


def _count_query(epsilon: float, expected: dict, **changes) -> dict:
    query = {"name": "hits", "input_topic": "in", "output_topic": "out",
             "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
             "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a", "b"]},
             "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 2},
             "aggregations": {"count": {}}, "epsilon": epsilon, "expected": expected}
    query.update(changes)
    return query


def _file(tmp_path: Path, *queries: dict) -> Path:
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
                                    "queries": list(queries)}))
    return path


def _discrete_laplace_ci95(scale: float) -> int:
    t = 0
    while 2 * math.exp(-(t + 1) / scale) / (1 + math.exp(-1 / scale)) > 0.05:
        t += 1
    return t


def _count_ci95(epsilon: float) -> int:
    return _discrete_laplace_ci95(2 / (epsilon * (1 - 1e-9)))  # the plan keeps a 1e-9 margin below epsilon


def _up(x: float) -> float:
    exact = Decimal(f"{x:.12g}")
    return float(exact.quantize(Decimal(1).scaleb(exact.adjusted() - 1), rounding=ROUND_CEILING))


def _plan(path: Path, capsys) -> tuple[str, dict]:
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert main(["plan", str(path), "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("x", "rounded"), [(0.4401, 0.45), (13.2, 14.0), (0.45, 0.45), (0.1 * 4.5, 0.45),
                                            (132.0, 140.0), (0.0123456, 0.013), (9.99, 10.0), (1.0, 1.0)])
def test_an_epsilon_is_rounded_up_to_two_significant_digits(x, rounded):
    assert ceil_significant(x) == rounded


def test_a_count_whose_error_exceeds_the_expected_count_is_warned_with_the_epsilon_that_fixes_it(tmp_path, capsys):
    error = _count_ci95(0.2)  # scale 10: 30
    assert error == 30 > 20
    path = _file(tmp_path, _count_query(0.2, {"events_per_group": 20}))
    text, plan = _plan(path, capsys)
    epsilon = _up(0.2 * error / 20)
    while _count_ci95(epsilon) > 20:
        epsilon = _up(epsilon * 1.1)
    assert epsilon == 0.3 and _count_ci95(epsilon) <= 20
    window = math.ceil(60 * error / 20)  # seconds: the events of a wider window, at the same rate
    warning = (f"WARNING: query hits: at the expected counts the count's 95% error ±{error} exceeds the count, 20 "
               f"events; raise epsilon to {epsilon:g} (it is 0.2), widen the window to {window}s (it is 1m) where "
               "groups then hold proportionally more, or lower max_events_per_group (2)")
    assert f"  {warning}" in text.splitlines()
    assert f"at the expected counts (events per group 20): count ±{error} (150.0% of 20 events)" in text
    (query,) = plan["queries"]
    assert query["expected"]["errors"] == [{"what": "count", "ci95": error, "value": 20, "exceeds": True}]
    assert query["expected"]["warnings"] == [warning]
    assert main(["check-config", str(path)]) == 0  # a warning, not a refusal
    assert f"  {warning}" in capsys.readouterr().out.splitlines()


def test_an_error_below_its_value_is_stated_and_not_warned(tmp_path, capsys):
    error = _count_ci95(0.2)
    path = _file(tmp_path, _count_query(0.2, {"events_per_group": 1000}))
    text, plan = _plan(path, capsys)
    assert f"at the expected counts (events per group 1,000): count ±{error} (3.0% of 1,000 events)" in text
    assert "WARNING" not in text and plan["queries"][0]["expected"]["warnings"] == []
    assert main(["check-config", str(path)]) == 0
    assert "WARNING" not in capsys.readouterr().out
    # an error equal to its value does not exceed it
    text, plan = _plan(_file(tmp_path, _count_query(0.2, {"events_per_group": error})), capsys)
    assert "WARNING" not in text


def test_a_sum_is_set_beside_events_times_value_and_a_query_without_expected_gets_no_line(tmp_path, capsys):
    sums = _count_query(1.0, {"events_per_group": 100, "value": 2.0}, name="amounts",
                        aggregations={"count": {}, "sum": {"field": "amount", "clip": [0, 100]}},
                        bounds={"max_groups_per_unit": 1, "max_events_per_group": 1})
    plain = _count_query(0.2, {"events_per_group": 1}, name="plain", output_topic="out2")
    plain.pop("expected")
    text, plan = _plan(_file(tmp_path, sums, plain), capsys)
    errors = {e["what"]: e for e in plan["queries"][0]["expected"]["errors"]}
    # count and sum take half of epsilon 1 each: count scale 2, sum scale 100 / 0.5 = 200 (about 200 ln 20 = 599)
    assert errors["count"]["ci95"] == _discrete_laplace_ci95(1 / (0.5 * (1 - 1e-9))) and not errors["count"]["exceeds"]
    assert errors["sum"]["value"] == 200 and errors["sum"]["ci95"] == pytest.approx(200 * math.log(20), rel=0.01)
    assert errors["sum"]["exceeds"]
    assert ("WARNING: query amounts: at the expected counts the sum's 95% error ±599 exceeds the sum, 200 (100 x 2); "
            "raise epsilon to 3 (it is 1)") in text
    assert "a narrower clip than [0, 100]" in text
    assert "plain" not in "".join(line for line in text.splitlines() if "expected" in line)
    assert plan["queries"][1]["expected"] == {"given": None, "errors": [], "not_compared": [], "warnings": []}


def test_what_a_comparison_needs_and_the_block_leaves_out_is_said(tmp_path, capsys):
    sums = _count_query(1.0, {"events_per_group": 100}, aggregations={"count": {}, "sum": {"field": "amount",
                                                                                           "clip": [0, 100]}})
    text, plan = _plan(_file(tmp_path, sums), capsys)
    assert plan["queries"][0]["expected"]["not_compared"] == ["expected.value (the sum and mean)"]
    assert "not compared without expected.value (the sum and mean)" in text


def test_quantile_ranks_are_set_beside_the_ranks_to_the_groups_nearer_end(tmp_path, capsys):
    query = _count_query(1.0, {"events_per_group": 1000}, name="latency",
                         aggregations={"count": {}, "quantiles": {"field": "ms", "q": [0.5, 0.99], "bounds": [0, 100],
                                                                  "bins": 50}})
    text, plan = _plan(_file(tmp_path, query), capsys)
    errors = {e["what"]: e for e in plan["queries"][0]["expected"]["errors"]}
    assert errors["q0.5 rank"]["value"] == 500 and errors["q0.99 rank"]["value"] == pytest.approx(10)
    for name, entry in errors.items():
        assert entry["exceeds"] is (entry["ci95"] > entry["value"]), name
    assert errors["q0.99 rank"]["exceeds"] and not errors["q0.5 rank"]["exceeds"]
    assert "the q0.99 rank's 95% error" in text and "the q0.5 rank's 95% error" not in text
    assert "ask for fewer q (2)" in text


@pytest.mark.parametrize(("expected", "message"), [
    ({}, "expected gives none of events_per_group, units_per_group and value"),
    ({"value": 0}, "expected.value 0 leaves nothing for an error to be compared with"),
    ({"events_per_group": 0}, "greater than or equal to 1"),
    ({"events": 10}, "unknown field"),
])
def test_an_expected_block_that_says_nothing_usable_is_refused(expected, message):
    document = {"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1.0}]}},
                "queries": [_count_query(0.2, expected)]}
    with pytest.raises(ConfigError, match=message):
        parse_config(document, "queries.yaml")


def test_the_example_states_every_query_at_its_expected_counts_and_none_exceeds_its_value(capsys):
    text, plan = _plan(EXAMPLE, capsys)
    for query in plan["queries"]:
        assert query["expected"]["given"], query["query"]
        assert query["expected"]["errors"] and not query["expected"]["not_compared"], query["query"]
        # well below: under half of the value
        assert all(e["ci95"] <= abs(e["value"]) / 2 for e in query["expected"]["errors"]), query["expected"]
    assert text.count("at the expected counts (") == len(plan["queries"])
    assert "WARNING: query" not in text


def test_the_settings_fingerprint_ignores_the_hint():
    from stream_dp.worker.query.runtime import charged_settings

    document = yaml.safe_load(EXAMPLE.read_text())
    config = parse_config(document)
    query = config.queries[0]
    assert query.expected is not None
    runtime = type("Runtime", (), {"namespace": "users", "cost": 0.5, "delta": 0.0, "config": query})()
    document["queries"][0]["expected"] = {"events_per_group": 1}
    other = type("Runtime", (), {"namespace": "users", "cost": 0.5, "delta": 0.0,
                                 "config": parse_config(document).queries[0]})()
    assert charged_settings(runtime) == charged_settings(other)


def test_a_gaussian_vectors_epsilon_is_raised_until_the_plan_built_with_it_fits(tmp_path, capsys):
    """A Gaussian error falls more slowly than 1/epsilon at large epsilon: the epsilon named is checked against
    the plan built with it, and the one 10% below it does not fit."""
    import re

    from stream_dp.worker.query.costs import build_plan

    query = _count_query(1.0, {"units_per_group": 50, "value": 1.0}, name="means", mechanism="gaussian", delta=1e-6,
                         aggregations={"mean_vector": {"fields": ["x", "y"], "clip_norm": 5}})
    path = _file(tmp_path, query)
    document = yaml.safe_load(path.read_text())
    document["namespaces"]["users"]["budgets"][0]["delta"] = 1e-3
    path.write_text(yaml.safe_dump(document))
    text, _ = _plan(path, capsys)
    (line,) = [line for line in text.splitlines() if "WARNING: query means" in line]
    epsilon = float(re.search(r"raise epsilon to ([\d.]+) \(it is 1\)", line).group(1))

    def worst_mean_error(at: float) -> float:
        config = parse_config({**document, "queries": [{**query, "epsilon": at}]})
        return build_plan(config.queries[0]).vector.errors_at(50)["mean"][1]

    assert worst_mean_error(1.0) > 1.0 >= worst_mean_error(epsilon)
    assert worst_mean_error(epsilon / 1.1) > 1.0
