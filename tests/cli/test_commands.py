"""The ``stream-dp`` command: its subcommands, and produce/tail against the real broker."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
import yaml
from kafka import KafkaConsumer

from stream_dp.cli.main import SUBCOMMANDS, build_parser, main
from stream_dp.cli.tail import format_row
from tests.config.test_implied import written_out

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "queries.example.yaml"


def test_help_lists_the_nine_subcommands():
    out = subprocess.run([sys.executable, "-m", "stream_dp.cli.main", "--help"], capture_output=True, text=True, check=True)
    for name in ("run", "check-config", "plan", "produce", "tail", "export", "budget", "schema", "acls"):
        assert name in out.stdout
    assert set(SUBCOMMANDS) == {"run", "check-config", "plan", "produce", "tail", "export", "budget", "schema",
                                "acls"}
    assert build_parser().parse_args(["check-config", "x.yaml"]).config == "x.yaml"


def test_check_config_ok_and_failing(tmp_path, capsys):
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "OK (10 queries)" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("epsilon: 0.5 ", "epsilon: -0.5 "))
    assert main(["check-config", str(bad)]) == 1
    assert "pageviews_by_page" in capsys.readouterr().err


def test_plan_json_states_loss_scales_and_budget_use(capsys):
    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["queries"][0]
    assert plan["per_window_loss"]["epsilon"] == pytest.approx(0.5, rel=1e-6)
    assert plan["count_scale"] > 0 and plan["sum_scale"] > 0
    hour = plan["horizons"][0]
    assert hour["windows_in_horizon"] == 120 and hour["windows_a_unit_can_join"] == 20  # 30 s windows, 10 / 0.5
    counts = [a["count"] for a in plan["accuracy"]]
    assert counts == sorted(counts) and all(a["count_ci95"] > 0 for a in plan["accuracy"])


def test_plan_shows_the_delta_a_fully_active_unit_spends(tmp_path, capsys):
    selecting = tmp_path / "select.yaml"
    first_query = EXAMPLE.read_text().split("  # --- options")[0]  # the options need public groups
    text = first_query.replace("public: [\"/\", \"/pricing\", \"/docs\"]", "select: {delta: 1.0e-6}")
    text = text.replace("epsilon: 0.5 ", "epsilon: 0.1 ")  # the delta limits bind first
    assert "select: {delta: 1.0e-6}" in text and "epsilon: 0.1 " in text
    selecting.write_text(text)
    assert main(["plan", str(selecting), "--json"]) == 0
    (plan,) = json.loads(capsys.readouterr().out)["queries"]
    assert 0.99e-6 < plan["per_window_delta"] <= 1e-6  # the selection threshold may spend a little less
    hour, day = plan["horizons"]
    # epsilon 0.1 per window: 100 windows fit 10 per hour, but delta 1e-6 per window: only 10 fit 1e-5
    assert hour["windows_a_unit_can_join"] == 10
    assert hour["fully_active_unit_spends"]["delta"] == pytest.approx(10 * plan["per_window_delta"])
    # a day: 300 windows fit epsilon 30, 40 fit delta 4e-5
    assert day["fully_active_unit_spends"] == {"epsilon": pytest.approx(40 * 0.1),
                                               "delta": pytest.approx(40 * plan["per_window_delta"])}
    assert main(["plan", str(selecting)]) == 0
    assert "delta 9.93e-06 per 1h" in capsys.readouterr().out
    # Without a delta limit the query's delta would be unbounded: plan (and run) refuse it.
    no_delta = tmp_path / "no_delta.yaml"
    no_delta.write_text(text.replace(", delta: 1.0e-5}", "}").replace(", delta: 4.0e-5}", "}"))
    assert main(["plan", str(no_delta)]) == 1
    assert "has no delta limit" in capsys.readouterr().err


CORPUS = EXAMPLE.parents[1] / "tests" / "config" / "corpus"


@pytest.mark.parametrize("name", ["bad_clip_too_narrow_to_calibrate", "bad_output_range_beyond_event_values",
                                  "bad_output_range_too_narrow_to_calibrate", "bad_covariance_clip_norm_underflows"])
def test_plan_refuses_a_file_its_release_plan_cannot_be_built_from_naming_file_and_query(name, capsys):
    """Whatever the release plan's builders raise on a bad file (a math domain error, an overflow), plan says
    it in one line naming the file and the query, as check-config does; an exception escaping ``main``
    fails this test."""
    path = CORPUS / f"{name}.yaml"
    status = main(["plan", str(path)])
    err = capsys.readouterr().err
    assert status == 1 and re.match(rf"{re.escape(str(path))}: queries\[0\] \(\w+\)", err), err
    assert len(err.splitlines()) == 1, err


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _plan_blocks(args: list[str], capsys) -> dict[str, list[str]]:
    """``stream-dp plan`` text output, per query: its header, then its lines without their indent (the
    namespaces' lines, after the queries', are left out)."""
    assert main(["plan", *args]) == 0
    blocks: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("namespace "):
            break
        if line.startswith("query "):
            blocks[line.split()[1]] = [line]
        else:
            assert line.startswith("  "), line
            blocks[list(blocks)[-1]].append(line.strip())
    return blocks


def _one(lines: list[str], pattern: str) -> re.Match:
    found = [m for line in lines if (m := re.fullmatch(pattern, line))]
    assert len(found) == 1, f"{len(found)} lines match {pattern!r} in:\n" + "\n".join(lines)
    return found[0]


NUM = r"(-?[\d,.]+(?:e[+-]\d+)?)"


def test_plan_prints_a_sane_line_for_every_option_of_the_example(capsys):
    from stream_dp.config import load_config
    from stream_dp.worker.query.costs import build_plan

    blocks = _plan_blocks([str(EXAMPLE)], capsys)
    config = load_config(EXAMPLE)
    assert list(blocks) == [q.name for q in config.queries]

    # continual: 2,880 windows of 30 s a day, so every compared window is within the period
    lines = blocks["pageviews_today"]
    assert not any("beyond the period" in line for line in lines)
    _one(lines, r"continual: binary tree over 2880 windows per period \(depth 12\), a unit counts in at most 4 "
                r"windows and is charged epsilon 2 once per period")
    rows = {}
    for t in (1, 10, 100, 1_000):
        m = _one(lines, rf"running total after\s+{t:,} windows: count std {NUM} \(95% ±{NUM}\) with the tree vs "
                        rf"{NUM} summing")  # the example's running totals count only
        rows[t] = [_number(x) for x in m.groups()]
    for t, (tree, ci, naive) in rows.items():
        assert 0 < tree < ci < 3 * tree and naive > 0
    # summation's std grows as sqrt(t); the tree's as sqrt(popcount(t)): 1, 2, 3 and 6 nodes
    assert rows[1_000][2] / rows[10][2] == pytest.approx(10, rel=0.01)
    assert rows[1_000][0] / rows[1][0] == pytest.approx(6**0.5, rel=0.02)
    # one node's noise is depth (12) times one window's: the tree starts out worse and wins by window 1,000
    assert rows[1][0] / rows[1][2] == pytest.approx(12, rel=0.02)
    assert rows[1][0] > rows[1][2] and rows[10][0] > rows[10][2]
    assert rows[1_000][0] < rows[1_000][2]
    m = _one(lines, r"the tree's std grows polylogarithmically .*: the tree is more accurate at every window from "
                    rf"{NUM} on; before that only at windows with few set bits, never before window {NUM}")
    better_from, first_better = (int(_number(x)) for x in m.groups())
    continual = build_plan(config.query("pageviews_today")).continual
    every = continual.error_table(range(1, continual.windows_per_period + 1))
    worse = [r["t"] for r in every if r["count"]["tree_std"] >= r["count"]["naive_std"]]
    better = [r["t"] for r in every if r["count"]["tree_std"] < r["count"]["naive_std"]]
    assert (better_from, first_better) == (max(worse) + 1, min(better)) == (1_280, 256)
    # the budget: a 1h horizon inside a 1d period holds at most the 2 periods' charges it overlaps
    m = _one(lines, r"10 \(delta 1e-05\) per 1h, shorter than the 1d period: a unit is charged 2 epsilon once per "
                    r"1d period, .*any 1h overlaps at most 2 periods, so holds at most 2 charges \(1 for a unit active "
                    r"in every window, charged 1d apart\), at most 4 epsilon, .*the limit affords 5 charges.*: "
                    r"this query alone never excludes a unit; 4 other queries of namespace users draw on the same "
                    r"limit: see the namespace's lines")
    assert not any(re.search(r"\d+ of \d+ periods", line) for line in lines)

    # hierarchy: split [1, 1, 2] of epsilon 0.5, finest level twice the coarser ones' epsilon
    lines = blocks["visits_by_place"]
    levels = [_one(lines, rf"hierarchy level {i} \({names}\): epsilon {NUM}, count scale {NUM} \(±{NUM}\) at 95% "
                          r"before consistency; levels made consistent by weighted least squares .*")
              for i, names in enumerate(["country", "country, region", "country, region, city"])]
    epsilons, scales = ([_number(m.group(k)) for m in levels] for k in (1, 2))
    assert sum(epsilons) == pytest.approx(0.5, rel=1e-6) and epsilons == pytest.approx([0.125, 0.125, 0.25], rel=1e-6)
    assert scales[2] < scales[0] == scales[1]

    # top_k: epsilon x scale = k x max_events_per_group; the lead resolved at 95% among the 3 public groups
    m = _one(blocks["top_pages"], rf"top_k: k=2, permute-and-flip over the 3 public groups, scale {NUM}, "
                                  rf"epsilon {NUM} \(k x max_events_per_group / scale\); the top group is ranked first "
                                  rf"with 95% probability when it leads every other by {NUM} events \(.*\)")
    scale, epsilon, lead = (_number(x) for x in m.groups())
    assert scale * epsilon == pytest.approx(2 * 2, rel=1e-3)
    _check_top_k_lead(lead / scale, 3, draws=200_000)

    # quantiles: the rank errors the records state (97.5%: the query counts, so 2.5% sizes the group)
    m = _one(blocks["value_quantiles"], r"quantiles: \[0\.25, 0\.5, 0\.75\], exponential mechanism over 101 bin "
                                        rf"edges in \[0, 200\], epsilon {NUM} .*with 97\.5% probability each is "
                                        r"within \[(.*)\] ranks \(events\) of the true quantile.*")
    printed = [_number(x) for x in m.group(2).split(", ")]
    assert printed == pytest.approx(_stated_rank_errors(build_plan(config.query("value_quantiles"))), rel=1e-3)

    # value intervals: a histogram noised at max_groups_per_unit x max_events_per_group / epsilon_h, epsilon_h
    # the half of the quantiles' share (2 / 2 components / 2 = 0.5) the README gives it
    m = _one(blocks["value_quantiles"], rf"quantiles value_interval: a noisy histogram of each group \(discrete "
                                        rf"Laplace of scale {NUM} on each of its 100 bins, epsilon {NUM}, .*"
                                        r"w = \[(.*)\], plus a bin")
    assert _number(m.group(1)) == pytest.approx(3 * 1 / 0.5, rel=1e-3)
    assert _number(m.group(2)) <= 0.5
    assert len(m.group(3).split(", ")) == 3  # one reach per q

    # staircase: its std below Laplace's at the same epsilon (0.5 per group, where the two are close)
    for name in ("count", "sum"):
        m = _one(blocks["session_minutes"], rf"staircase {name}: epsilon 0\.5 per group, stairs of {NUM} with gamma "
                                            rf"{NUM}; std {NUM}, mean \|error\| {NUM} vs {NUM} and {NUM} with "
                                            rf"Laplace at the same epsilon \(std x{NUM}\)")
        std, laplace_std, ratio = _number(m.group(3)), _number(m.group(5)), _number(m.group(7))
        assert 0.5 < ratio < 1 and std / laplace_std == pytest.approx(ratio, rel=0.01)
        assert _number(m.group(4)) < _number(m.group(6))

    # vectors: l2 sensitivity sqrt(2 L0) C and sqrt(3 L0) C^2; errors shrink as 1 / units, and grow by up to
    # sqrt(2) (a mean coordinate) and sqrt(6) (a covariance entry) for a mean at norm C (tests/cli/test_plan_options.py)
    m = _one(blocks["sensor_means"], rf"mean_vector: 2 fields \['temp_c', 'humidity'\] clipped to l2 norm C=25 "
                                     rf".*; l2 sensitivity {NUM}, noise sd {NUM} per coordinate, epsilon 0\.5 at "
                                     rf"delta 1e-06 .*: a mean coordinate 100 units ±{NUM} up to ±{NUM}, 10,000 units "
                                     rf"±{NUM} up to ±{NUM}, 1,000,000 units ±{NUM} up to ±{NUM}")
    assert _number(m.group(1)) == pytest.approx(2**0.5 * 25, rel=0.01)
    assert _number(m.group(3)) / _number(m.group(5)) == pytest.approx(100, rel=0.01)
    assert _number(m.group(3)) == pytest.approx(1.96 * _number(m.group(2)) / 100, rel=0.01)
    assert _number(m.group(4)) / _number(m.group(3)) == pytest.approx(2**0.5, rel=0.01)
    m = _one(blocks["sensor_covariance"], rf"covariance: 3 fields \['accel_x', 'accel_y', 'accel_z'\] clipped to "
                                          rf"l2 norm C=5 .*; l2 sensitivity {NUM}, noise sd {NUM} per coordinate, "
                                          rf"epsilon 1\.5 at delta 1e-06 .*: a covariance entry 100 units ±{NUM} up to "
                                          rf"±{NUM}, .*; a mean coordinate 100 units ±{NUM} up to ±{NUM}, .*")
    assert _number(m.group(1)) == pytest.approx(3**0.5 * 5**2, rel=0.01)
    assert _number(m.group(3)) / _number(m.group(5)) == pytest.approx(5, rel=0.01)  # entry / mean coordinate = C
    assert _number(m.group(4)) / _number(m.group(3)) == pytest.approx(6**0.5, rel=0.01)
    assert _number(m.group(6)) / _number(m.group(5)) == pytest.approx(2**0.5, rel=0.01)

    # sample-and-aggregate: Laplace scale L0 (hi - lo) / epsilon; the mean's 95% half-width scale ln(20) / blocks
    m = _one(blocks["sensor_median_temp"], r"sample_aggregate: statistics:median of field 'temp_c' on each of 50 blocks of "
                                           r"units \(keyed hash\), outputs clipped to \[0, 20\] \(a failed block "
                                           rf"counts as 10\), laplace noise of scale {NUM} on their sum; the released "
                                           rf"mean over blocks is within ±{NUM} of the blocks' mean at 95%; epsilon 1")
    assert _number(m.group(1)) == pytest.approx(20 / 1.0, rel=1e-3)
    assert _number(m.group(2)) == pytest.approx(20 * math.log(20) / 50, rel=0.01)
    m = _one(blocks["sensor_median_temp"], rf"sample_aggregate release time: at worst \(every block running out its "
                                           rf"0\.2 s timeout\) {NUM} s per window \(2 groups\); typically .*")
    assert _number(m.group(1)) == pytest.approx(2 * 50 * 0.2)  # groups x blocks x timeout: one block after another

    # local DP: named by its trust model, not the unused `mechanism: laplace`; p / q = e^epsilon
    lines = blocks["browsers_local"]
    assert "local trust model: krr" in lines[0] and "laplace" not in lines[0]
    m = _one(lines, r"local_dp: k-ary randomized response \(krr\) over 5 values at epsilon 2 per report, applied by "
                    rf"the producer .*; p={NUM}, q={NUM}; no central noise; .*: 100 reports ±{NUM}, 10,000 reports "
                    rf"±{NUM}, .*")
    p, q = _number(m.group(1)), _number(m.group(2))
    assert p / q == pytest.approx(math.exp(2), rel=0.01) and p + 4 * q == pytest.approx(1, rel=0.01)
    assert _number(m.group(4)) / _number(m.group(3)) == pytest.approx(10, rel=0.01)  # sqrt(reports)
    assert not any(line.startswith("noise scale: count") for line in lines)


def test_plan_of_a_local_query_states_its_accuracy_per_number_of_reports(capsys):
    """A local query's estimate of a value's count has the error of the window's number of reports, not of the
    value's count: k-ary randomized response over k values at epsilon (p = e^eps / (e^eps + k - 1), q = 1 /
    (e^eps + k - 1)) estimates a value of true frequency f among n reports with variance
    (f p (1 - p) + (n - f) q (1 - q)) / (p - q)^2 (binomial counts of the reports naming it, debiased). A table under "true count" read a value counted 100 times among
    10,000 reports as ±16.7 (the error at 100 reports) where it is about ±167."""
    from stream_dp.config import load_config

    config = load_config(EXAMPLE)
    query = config.query("browsers_local")
    k, eps = len(query.groups.public), query.local_dp.epsilon
    p, q = math.exp(eps) / (math.exp(eps) + k - 1), 1 / (math.exp(eps) + k - 1)

    def half_width(n: int, f: int) -> float:
        return 1.96 * math.sqrt((f * p * (1 - p) + (n - f) * q * (1 - q)) / (p - q) ** 2)

    lines = _plan_blocks([str(EXAMPLE)], capsys)["browsers_local"]
    assert not any("true count" in line for line in lines), lines
    m = _one(lines, rf"local_dp: .*: 100 reports ±{NUM}, 10,000 reports ±{NUM}, .*")
    assert _number(m.group(2)) == pytest.approx(max(half_width(10_000, 0), half_width(10_000, 10_000)), rel=1e-2)
    assert _number(m.group(2)) > 9 * half_width(100, 100)  # a value counted 100 times among 10,000 reports

    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    (local,) = [p for p in json.loads(capsys.readouterr().out)["queries"] if p["query"] == "browsers_local"]
    assert all("count" not in a for a in local["accuracy"]), local["accuracy"]
    for a in local["accuracy"]:
        n = int(a["reports"])
        assert a["count_ci95"] == pytest.approx(max(half_width(n, 0), half_width(n, n)), rel=1e-9)


def _leader_first(lead_over_scale: float, candidates: int) -> float:
    """The exact probability that permute-and-flip's first pick is the leader when its ``candidates - 1``
    rivals all trail it by ``lead`` (the worst case for a given lead: a rival further back is accepted
    less often). Visited in a uniformly random order, the leader's coin always comes up and a rival's with
    ``p = exp(-lead / scale)``: the leader is picked iff the ``j`` rivals before it (``j`` uniform in
    ``0 .. m - 1``) all fail, so the probability is ``(1 / m) sum_j (1 - p)^j = (1 - (1 - p)^m) / (m p)``."""
    p, m = math.exp(-lead_over_scale), candidates
    return (1 - (1 - p) ** m) / (m * p)


def _check_top_k_lead(lead_over_scale: float, candidates: int, draws: int | None = None) -> None:
    """The lead ``plan`` prints makes the leader rank first with probability 95% or more, and is not more
    than one noise scale above the lead that does (a union bound is allowed some slack, not a lot)."""
    assert _leader_first(lead_over_scale, candidates) >= 0.95
    assert _leader_first(lead_over_scale - 1, candidates) < 0.95
    if draws:
        # the same law drawn another way, with a fixed seed: report-noisy-max with exponential noise (Ding et
        # al. 2021: identical to permute-and-flip); the standard error is below 0.0013 at these draws
        rng = np.random.default_rng(20261126)
        noisy = rng.exponential(size=(draws, candidates))
        noisy[:, 0] += lead_over_scale
        observed = float(np.mean(noisy.argmax(axis=1) == 0))
        assert observed == pytest.approx(_leader_first(lead_over_scale, candidates), abs=0.006)
        assert observed >= 0.95


def test_plan_states_what_top_k_over_selected_groups_spends_and_resolves(tmp_path, capsys):
    # the example's top_pages with its groups selected instead of listed
    text = EXAMPLE.read_text()
    head, name, rest = text.partition("  - name: top_pages")
    assert 'public: ["/", "/pricing", "/docs"]' in rest.split("  - name:")[0]  # top_pages's own groups
    selecting = tmp_path / "top_selected.yaml"
    selecting.write_text(head + name + rest.replace('public: ["/", "/pricing", "/docs"]', "select: {delta: 1.0e-6}", 1))
    from stream_dp.config import load_config
    from stream_dp.worker.query.costs import build_plan

    plan = build_plan(load_config(selecting).query("top_pages"))
    m = _one(_plan_blocks([str(selecting)], capsys)["top_pages"],
             rf"top_k: k=2, permute-and-flip over the groups partition selection releases each window \(the window "
             rf"also spends the selection's delta {NUM}\), scale {NUM}, epsilon {NUM} \(k x max_events_per_group / "
             rf"scale\); the top group is ranked first with 95% probability when it leads every other by {NUM} / "
             rf"{NUM} / {NUM} events among 10 / 1,000 / 100,000 released groups \(.*\)")
    delta, scale, epsilon, *leads = (_number(x) for x in m.groups())
    # the selection's delta is the window's whole delta here (Laplace noise), as the records' privacy.delta
    assert delta == pytest.approx(plan.loss.delta, rel=1e-2) and 0 < delta <= 1e-6
    # selection, count and top_k share epsilon 0.5: top_k's 1/3 at scale k Linf / epsilon = 2 * 2 / (0.5 / 3)
    assert epsilon == pytest.approx(0.5 / 3, rel=1e-3) and scale == pytest.approx(24, rel=1e-3)
    for lead, candidates, draws in zip(leads, (10, 1_000, 100_000), (200_000, 20_000, None), strict=True):
        _check_top_k_lead(lead / scale, candidates, draws)


def _stated_rank_errors(plan) -> list[float]:
    """The rank errors a worker's quantiles records carry for ``plan`` (three public groups)."""
    from stream_dp.dp import OpenDPNoise
    from stream_dp.worker.release.build import _quantile_fragments

    noise = OpenDPNoise()
    counts = np.array([5, 50, 500], dtype=np.int64)
    noisy = plan.release(counts, None, None, noise)
    histogram = np.zeros((3, plan.quantiles.bins), dtype=np.int64)
    histogram[:, 10] = counts
    window = SimpleNamespace(histogram=histogram, groups=[("/",), ("/pricing",), ("/docs",)])
    fragment = _quantile_fragments(plan, window, noisy, np.arange(3), noise)[0]
    stated = json.loads(fragment.removeprefix(b',"quantiles":'))
    assert all(entry["q_interval"] is not None for entry in stated.values())  # sized by the noisy count
    return [entry["rank_error"] for entry in stated.values()]


