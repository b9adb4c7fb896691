"""The errors ``stream-dp plan`` prints for vector aggregations, against the released statistics' actual errors.

Each check noises one group's feature sums with the production noise (OpenDP)
``DRAWS`` times and post-processes them as the worker does, at 1,000,000
units, where the PSD projection does not act and the first-order errors hold.
The empirical 95% quantile of ``|error|`` from 4,000 draws has a relative sd of
about 1.5%: the 10% tolerance against the reference is over 6 sd (failing by
chance with probability below 1e-9), and so is every bound (the nearest: at
0.8 C a mean coordinate's reference, sqrt(1.64) = 1.28, is 10% under the worst
case sqrt(2)).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

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
    from stream_dp.worker.query_costs import build_plan

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
        assert epsilon == pytest.approx(0.1 * share / 4, rel=1e-6)
        # count and sum each take half the level's epsilon; the sum's sensitivity is 3 events x clip 100
        assert sum_scale == pytest.approx(count_scale * 100, rel=1e-3)
        assert half == pytest.approx(sum_scale * math.log(20), rel=2e-2)
