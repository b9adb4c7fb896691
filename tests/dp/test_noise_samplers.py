"""OpenDP's samplers, as used through OpenDPNoise, against their theoretical laws.

Every test here compares 20,000 draws with the exact distribution and fails
only when the p-value is below P_MIN = 1e-4: with a correct sampler a test
fails about once in 10,000 runs, while a scale off by 20% or a shifted centre
gives p-values far below that at this sample size.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp import OpenDPNoise

P_MIN = 1e-4
DRAWS = 20_000


def discrete_laplace_pmf(support: np.ndarray, scale: float) -> np.ndarray:
    """P(Z = z) = (1 - q) / (1 + q) q^|z|, q = exp(-1/scale)."""
    q = math.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(support)


def discrete_gaussian_pmf(support: np.ndarray, sigma: float) -> np.ndarray:
    """P(Z = z) proportional to exp(-z^2 / (2 sigma^2)), normalised over a wide support."""
    wide = np.arange(-int(60 * sigma) - 10, int(60 * sigma) + 11)
    normaliser = np.exp(-(wide**2) / (2 * sigma**2)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma**2)) / normaliser


def chi_square_p_value(draws: np.ndarray, pmf: np.ndarray, support: np.ndarray) -> float:
    """Chi-square goodness of fit on the bins of ``support`` plus one bin for the rest."""
    observed = np.array([np.count_nonzero(draws == z) for z in support] + [0])
    observed[-1] = draws.size - observed[:-1].sum()
    expected = np.append(pmf, max(1.0 - pmf.sum(), 0.0)) * draws.size
    # merge bins with tiny expectations into the last one (chi-square needs >= 5)
    small = expected[:-1] < 5
    observed[-1] += observed[:-1][small].sum()
    expected[-1] += expected[:-1][small].sum()
    observed = np.append(observed[:-1][~small], observed[-1])
    expected = np.append(expected[:-1][~small], expected[-1])
    if expected[-1] < 5:  # nothing left in the tails: fold the rest bin into its neighbour
        observed[-2] += observed[-1]
        expected[-2] += expected[-1]
        observed, expected = observed[:-1], expected[:-1]
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


@pytest.mark.parametrize("scale", [0.7, 3.0, 25.0])
def test_discrete_laplace_follows_its_law(noise: OpenDPNoise, scale: float) -> None:
    centre = 40
    draws = noise.integers(np.full(DRAWS, centre, dtype=np.int64), kind="laplace", scale=scale) - centre
    support = np.arange(-int(12 * scale) - 3, int(12 * scale) + 4)
    assert chi_square_p_value(draws, discrete_laplace_pmf(support, scale), support) > P_MIN


@pytest.mark.parametrize("sigma", [0.8, 4.0, 30.0])
def test_discrete_gaussian_follows_its_law(noise: OpenDPNoise, sigma: float) -> None:
    centre = -7
    draws = noise.integers(np.full(DRAWS, centre, dtype=np.int64), kind="gaussian", scale=sigma) - centre
    support = np.arange(-int(6 * sigma) - 3, int(6 * sigma) + 4)
    assert chi_square_p_value(draws, discrete_gaussian_pmf(support, sigma), support) > P_MIN


def test_chunked_threaded_noise_follows_the_same_law(threaded_noise: OpenDPNoise) -> None:
    scale = 5.0
    draws = threaded_noise.integers(np.zeros(DRAWS, dtype=np.int64), kind="laplace", scale=scale)
    support = np.arange(-60, 61)
    assert chi_square_p_value(draws, discrete_laplace_pmf(support, scale), support) > P_MIN


@pytest.mark.parametrize(("scale", "k"), [(2.5, -40), (400.0, -30), (0.01, -50)])
def test_float_laplace_follows_its_law(noise: OpenDPNoise, scale: float, k: int) -> None:
    centre = 123.456
    draws = noise.floats(np.full(DRAWS, centre), kind="laplace", scale=scale, k=k) - centre
    # the grid 2^k is far below the scale, so the continuous law is the reference
    assert stats.kstest(draws, stats.laplace(scale=scale).cdf).pvalue > P_MIN


@pytest.mark.parametrize(("sigma", "k"), [(2.5, -40), (400.0, -30)])
def test_float_gaussian_follows_its_law(threaded_noise: OpenDPNoise, sigma: float, k: int) -> None:
    centre = -55.5
    draws = threaded_noise.floats(np.full(DRAWS, centre), kind="gaussian", scale=sigma, k=k) - centre
    assert stats.kstest(draws, stats.norm(scale=sigma).cdf).pvalue > P_MIN


def test_a_wrong_scale_is_detected(noise: OpenDPNoise) -> None:
    # the tests above have the power to see a 20% error in the scale
    draws = noise.floats(np.zeros(DRAWS), kind="laplace", scale=1.2, k=-40)
    assert stats.kstest(draws, stats.laplace(scale=1.0).cdf).pvalue < P_MIN


def permute_and_flip_probabilities(scores: np.ndarray, scale: float) -> np.ndarray:
    """McKenna & Sheldon 2020: visit candidates in a uniformly random order and
    stop at candidate r with probability exp((x_r - max x) / scale)."""
    accept = np.exp((scores - scores.max()) / scale)
    orders = list(itertools.permutations(range(scores.size)))
    probabilities = np.zeros(scores.size)
    for order in orders:
        still_running = 1.0
        for candidate in order:
            probabilities[candidate] += still_running * accept[candidate] / len(orders)
            still_running *= 1.0 - accept[candidate]
    return probabilities


def test_noisy_top_1_follows_permute_and_flip(noise: OpenDPNoise) -> None:
    scores = np.array([0, 2, 1], dtype=np.int64)
    scale = 2.0
    picks = np.array([noise.top_k(scores, k=1, scale=scale)[0] for _ in range(3000)])
    expected = permute_and_flip_probabilities(scores.astype(float), scale)
    assert expected.sum() == pytest.approx(1.0)
    observed = np.bincount(picks, minlength=3)
    assert stats.chisquare(observed, expected * picks.size).pvalue > P_MIN


def test_top_k_returns_distinct_indices_best_first(noise: OpenDPNoise) -> None:
    scores = np.array([0, 10_000, 5_000, 20_000, 1], dtype=np.int64)
    assert noise.top_k(scores, k=3, scale=1.0).tolist() == [3, 1, 2]
    assert noise.top_k(np.empty(0, dtype=np.int64), k=3, scale=1.0).size == 0


def test_shapes_and_dtypes(noise: OpenDPNoise) -> None:
    counts = noise.integers(np.arange(5, dtype=np.int64), kind="laplace", scale=1.0)
    sums = noise.floats(np.arange(5, dtype=np.float64), kind="gaussian", scale=1.0, k=-30)
    assert counts.dtype == np.int64 and counts.shape == (5,)
    assert sums.dtype == np.float64 and sums.shape == (5,)
    assert noise.integers(np.empty(0, dtype=np.int64), kind="laplace", scale=1.0).size == 0
    assert noise.floats(np.empty(0), kind="laplace", scale=1.0, k=-30).size == 0


def test_noise_rejects_matrices_and_bad_settings(noise: OpenDPNoise) -> None:
    with pytest.raises(ValueError, match="flatten"):
        noise.integers(np.zeros((2, 2), dtype=np.int64), kind="laplace", scale=1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        OpenDPNoise(chunk_size=0)
    with pytest.raises(ValueError, match="cache_size"):
        OpenDPNoise(cache_size=0)


def test_measurement_cache_is_bounded() -> None:
    noise = OpenDPNoise(cache_size=2, chunk_size=4)
    for size in (3, 5, 6, 7):  # equal chunks of at most 4: sizes 3, 2, 3 and 4, 3
        noise.floats(np.zeros(size), kind="laplace", scale=1.0, k=-30)
    assert len(noise._cache) == 2