def test_plan_states_what_a_continual_query_charges_per_horizon(tmp_path, capsys):
    # 6 per period against 10 per 1h: one charge fits a horizon, two (a unit first seen at the end of one
    # period and at the start of the next) do not; a unit active in every window is charged a day apart.
    tight = tmp_path / "tight.yaml"
    text = EXAMPLE.read_text()
    assert text.count("epsilon: 2.0                        # per unit per period") == 1
    tight.write_text(text.replace("epsilon: 2.0                        # per unit per period",
                                  "epsilon: 6.0                        # per unit per period"))
    assert main(["plan", str(tight), "--json"]) == 0
    plan = next(p for p in json.loads(capsys.readouterr().out)["queries"] if p["query"] == "pageviews_today")
    assert plan["charged_per"] == "period" and plan["period"] == "1d"
    hour, day = plan["horizons"]
    assert hour["horizon_shorter_than_period"] and not day["horizon_shorter_than_period"]
    assert (hour["periods_overlapped"], hour["charges_affordable"]) == (2, 1)
    assert hour["some_unit_excluded"] and not hour["fully_active_unit_excluded"]
    assert hour["any_unit_spends_at_most"]["epsilon"] == pytest.approx(6, rel=1e-6)
    # 30 per 1d affords 5 charges; a 1d horizon overlaps 2 periods, its bucket runs (26h) 3
    assert (day["periods_overlapped"], day["charges_affordable"], day["charges_in_bucket_run"]) == (2, 5, 3)
    assert not day["some_unit_excluded"]
    assert day["any_unit_spends_at_most"]["epsilon"] == pytest.approx(12, rel=1e-6)
    assert plan["continual"]["tree_better"] == {"better_from": 1_280, "first_better": 256}
    blocks = _plan_blocks([str(tight)], capsys)
    _one(blocks["pageviews_today"], r"10 \(delta 1e-05\) per 1h, shorter than the 1d period: .*the limit affords 1 "
                                    r"charges.*: a unit active in every window is never excluded by this query "
                                    r"alone; one charged for more periods within a run is left out .*")


