"""VectorisedExactNoise against OpenDP's own measurements: same rounding, same laws.

Statistical tests fail only below P_MIN = 1e-4 (about one false failure in
10,000 runs per test). Two-sample tests bin both samples on the same integer
bins and run a chi-square test of homogeneity.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp import OpenDPNoise
from stream_dp.dp.measurements import float_vector_measurement, integer_vector_measurement
from stream_dp.dp.vectorised_noise import (
    SPLIT_DRAW_MIN,
    VectorisedExactNoise,
    grid_to_floats,
    noise_source,
    round_to_grid,
)

P_MIN = 1e-4
OPENDP_DRAWS = 60_000  # OpenDP draws ~10 us each
DRAWS = 200_000


@pytest.fixture
def fast() -> VectorisedExactNoise:
    return VectorisedExactNoise()


def two_sample_p_value(first: np.ndarray, second: np.ndarray) -> float:
    """Chi-square homogeneity test on shared bins holding >= 10 pooled draws each (tails pooled)."""
    pooled = np.concatenate([first, second])
    edges = np.unique(np.quantile(pooled, np.linspace(0, 1, 41), method="lower"))
    table = np.array([np.bincount(np.searchsorted(edges[1:-1], s, side="right"), minlength=edges.size - 1)
                      for s in (first, second)])
    table = table[:, table.sum(axis=0) >= 10]
    return float(stats.chi2_contingency(table).pvalue)


@pytest.mark.parametrize("scale", [0.5, 3.7, 1e4])
def test_integer_noise_matches_opendp(fast: VectorisedExactNoise, scale: float) -> None:
    centre = np.full(OPENDP_DRAWS, 1_000, dtype=np.int64)
    ours = fast.integers(np.full(DRAWS, 1_000, dtype=np.int64), kind="laplace", scale=scale)
    theirs = np.asarray(integer_vector_measurement("laplace", scale)(centre), dtype=np.int64)
    assert ours.dtype == np.int64
    assert two_sample_p_value(ours, theirs) > P_MIN


def test_integer_noise_saturates_at_the_int64_bounds_as_opendp_does(fast: VectorisedExactNoise) -> None:
    top, bottom = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    ours = fast.integers(np.array([top] * 5000 + [bottom] * 5000, dtype=np.int64), kind="laplace", scale=2.0)
    assert ours[:5000].max() == top and ours[5000:].min() == bottom
    q = math.exp(-1 / 2.0)
    at_top = 1 - q / (1 + q)  # P(Z >= 0)
    assert stats.binomtest(int((ours[:5000] == top).sum()), 5000, at_top).pvalue > P_MIN
    assert stats.binomtest(int((ours[5000:] == bottom).sum()), 5000, at_top).pvalue > P_MIN


TRICKY = np.array([
    0.0, -0.0, 0.125, -0.125, 0.375, -0.375, 0.25, -0.25, 1.125, -1.125, 2.625, -2.625,
    np.nextafter(0.125, 0), np.nextafter(0.125, 1), np.nextafter(-0.125, 0), np.nextafter(-0.125, -1),
    123.456, -987.654321, 1e18 + 0.125 * 2**10, -(2.0**62), 2.0**62, 2.0**61 + 0.5, 1e300, -1e300,
    np.inf, -np.inf, 5e-324, -5e-324, np.finfo(np.float64).max, -np.finfo(np.float64).max,
])


@pytest.mark.parametrize("k", [-3, -30, 0, 7, -1000])
def test_float_rounding_is_opendps_when_the_noise_is_negligible(k: int) -> None:
    # scale 2^-40 on the grid: |noise| >= 1 has probability ~2 exp(-2^40)
    scale = math.ldexp(1.0, k - 40)
    fallback = RecordingFallback()
    halves = np.array([0.5, 1.5, 2.5, 1e6 + 0.5, 2.0**51 + 0.5])
    ties = np.ldexp(np.concatenate([halves, -halves]), k)
    values = np.concatenate([TRICKY, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    ours = VectorisedExactNoise(fallback=fallback).floats(values, kind="laplace", scale=scale, k=k)
    assert fallback.calls == []  # drawn by the vectorised path, not delegated
    theirs = np.asarray(float_vector_measurement("laplace", scale, k, values.size)(values), dtype=np.float64)
    assert ours.tobytes() == theirs.tobytes(), np.flatnonzero(ours != theirs)


def test_ties_round_toward_plus_infinity_and_back_to_even() -> None:
    indices, big = round_to_grid(np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999999999999994, -1e-300]), 0)
    assert indices.tolist() == [1, 0, 2, -1, 3, -2, 0, 0] and big == {}
    indices, big = round_to_grid(np.array([2.0**62, -(2.0**70), 1e300]), 0)
    assert big == {0: 2**62, 1: -(2**70), 2: int(1e300)}
    # 2^53 + 1 and 2^53 + 3 are halfway between floats: ties go to the even mantissa
    assert grid_to_floats(np.array([2**53 + 1, 2**53 + 3], dtype=np.int64), {}, 0).tolist() == [2.0**53, 2.0**53 + 4]
    assert grid_to_floats(np.array([3, 1], dtype=np.int64), {}, -1075).tolist() == [2 * 5e-324, 0.0]
    assert grid_to_floats(np.zeros(1, dtype=np.int64), {0: 1 << 1100}, 0).tolist() == [math.inf]


def test_float_noise_beyond_2_53_rounds_like_opendp(fast: VectorisedExactNoise) -> None:
    # on the integer grid at 2^53 every odd result is a tie between two floats
    centre = 2.0**53
    ours = fast.floats(np.full(DRAWS, centre), kind="laplace", scale=1.0, k=0) - centre
    theirs = np.asarray(float_vector_measurement("laplace", 1.0, 0, OPENDP_DRAWS)(np.full(OPENDP_DRAWS, centre))) - centre
    assert np.all(ours[ours > 0] % 2 == 0)  # above 2^53 floats are even: odd results were ties
    # 2^53 + 1 rounds to 2^53 (even mantissa): P(0) = p(0) + p(1), where rounding half up would give p(0)
    q = math.exp(-1)
    at_centre = (1 - q) / (1 + q) * (1 + q)
    assert stats.binomtest(int(np.count_nonzero(ours == 0.0)), DRAWS, at_centre).pvalue > P_MIN
    assert two_sample_p_value(ours, theirs) > P_MIN


@pytest.mark.parametrize(("scale", "k", "centre"), [(1.3, -2, 10.1), (0.4, -3, -7.3), (2.5, -40, 123.456)])
def test_float_noise_matches_opendp(fast: VectorisedExactNoise, scale: float, k: int, centre: float) -> None:
    ours = fast.floats(np.full(DRAWS, centre), kind="laplace", scale=scale, k=k)
    theirs = np.asarray(float_vector_measurement("laplace", scale, k, OPENDP_DRAWS)(np.full(OPENDP_DRAWS, centre)))
    grid = 2.0**k
    assert np.all(ours / grid == np.round(ours / grid))  # every output is on the grid
    assert two_sample_p_value(ours, theirs) > P_MIN


def test_float_noise_on_a_coarse_grid_follows_the_exact_law(fast: VectorisedExactNoise) -> None:
    scale, k, centre = 1.3, -2, 10.1  # 10.1 rounds to 10.0; grid scale 5.2
    steps = (fast.floats(np.full(DRAWS, centre), kind="laplace", scale=scale, k=k) - 10.0) / 0.25
    support = np.arange(-60, 61)
    q = math.exp(-1 / (scale * 4))
    expected = (1 - q) / (1 + q) * q ** np.abs(support)
    observed = np.array([np.count_nonzero(steps == z) for z in support])
    observed = np.append(observed, DRAWS - observed.sum())
    expected = np.append(expected, 1 - expected.sum()) * DRAWS
    assert stats.chisquare(observed, expected).pvalue > P_MIN


class RecordingFallback(OpenDPNoise):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def integers(self, values, *, kind, scale):  # type: ignore[no-untyped-def]
        self.calls.append(f"integers {kind} {scale}")
        return super().integers(values, kind=kind, scale=scale)

    def floats(self, values, *, kind, scale, k):  # type: ignore[no-untyped-def]
        self.calls.append(f"floats {kind} {scale} {k}")
        return super().floats(values, kind=kind, scale=scale, k=k)

    def top_k(self, scores, *, k, scale):  # type: ignore[no-untyped-def]
        self.calls.append(f"top_k {k} {scale}")
        return super().top_k(scores, k=k, scale=scale)


def test_gaussian_top_k_and_out_of_range_scales_go_to_opendp() -> None:
    fallback = RecordingFallback()
    noise = VectorisedExactNoise(fallback=fallback)
    noise.integers(np.zeros(3, dtype=np.int64), kind="gaussian", scale=2.0)
    noise.floats(np.zeros(3), kind="gaussian", scale=2.0, k=-30)
    noise.integers(np.zeros(3, dtype=np.int64), kind="laplace", scale=1e20)
    noise.floats(np.zeros(3), kind="laplace", scale=1e-30, k=0)
    assert noise.top_k(np.array([0, 10_000, 5], dtype=np.int64), k=1, scale=1.0).tolist() == [1]
    noise.integers(np.zeros(3, dtype=np.int64), kind="laplace", scale=2.0)
    assert fallback.calls == ["integers gaussian 2.0", "floats gaussian 2.0 -30", "integers laplace 1e+20",
                              "floats laplace 1e-30 0", "top_k 1 1.0"]


def test_shapes_dtypes_and_bad_input(fast: VectorisedExactNoise) -> None:
    assert fast.integers(np.arange(5), kind="laplace", scale=1.0).dtype == np.int64
    assert fast.floats(np.arange(5.0), kind="laplace", scale=1.0, k=-30).dtype == np.float64
    assert fast.integers(np.empty(0, dtype=np.int64), kind="laplace", scale=1.0).size == 0
    assert fast.floats(np.empty(0), kind="laplace", scale=1.0, k=-30).size == 0
    with pytest.raises(ValueError, match="flatten"):
        fast.integers(np.zeros((2, 2), dtype=np.int64), kind="laplace", scale=1.0)
    with pytest.raises(ValueError, match="NaN"):
        fast.floats(np.array([1.0, np.nan]), kind="laplace", scale=1.0, k=-30)


def test_noise_source_by_name() -> None:
    assert isinstance(noise_source("exact"), VectorisedExactNoise)
    assert type(noise_source("opendp")) is OpenDPNoise
    with pytest.raises(ValueError, match="exact, opendp"):
        noise_source("numpy")


class CountingExecutor(ThreadPoolExecutor):
    """Two threads that count the vectors handed to them."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.maps = 0

    def map(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.maps += 1
        return super().map(*args, **kwargs)


@pytest.mark.parametrize("scale", [0.9, 3.7])
def test_a_long_vector_drawn_in_two_halves_follows_the_exact_law_with_independent_halves(scale: float) -> None:
    """Each half against the exact discrete Laplace pmf ``(1 - q) / (1 + q) q^|z|``, ``q = exp(-1 / scale)``;
    the halves against each other: the share of positions where both halves drew the same value is the
    collision probability ``sum p(z)^2`` of two independent draws (a binomial test)."""
    executor = CountingExecutor()
    try:
        noise = VectorisedExactNoise(executor=executor).integers(np.zeros(DRAWS, dtype=np.int64), kind="laplace",
                                                                 scale=scale)
    finally:
        executor.shutdown()
    assert DRAWS >= SPLIT_DRAW_MIN and executor.maps == 1  # drawn in halves
    q = math.exp(-1 / scale)
    support = np.arange(-80, 81)
    pmf = (1 - q) / (1 + q) * q ** np.abs(support)
    half = DRAWS // 2
    for part in (noise[:half], noise[half:]):
        observed = np.array([np.count_nonzero(part == z) for z in support])
        keep = pmf * part.size >= 5  # chi-square needs expected counts of 5 or more: pool the tails
        observed = np.append(observed[keep], part.size - observed[keep].sum())
        expected = np.append(pmf[keep], 1 - pmf[keep].sum()) * part.size
        assert stats.chisquare(observed, expected).pvalue > P_MIN
    collisions = int(np.count_nonzero(noise[:half] == noise[half:]))
    assert stats.binomtest(collisions, half, float((pmf ** 2).sum())).pvalue > P_MIN
