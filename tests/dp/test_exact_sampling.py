"""The exact samplers of stream_dp.dp.exact_sampling, path by path and against their laws.

Statistical tests fail only when the p-value is below P_MIN = 1e-4: a correct
sampler fails one of them about once in 10,000 runs. With 200,000 draws a
scale off by 10% gives p-values below 1e-100 (checked by hand when these tests
were written: see the commit message), so the threshold costs no power.

Reference laws are computed from the formulas, never from the code under test:
discrete Laplace ``P(Z = z) = (1 - q) / (1 + q) q^|z|`` with ``q = exp(-1/scale)``,
whose CDF is ``q^-z / (1 + q)`` for ``z < 0`` and ``1 - q^(z+1) / (1 + q)`` for ``z >= 0``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp import exact_sampling
from stream_dp.dp.exact_sampling import (
    UnsupportedScale,
    UrandomBits,
    bernoulli_exp,
    bernoulli_rational,
    bernoulli_exp_fraction,
    discrete_laplace,
    geometric_exp_minus_one,
    laplace_scale_fraction,
    uniform_below,
    uniform_below_int,
)

P_MIN = 1e-4
DRAWS = 200_000


def seeded_bits(seed: int):  # type: ignore[no-untyped-def]
    """Deterministic words for testing the algorithms (never used for real noise)."""
    generator = np.random.default_rng(seed)
    return lambda n: generator.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)


def discrete_laplace_cdf(z: np.ndarray, scale: float) -> np.ndarray:
    q = math.exp(-1.0 / scale)
    z = z.astype(float)
    return np.where(z < 0, q ** (-z) / (1 + q), 1 - q ** (z + 1) / (1 + q))


def binned_chi_square_p_value(draws: np.ndarray, scale: float, bins: int = 60) -> float:
    """Chi-square of the draws against the exact law on ~``bins`` integer bins plus both tails."""
    inner = np.unique(np.round(np.linspace(-10 * scale, 10 * scale, bins + 1)).astype(np.int64))
    upper_edges = np.concatenate([inner, [np.iinfo(np.int64).max]])  # bin i is (upper[i-1], upper[i]]
    cdf = np.concatenate([[0.0], discrete_laplace_cdf(upper_edges[:-1], scale), [1.0]])
    expected = np.diff(cdf) * draws.size
    observed = np.bincount(np.searchsorted(upper_edges, draws, side="left"), minlength=expected.size)
    keep = expected >= 5  # chi-square needs >= 5 expected per bin; fold the rest into one bin
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
        expected = expected * observed.sum() / expected.sum()
    return float(stats.chisquare(observed, expected).pvalue)


# --- uniform integers ---------------------------------------------------------------


@pytest.mark.parametrize("bound", range(1, 17))
def test_uniform_rejection_is_unbiased_over_every_4_bit_word(bound: int) -> None:
    # element i first sees word i; every rejected element then sees word 0, which is always accepted
    calls = iter([np.arange(16, dtype=np.uint64)])
    out = uniform_below(np.full(16, bound, dtype=np.uint64),
                        lambda n: next(calls, np.zeros(n, dtype=np.uint64)), word_bits=4)
    accepted = 16 - 16 % bound
    assert np.bincount(out[:accepted], minlength=bound).tolist() == [16 // bound] * bound
    assert out[accepted:].tolist() == [0] * (16 % bound)


def test_uniform_below_with_64_bit_words_covers_the_range_evenly() -> None:
    bound = np.full(DRAWS, 7, dtype=np.uint64)
    counts = np.bincount(uniform_below(bound, seeded_bits(1)).astype(np.int64), minlength=7)
    assert counts.size == 7 and stats.chisquare(counts).pvalue > P_MIN
    big = (1 << 63) + 12345  # rejects almost half of the words
    assert np.all(uniform_below(np.full(1000, big, dtype=np.uint64), seeded_bits(2)) < np.uint64(big))


def test_uniform_below_int_handles_bounds_beyond_64_bits() -> None:
    bits = seeded_bits(3)
    bound = 3 << 70
    values = [uniform_below_int(bound, bits) for _ in range(3000)]
    assert all(0 <= v < bound for v in values)
    thirds = np.bincount([3 * v // bound for v in values], minlength=3)
    assert stats.chisquare(thirds).pvalue > P_MIN


# --- Bernoulli coins ----------------------------------------------------------------


@pytest.mark.parametrize(("numerator", "denominator"), [(0, 1), (1, 3), (1, 1), (7, 4), (5, 2), (13, 5)])
def test_bernoulli_exp_succeeds_with_probability_exp_minus_gamma(numerator: int, denominator: int) -> None:
    coins = bernoulli_exp(np.full(DRAWS, numerator, dtype=np.uint64), np.uint64(denominator), seeded_bits(4))
    expected = math.exp(-numerator / denominator)
    assert stats.binomtest(int(coins.sum()), DRAWS, expected).pvalue > P_MIN


def test_bernoulli_exp_fraction_finishes_long_runs_on_python_ints() -> None:
    # denominator * 2 overflows uint64, so every run reaching k = 2 continues in Python
    denominator = np.uint64((1 << 64) - 1)
    coins = bernoulli_exp_fraction(np.full(20_000, denominator, dtype=np.uint64), denominator, seeded_bits(5))
    assert stats.binomtest(int(coins.sum()), coins.size, math.exp(-1)).pvalue > P_MIN


def test_geometric_exp_minus_one_follows_its_law() -> None:
    counts = np.bincount(geometric_exp_minus_one(DRAWS, seeded_bits(6)).astype(np.int64))
    support = np.arange(8)
    expected = (1 - math.exp(-1)) * np.exp(-support.astype(float))
    expected = np.append(expected, 1 - expected.sum()) * DRAWS
    observed = np.append(counts[:8], counts[8:].sum())
    assert stats.chisquare(observed, expected).pvalue > P_MIN


# --- discrete Laplace ---------------------------------------------------------------

SCALES = [0.5, 1.0, 3.7, 40.0, 1e4, 1 / 3, math.pi * 1e3]


@pytest.mark.parametrize("scale", SCALES)
def test_discrete_laplace_follows_the_exact_law(scale: float) -> None:
    draws, huge = discrete_laplace(DRAWS, *laplace_scale_fraction(scale), UrandomBits())
    assert huge == {}
    assert binned_chi_square_p_value(draws, scale) > P_MIN


def test_draws_too_big_for_int64_are_returned_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    # lower the int64 cut-off so that the Python-int path serves most draws
    monkeypatch.setattr(exact_sampling, "INT64_SAFE", 8)
    scale = 12.0
    draws, huge = discrete_laplace(DRAWS, *laplace_scale_fraction(scale), seeded_bits(7))
    assert huge and all(abs(v) >= 8 and draws[i] == 0 for i, v in huge.items())
    draws[list(huge)] = list(huge.values())
    assert binned_chi_square_p_value(draws, scale) > P_MIN


def test_scale_fractions_are_the_exact_float() -> None:
    assert laplace_scale_fraction(3.7) == (3.7).as_integer_ratio()
    assert laplace_scale_fraction(40.0) == (40, 1)
    assert laplace_scale_fraction(2.5, k=-40) == (5 << 39, 1)
    assert laplace_scale_fraction(0.75, k=3) == (3, 32)
    numerator, denominator = laplace_scale_fraction(0.01, k=-50)
    assert numerator / denominator == 0.01 * 2**50 and denominator & (denominator - 1) == 0


@pytest.mark.parametrize("scale", [2.0**57, 1e20, 2.0**-70, 0.0, -1.0, math.inf, math.nan])
def test_scales_outside_the_safe_range_are_refused_with_the_way_out(scale: float) -> None:
    with pytest.raises(UnsupportedScale, match="OpenDPNoise"):
        laplace_scale_fraction(scale)


def test_the_largest_accepted_scale_draws_without_overflow() -> None:
    numerator, denominator = laplace_scale_fraction(2.0**56)
    assert (numerator, denominator) == (1 << 56, 1)
    draws, huge = discrete_laplace(10_000, numerator, denominator, seeded_bits(8))
    assert not huge and np.abs(draws).max() < 2**62
    assert stats.kstest(draws / 2.0**56, stats.laplace().cdf).pvalue > P_MIN


def test_urandom_bits_hands_out_fresh_words() -> None:
    bits = UrandomBits(block_words=4)
    words = np.concatenate([bits(3), bits(10), bits(1)])
    assert words.dtype == np.uint64 and words.size == 14 and np.unique(words).size == 14
    assert discrete_laplace(0, 1, 1, bits)[0].size == 0


@pytest.mark.parametrize(("numerator", "denominator"), [(1, 3), (2, 3), (3, 3), (0, 5), (1, 4), ((1 << 62) + 1, (1 << 63) + 1)])
def test_bernoulli_rational_with_a_shared_denominator(numerator: int, denominator: int) -> None:
    coins = bernoulli_rational(np.full(DRAWS, numerator, dtype=np.uint64), np.uint64(denominator), seeded_bits(9))
    assert stats.binomtest(int(coins.sum()), DRAWS, numerator / denominator).pvalue > P_MIN