def test_run_without_secret_explains_how_to_set_it(monkeypatch, capsys):
    monkeypatch.delenv("STREAM_DP_CONTRIBUTION_SECRET", raising=False)
    assert main(["run", "--config", str(EXAMPLE)]) == 1
    assert "STREAM_DP_CONTRIBUTION_SECRET is not set" in capsys.readouterr().err


def test_produce_with_an_unknown_query_lists_the_queries(monkeypatch, capsys):
    from stream_dp.cli import produce

    monkeypatch.setattr(produce, "_send", lambda *a, **k: pytest.fail("sent events of no query"))
    assert main(["produce", "--topic", "t", "--synthetic", "10", "--config", str(EXAMPLE), "--query", "nosuch"]) == 1
    err = capsys.readouterr().err
    # one plain line, not a KeyError's quoted repr
    assert err.startswith(f"{EXAMPLE}: no query named 'nosuch'; --query takes one of: pageviews_by_page, top_pages, "), err
    assert err.count("\n") == 1 and not err.startswith('"')


def test_produce_synthetic_is_keyed_by_unit_and_uses_the_query_fields(kafka_bootstrap, new_topic, monkeypatch):
    topic = new_topic("events", partitions=2)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["produce", "--topic", topic, "--synthetic", "500", "--units", "20", "--config", str(EXAMPLE),
                 "--query", "pageviews_by_page", "--quiet"]) == 0
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    events = [(m.key, m.partition, orjson.loads(m.value)) for m in consumer]
    consumer.close()
    assert len(events) == 500
    partition_of_unit = {}
    for key, partition, event in events:
        assert key == event["user_id"].encode()
        assert event["page"] in {"/", "/pricing", "/docs"}
        assert partition_of_unit.setdefault(key, partition) == partition  # all of a unit's events in one partition
    times = [e["ts"] for _, _, e in events]
    assert max(times) - min(times) == pytest.approx(499, abs=1)


