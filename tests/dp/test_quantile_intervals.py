"""Value intervals of quantiles (``value_interval: true``): the band, the coverage, the edges picked.

References independent of the code: the noise of the band is simulated with
numpy's own geometric sampler (a discrete Laplace is the difference of two
geometric variables), and the quantile an interval must hold is numpy's
``inverted_cdf`` quantile of the raw values.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from stream_dp.dp.bounds import ContributionBounds
from stream_dp.dp.histogram import HistogramSpec
from stream_dp.dp.quantile_intervals import CONFIDENCE, ValueIntervalPlan, band_widths, tail_bound
from stream_dp.dp.quantiles import QuantilesPlan
from stream_dp.dp.vectorised_noise import VectorisedExactNoise

# A test fails when an observed rate is above its bound by more than Z standard errors: a sound
# implementation fails by chance with probability below 1e-6 per assertion.
Z = 5.0


def _discrete_laplace(rng: np.random.Generator, scale: float, shape: tuple[int, ...]) -> np.ndarray:
    # P(z) ~ exp(-|z| / scale): G1 - G2 with G geometric of success 1 - e^(-1/scale) (numpy's start at 1)
    success = -math.expm1(-1.0 / scale)
    return rng.geometric(success, shape) - rng.geometric(success, shape)


def _histogram(values: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """The group's histogram as the worker bins it at ingest."""
    return np.bincount(HistogramSpec(bins, lo, hi).bin_of(values), minlength=bins)


class _NoNoise:
    def integers(self, values, *, kind, scale):
        return np.asarray(values, dtype=np.int64)


