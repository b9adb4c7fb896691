"""The errors ``stream-dp plan`` prints for vector aggregations, against the released statistics' actual errors.

Each check noises one group's feature sums with the production noise (OpenDP)
``DRAWS`` times and post-processes them as the worker does, at 1,000,000
units, where the PSD projection does not act and the first-order errors hold.
The empirical 95% quantile of ``|error|`` from 4,000 draws has a relative sd of
about 1.5%: the 10% tolerance against the reference is over 6 sd (failing by
chance with probability below 1e-9), and so is every bound (the nearest: at
0.8 C a mean coordinate's reference, sqrt(1.64) = 1.28, is 10% under the worst
case sqrt(2)).

``plan --json`` states the same errors: they are checked against the README's formulas from the
config alone (the largest rho of the aggregation's share, the l2 sensitivity, the worst-case factors).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.dp import OpenDPNoise
from stream_dp.dp.vectors import clip_l2

_NUM = r"[0-9.e+-]+"
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
UNITS = 1_000_000
DRAWS = 4000
NUM = r"(-?[\d,.]+(?:e[+-]\d+)?)"


def _printed(capsys, query: str) -> dict[str, tuple[float, float]]:
    """(near 0, worst) 95% half-widths at ``UNITS`` units that plan prints for ``query``'s vector aggregation."""
    assert main(["plan", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    block = out.split(f"query {query} ")[1].split("\nquery ")[0]
    (line,) = [line for line in block.splitlines() if re.match(r"\s*(mean_vector|covariance): ", line)]
    printed = {}
    for name, label in (("covariance", "a covariance entry"), ("mean", "a mean coordinate")):
        m = re.search(rf"{label} [^;]*1,000,000 units ±{NUM} up to ±{NUM}", line)
        if m:
            printed[name] = (float(m.group(1)), float(m.group(2)))
    return printed


def _reference_factor(name: str, vectors: np.ndarray, clip_norm: float) -> float:
    """First-order growth of the 95% error of the first field's covariance entry or mean coordinate over that of
    data near 0, from the units' clipped vectors: with ``r = mu/C`` and ``s = Sigma/C^2`` of that field, the
    noise on the entry, the cross term and the unit count enter as ``1, -2r, r^2 - s`` (``1, -r`` for a mean)."""
    x = clip_l2(vectors, clip_norm)[:, 0]
    r, s = x.mean() / clip_norm, x.var() / clip_norm**2
    if name == "mean":
        return float(np.sqrt(1 + r**2))
    return float(np.sqrt(1 + 4 * r**2 + (r**2 - s) ** 2))


@pytest.mark.parametrize(("query", "centre"), [("sensor_covariance", 0.0), ("sensor_covariance", 0.8),
                                               ("sensor_means", 0.0), ("sensor_means", 0.8)])
def test_printed_vector_errors_hold_for_a_mean_near_0_and_bound_a_mean_near_norm_c(query, centre, capsys):
    """A mean at 0.8 C along the first field: its errors match the first-order reference, stay within plan's
    worst case and exceed plan's near-0 figure by half (the covariance entry) or a tenth (a mean coordinate);
    centred, they match plan's near-0 figure."""
    from stream_dp.config import load_config
    from stream_dp.worker.query.costs import build_plan

    printed = _printed(capsys, query)
    plan = build_plan(load_config(EXAMPLE).query(query)).vector
    c = float(plan.features.clip_norm)
    rng = np.random.default_rng(7)
    vectors = rng.normal(0.0, 0.1 * c, (UNITS, plan.features.dimensions))
    vectors[:, 0] += centre * c
    sums = plan.features.group_sums(np.zeros(UNITS, dtype=np.int64), plan.features.of_means(vectors), 1)
    (clean,) = plan.rows(sums)
    released = plan.rows(plan.noisy(np.repeat(sums, DRAWS, axis=0), OpenDPNoise()))
    errors = {"mean": [r["mean"][0] - clean["mean"][0] for r in released]}
    if "covariance" in printed:
        errors["covariance"] = [r["covariance"][0][0] - clean["covariance"][0][0] for r in released]
    assert set(errors) == set(printed)
    for name, (near_0, worst) in printed.items():
        seen = float(np.quantile(np.abs(errors[name]), 0.95))
        assert seen == pytest.approx(near_0 * _reference_factor(name, vectors, c), rel=0.1), name
        assert seen <= worst, f"{name}: 95% |error| {seen:.4g} beyond the printed worst case {worst:.4g}"
        if centre:
            more = 1.5 if name == "covariance" else 1.1
            assert seen > more * near_0, f"{name}: 95% |error| {seen:.4g} not above {more} x {near_0:.4g}"


def _zcdp_delta(rho: float, epsilon: float) -> float:
    """The delta at ``epsilon`` that ``rho``-zCDP implies (Canonne, Kamath & Steinke 2020, Cor. 13):
    the least of ``exp((a - 1)(a rho - epsilon)) / (a - 1) * (1 - 1/a)^a`` over a dense grid of ``a > 1``."""
    a = 1.0 + np.logspace(-8, 8, 400_001)
    log = (a - 1) * (a * rho - epsilon) + a * np.log1p(-1 / a) - np.log(a - 1)
    return float(np.exp(log.min()))


def _largest_rho(epsilon: float, delta: float) -> float:
    """The largest rho whose (epsilon, delta) statement fits the budget (README: Gaussian budgets), by bisection."""
    lo, hi = 0.0, epsilon
    while _zcdp_delta(hi, epsilon) <= delta:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _zcdp_delta(mid, epsilon) <= delta else (lo, mid)
    return lo


@pytest.mark.parametrize("query", ["sensor_means", "sensor_covariance"])
def test_json_vector_errors_follow_the_gaussian_vector_mechanism(query, capsys):
    """``plan --json`` states a vector aggregation's 95% errors as the README derives them from the config alone:
    the aggregation's equal share of (epsilon, delta) as the largest rho that fits; l2 sensitivity
    ``sqrt(2 L0) C`` (mean_vector) or ``sqrt(3 L0) C^2`` (covariance); noise sd ``sigma = Delta_2 / sqrt(2 rho)``;
    near 0 ``z sigma / n`` for a mean vector's coordinate and a covariance entry and ``z sigma / (C n)`` for a
    covariance's mean coordinate, at worst ``sqrt(2)`` (a mean coordinate) and ``sqrt(6)`` (a covariance entry)
    times as much. The float grid adds about 1e-10 of the sensitivity: 1e-6 is the tolerance. The text line
    prints the same numbers (to its 3 significant digits)."""
    (config,) = [q for q in yaml.safe_load(EXAMPLE.read_text())["queries"] if q["name"] == query]
    kind = "mean_vector" if "mean_vector" in config["aggregations"] else "covariance"
    c = float(config["aggregations"][kind]["clip_norm"])
    l0 = config["bounds"]["max_groups_per_unit"]
    share = 1 / len(config["aggregations"])  # the count beside a covariance takes an equal share
    rho = _largest_rho(config["epsilon"] * share, config["delta"] * share)
    sensitivity = math.sqrt(2 * l0) * c if kind == "mean_vector" else math.sqrt(3 * l0) * c**2
    sigma = sensitivity / math.sqrt(2 * rho)
    z = NormalDist().inv_cdf(0.975)

    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    (stated,) = [p["vector"] for p in json.loads(capsys.readouterr().out)["queries"] if p["query"] == query]
    assert stated["aggregation"] == kind
    assert stated["l2_sensitivity"] == pytest.approx(sensitivity, rel=1e-12)
    assert stated["noise_sd"] == pytest.approx(sigma, rel=1e-6)
    assert [row["units"] for row in stated["ci95"]] == [100, 10_000, 1_000_000]
    for row in stated["ci95"]:
        n = row["units"]
        expected = {"mean_coordinate": (z * sigma / n / (1 if kind == "mean_vector" else c), math.sqrt(2))}
        if kind == "covariance":
            expected["covariance_entry"] = (z * sigma / n, math.sqrt(6))
        assert set(row) - {"units"} == set(expected)
        for name, (near_0, worst_factor) in expected.items():
            assert row[name]["near_0"] == pytest.approx(near_0, rel=1e-6), (n, name)
            assert row[name]["worst"] == pytest.approx(near_0 * worst_factor, rel=1e-6), (n, name)

    printed = _printed(capsys, query)
    (at_most,) = [row for row in stated["ci95"] if row["units"] == UNITS]
    for name, key in (("mean", "mean_coordinate"), ("covariance", "covariance_entry")):
        if key in at_most:
            assert printed[name] == pytest.approx((at_most[key]["near_0"], at_most[key]["worst"]), rel=5e-3)


def test_hierarchy_levels_state_their_sum_scale_when_the_query_sums(tmp_path, capsys):
    """Each level's sum noise is its own (half the level's share of epsilon, the count taking the other
    half): the line gives its scale, Δ/ε = 3 events x clip 100 / ε, and the Laplace 95% half-width,
    scale x ln(1/0.05)."""
    config = yaml.safe_load(EXAMPLE.read_text())
    query = next(q for q in config["queries"] if q["name"] == "visits_by_place")
    query["aggregations"] = {"count": {}, "sum": {"field": "value", "clip": [0, 100]}}
    config["queries"] = [query]
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["plan", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "hierarchy level" in line]
    assert len(lines) == 3
    for line, share in zip(lines, [1, 1, 2], strict=True):
        m = re.search(rf"epsilon ({_NUM}), count scale ({_NUM}) .*, sum scale ({_NUM}) \(±({_NUM})\)", line)
        assert m, line
        epsilon, count_scale, sum_scale, half = (float(x) for x in m.groups())
        assert epsilon == pytest.approx(0.5 * share / 4, rel=1e-6)  # split [1, 1, 2] of the query's 0.5
        # count and sum each take half the level's epsilon; the sum's sensitivity is 3 events x clip 100
        assert sum_scale == pytest.approx(count_scale * 100, rel=1e-3)
        assert half == pytest.approx(sum_scale * math.log(20), rel=2e-2)