def test_tail_prints_release_records(kafka_bootstrap, new_topic, monkeypatch, capsys):
    from kafka import KafkaProducer

    topic = new_topic("releases")
    record = {
        "release_id": "q:0:ab", "query": "q", "window": {"start": "2026-01-01T00:00:00.000Z", "end": "x", "start_ms": 0, "end_ms": 1},
        "group": {"page": "/docs"}, "count": 12, "sum": 3.5, "mean": 0.29, "ci95": {"count": 4.0, "sum": 2.0, "mean": 1.0},
        "std": {"count": 1.0, "sum": 1.0}, "privacy": {"epsilon": 0.1}, "released_at_ms": 1, "released_at": "x",
    }
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send(topic, orjson.dumps(record))
    producer.flush()
    producer.close()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["tail", "--topic", topic, "--from-beginning", "--max", "1", "--timeout", "20"]) == 0
    out = capsys.readouterr().out
    assert format_row(record) in out and "/docs" in out


def test_tail_of_several_topics_prints_each_ones_first_windows_together(kafka_bootstrap, new_topic, monkeypatch,
                                                                        capsys):
    from kafka import KafkaProducer

    def record(query: str, start_ms: int, page: str) -> dict:
        return {"release_id": f"{query}:{start_ms}:{page}", "query": query,
                "window": {"start": "x", "end": "y", "start_ms": start_ms, "end_ms": start_ms + 30_000},
                "group": {"page": page}, "count": start_ms // 30_000, "sum": None, "mean": None,
                "ci95": {"count": 1.0, "sum": None, "mean": None}, "std": {"count": 1.0, "sum": None},
                "privacy": {"epsilon": 0.5}, "released_at_ms": 1, "released_at": "x"}

    full, short = new_topic("full"), new_topic("short")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for start in (30_000, 60_000, 90_000):  # three windows of two groups
        for page in ("/a", "/b"):
            producer.send(full, orjson.dumps(record("q1", start, page)))
    producer.send(short, orjson.dumps(record("q2", 30_000, "/a")))  # one window only
    producer.flush()
    producer.close()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["tail", "--topic", short, "--topic", full, "--from-beginning", "--windows", "2",
                 "--max-seconds", "15"]) == 0
    out = capsys.readouterr().out
    # the complete topic first, with its first two windows and not the third; the other once the time is up
    assert out.index(f"releases on {full} (2 windows, ") < out.index(f"releases on {short} (1 window, of the 2 "
                                                                      "asked for, within the time, ")
    assert sum("/a" in line or "/b" in line for line in out.splitlines() if not line.startswith("releases")) == 5
    assert format_row(record("q1", 60_000, "/b")) in out and format_row(record("q1", 90_000, "/a")) not in out
    assert format_row(record("q2", 30_000, "/a")) in out
    assert main(["tail", "--topic", short, "--topic", full]) == 2
    assert "several --topic need --windows N" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["ok_quantiles_without_a_count", "ok_top_k_over_selected_groups_without_a_count",
                                  "ok_local_dp_without_the_querys_epsilon"])