@pytest.mark.parametrize("q", [0.5, 0.9])
def test_the_band_holds_the_simulated_noise_at_every_edge_at_once(q):
    bins, scale = 16, 3.0
    band = band_widths(q, bins, scale, 1.0 - CONFIDENCE)
    rng = np.random.default_rng(7)
    trials = 20_000
    noise = _discrete_laplace(rng, scale, (trials, bins))
    below = np.cumsum(noise, axis=1)
    above = below[:, -1:] - below
    deviation = np.abs((1 - q) * below - q * above)  # D'_j - D_j for j = 1..bins
    outside_any = np.mean((deviation >= band).any(axis=1))
    beta = 1.0 - CONFIDENCE
    assert outside_any <= beta + Z * math.sqrt(beta * (1 - beta) / trials), outside_any
    # each edge's own tail stays within Chernoff's bound, which the band puts at beta / bins
    for j in (1, bins // 2, bins):
        bound = tail_bound(float(band[j - 1]), q, j, bins, scale)
        assert bound <= beta / bins * (1 + 1e-9)
        rate = np.mean(deviation[:, j - 1] >= band[j - 1])
        assert rate <= bound + Z * math.sqrt(bound * (1 - bound) / trials) + 1 / trials


def test_a_band_three_times_too_narrow_is_caught_by_the_simulation():
    bins, scale, q = 16, 3.0, 0.5
    band = band_widths(q, bins, scale, 1.0 - CONFIDENCE) / 3
    rng = np.random.default_rng(8)
    noise = _discrete_laplace(rng, scale, (20_000, bins))
    below = np.cumsum(noise, axis=1)
    deviation = np.abs((1 - q) * below - q * (below[:, -1:] - below))
    assert np.mean((deviation >= band).any(axis=1)) > 0.2


def test_without_noise_the_interval_is_the_tightest_pair_of_edges_around_the_quantile():
    edges = np.linspace(0.0, 10.0, 11)
    rng = np.random.default_rng(3)
    # levels exact in binary, so that a tie L_j = q n is one in floats too
    plan = ValueIntervalPlan.build(epsilon=1.0, q=(0.25, 0.5, 0.875), edges=edges,
                                   bounds=ContributionBounds(1, 1))
    plan = replace(plan, band=np.zeros_like(plan.band))  # no noise, no band
    for _ in range(200):
        values = rng.uniform(0, 10, size=rng.integers(1, 40))
        got = plan.intervals(_histogram(values, 0.0, 10.0, 10)[None, :], _NoNoise())[0]
        for i, q in enumerate(plan.q):
            x = np.quantile(values, q, method="inverted_cdf")
            bin_of_x = min(9, int(math.floor(x)))
            assert got[i].tolist() == [edges[bin_of_x], edges[bin_of_x + 1]], (values, q, got[i])


@pytest.mark.parametrize(("lo", "hi", "bins"), [(0.0, 1.0, 10), (0.1, 0.7, 49), (-20.0, 50.0, 64), (0.0, 500.0, 256)])
def test_values_on_the_edges_are_held_by_the_interval_of_their_own_quantile(lo, hi, bins):
    """Values exactly on an edge (or a float step either side), binned by the worker: with no noise the
    interval still holds numpy's quantile. Edges not exact in binary (0.3 of [0, 1]) once fell a bin off."""
    plan = QuantilesPlan.build(epsilon=1.0, q=[0.25, 0.5, 0.875], lo=lo, hi=hi, bins=bins,
                               bounds=ContributionBounds(1, 1), value_interval=True)
    interval = replace(plan.interval, band=np.zeros_like(plan.interval.band))
    edges = plan.candidates
    near = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)]).clip(lo, hi)
    rng = np.random.default_rng(5)
    for values in [np.full(50, x) for x in near[:: max(1, len(near) // 60)]] + [
            rng.choice(near, size=rng.integers(1, 30)) for _ in range(200)]:
        got = interval.intervals(_histogram(values, lo, hi, bins)[None, :], _NoNoise())[0]
        for i, q in enumerate(plan.q):
            x = np.quantile(values, q, method="inverted_cdf")
            assert got[i, 0] <= x <= got[i, 1], (values[:5], q, got[i], x)


def _groups(rng: np.random.Generator) -> list[np.ndarray]:
    """Groups of every shape: spread, skewed, one crowded bin, two spikes, a handful of values."""
    groups = []
    for n in (5, 40, 300, 3000):
        groups += [rng.uniform(0, 100, n), np.minimum(rng.exponential(8, n), 100), np.full(n, 42.3),
                   np.where(rng.random(n) < 0.7, 10.1, 88.8), np.concatenate([rng.normal(50, 1, n), [0, 100]])]
    return groups


def _coverage(plan: QuantilesPlan, groups: list[np.ndarray], rounds: int) -> tuple[int, int]:
    counts = np.stack([_histogram(v, plan.lo, plan.hi, plan.bins) for v in groups])
    truth = np.array([[np.quantile(v, q, method="inverted_cdf") for q in plan.q] for v in groups])
    noise = VectorisedExactNoise()
    held = total = 0
    for _ in range(rounds):
        released = plan.release(counts, noise)
        ci = released.value_ci95
        held += int(np.sum((ci[..., 0] <= truth) & (truth <= ci[..., 1])))
        total += truth.size
    return held, total


def test_value_intervals_hold_the_true_quantile_at_least_95_percent_of_the_time():
    plan = QuantilesPlan.build(epsilon=2.0, q=[0.1, 0.5, 0.9], lo=0.0, hi=100.0, bins=64,
                               bounds=ContributionBounds(2, 3), value_interval=True)
    held, total = _coverage(plan, _groups(np.random.default_rng(11)), rounds=60)
    rate, beta = held / total, 1.0 - CONFIDENCE
    assert rate >= CONFIDENCE - Z * math.sqrt(beta * CONFIDENCE / total), (held, total)


def test_intervals_from_a_band_four_times_too_narrow_miss_too_often():
    plan = QuantilesPlan.build(epsilon=2.0, q=[0.1, 0.5, 0.9], lo=0.0, hi=100.0, bins=64,
                               bounds=ContributionBounds(2, 3), value_interval=True)
    doctored = replace(plan, interval=replace(plan.interval, band=plan.interval.band / 4))
    held, total = _coverage(doctored, _groups(np.random.default_rng(11)), rounds=60)
    assert held / total < CONFIDENCE, (held, total)


def test_the_histogram_is_calibrated_to_half_the_share_and_certified_by_opendp():
    bounds = ContributionBounds(3, 2)
    plan = QuantilesPlan.build(epsilon=1.0, q=[0.5], lo=0.0, hi=1.0, bins=8, bounds=bounds, value_interval=True)
    without = QuantilesPlan.build(epsilon=0.5, q=[0.5], lo=0.0, hi=1.0, bins=8, bounds=bounds)
    # a unit moves at most max_events_per_group values in each of max_groups_per_unit groups, one bin each
    assert plan.interval.scale == pytest.approx(3 * 2 / 0.5, rel=1e-6)
    assert plan.interval.loss.epsilon <= 0.5
    assert plan.scale == without.scale  # the draws get the other half
    assert plan.loss.epsilon <= 1.0
    assert plan.describe()["value_interval"]["kind"] == "noisy_histogram"
    assert without.describe()["value_interval"] is None