def test_plan_of_a_query_leaving_out_a_setting_is_the_plan_of_it_written_out(name, tmp_path, capsys):
    path = ROOT / "tests" / "config" / "corpus" / f"{name}.yaml"
    config = written_out(yaml.safe_load(path.read_text()))
    written = config["queries"][0]
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text(yaml.safe_dump(config))
    for form in ([], ["--json"]):
        assert main(["plan", str(path), *form]) == 0
        implicit_out = capsys.readouterr().out
        assert main(["plan", str(explicit), *form]) == 0
        assert implicit_out == capsys.readouterr().out
    if "local_dp" not in written:  # the count is planned as any count: its scale and its accuracy table
        lines = _plan_blocks([str(path)], capsys)[written["name"]]
        assert any(line.startswith("noise scale: count ") and not line.startswith("noise scale: count -")
                   for line in lines), lines
        assert "true count  count ±95%   sum ±95%  mean ±95%" in lines


def test_plan_names_geometric_as_written_and_states_laplace_as_records_do(tmp_path, capsys):
    config = yaml.safe_load(EXAMPLE.read_text())
    config["queries"][0]["mechanism"] = "geometric"
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(config))
    header = _plan_blocks([str(path)], capsys)["pageviews_by_page"][0]
    assert header == ("query pageviews_by_page (30s windows, geometric (the discrete Laplace, released as laplace), "
                      "namespace users)")
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["queries"][0]
    assert (plan["mechanism"], plan["mechanism_written"]) == ("laplace", "geometric")


@pytest.mark.parametrize("command", ["plan", "check-config"])
def test_plan_and_check_config_say_whose_clock_closes_each_querys_windows(command, tmp_path, capsys):
    """What the worker checks of the input topic at start (neither command reaches the broker)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    queries = [q for q in document["queries"] if q["input_topic"] == "events.pageviews"]
    for query in queries:
        query["trust_producer_timestamps"] = True  # queries of one topic trust alike
    trusting = tmp_path / "trusting.yaml"
    trusting.write_text(yaml.safe_dump(document))
    for path, trusted in ((EXAMPLE, False), (trusting, True)):
        assert main([command, str(path)]) == 0
        lines = [line.strip() for line in capsys.readouterr().out.splitlines() if "window clock:" in line]
        assert len(lines) == len(document["queries"])
        broker = ("window clock: the broker's record timestamps (LogAppendTime) of events.pageviews; at start the "
                  "worker refuses the topic if its producers stamp it (CreateTime), and creates it with "
                  "message.timestamp.type=LogAppendTime if it does not exist")
        producers = ("window clock: the producers' record timestamps of events.pageviews (trust_producer_timestamps: "
                     "true): a time counts once records of 16 distinct keys are stamped at it or later, none stamped 0 "
                     "or less; the broker's stamps where it sets them (docs/privacy/clock.md)")
        assert lines.count(producers if trusted else broker) == len(queries), lines
    assert main(["plan", str(trusting), "--json"]) == 0
    plans = {p["query"]: p for p in json.loads(capsys.readouterr().out)["queries"]}
    assert plans[queries[0]["name"]]["window_clock"].startswith("window clock: the producers' record timestamps")


def test_produce_creates_a_missing_topic_as_input_topics_are_to_be_created(kafka_bootstrap, unique_name, monkeypatch,
                                                                            capsys):
    from kafka.admin import KafkaAdminClient

    from stream_dp.worker.kafka.admin import describe_topics

    topic = f"{unique_name}-events"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    try:
        assert main(["produce", "--topic", topic, "--synthetic", "50", "--units", "5", "--quiet"]) == 0
        err = capsys.readouterr().err
        assert f"created topic {topic} with message.timestamp.type=LogAppendTime" in err
        # events dated back from now, which the broker's stamps make late once a worker read past them
        assert "no --rate" in err and "trust_producer_timestamps: true" in err
        state = describe_topics({"bootstrap_servers": kafka_bootstrap}, [topic], ("message.timestamp.type",))[topic]
        assert state.configs == {"message.timestamp.type": "LogAppendTime"}
        assert main(["produce", "--topic", topic, "--synthetic", "5", "--units", "5", "--rate", "1000", "--quiet"]) == 0
        assert "created topic" not in capsys.readouterr().err  # it exists now; live events need no warning
    finally:
        admin.delete_topics([topic])
        admin.close()
