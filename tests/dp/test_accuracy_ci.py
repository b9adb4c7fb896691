"""Reported standard deviations and 95% intervals against sampled noise and exact laws.

Coverage tests draw 20,000 groups in one release (independent noise per
group). The observed coverage must lie within 4.5 standard errors of the exact
coverage of the reported interval (a false failure about once in 150,000 runs),
and that exact coverage must be at least 95%.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.dp import ClipRange, ContributionBounds, OpenDPNoise, ReleasePlan
from stream_dp.dp.accuracy import mean_with_ci, noise_ci_half_width, noise_std

GROUPS = 20_000
Z = 4.5


def discrete_mass_within(kind: str, scale: float, half_width: float) -> float:
    """Exact P(|Z| <= half_width) for discrete Laplace (scale) or discrete Gaussian (sigma)."""
    h = math.floor(half_width)
    if kind == "laplace":
        q = math.exp(-1.0 / scale)
        return 1.0 - 2.0 * q ** (h + 1) / (1.0 + q)
    support = np.arange(-int(60 * scale) - 10, int(60 * scale) + 11)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * scale**2))
    return float(weights[np.abs(support) <= h].sum() / weights.sum())


def assert_coverage(observed: float, exact: float) -> None:
    assert exact >= 0.95
    standard_error = math.sqrt(exact * (1 - exact) / GROUPS)
    assert abs(observed - exact) <= Z * standard_error + 1e-12


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["laplace", "gaussian"]), st.floats(0.2, 500.0))
def test_integer_half_width_is_the_smallest_with_95_percent(kind: str, scale: float) -> None:
    half_width = noise_ci_half_width(kind, scale)  # type: ignore[arg-type]
    assert half_width == int(half_width) >= 0
    assert discrete_mass_within(kind, scale, half_width) >= 0.95
    if half_width >= 1:
        assert discrete_mass_within(kind, scale, half_width - 1) < 0.95


def test_large_gaussian_bound_is_valid_and_tight() -> None:
    sigma = 3e5  # above the limit where OpenDP's exact loop is used
    half_width = noise_ci_half_width("gaussian", sigma)
    assert 1.959963984 * sigma <= half_width <= 1.959963985 * sigma + 1


@pytest.mark.parametrize(("kind", "scale", "k"), [("laplace", 3.0, None), ("gaussian", 7.0, None),
                                                   ("laplace", 40.0, -40), ("gaussian", 40.0, -40)])
def test_reported_std_matches_sampled_noise(noise: OpenDPNoise, kind: str, scale: float, k: int | None) -> None:
    if k is None:
        draws = noise.integers(np.zeros(GROUPS, dtype=np.int64), kind=kind, scale=scale).astype(float)
    else:
        draws = noise.floats(np.zeros(GROUPS), kind=kind, scale=scale, k=k)
    # the sample std has a relative spread below 1% at this size (Laplace kurtosis 6); 5% is > 6 spreads
    assert draws.std() == pytest.approx(noise_std(kind, scale, k), rel=0.05)  # type: ignore[arg-type]


def test_discrete_laplace_std_has_the_exact_variance() -> None:
    q = math.exp(-1.0)  # scale 1: Var = 2q / (1 - q)^2
    assert noise_std("laplace", 1.0) == pytest.approx(math.sqrt(2 * q / (1 - q) ** 2))
    assert noise_std("laplace", 1e6) == pytest.approx(math.sqrt(2) * 1e6, rel=1e-6)
    assert noise_std("gaussian", 0.5) < 0.5


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_count_and_sum_intervals_cover_95_percent(noise: OpenDPNoise, mechanism: str) -> None:
    plan = ReleasePlan.build(
        mechanism=mechanism, epsilon=1.0, delta=0.0 if mechanism == "laplace" else 1e-6,
        bounds=ContributionBounds(1, 2), clip=ClipRange(0.0, 10.0), aggregations={"count", "sum"},
    )
    true_count, true_sum = 500, 2_345.5
    counts = np.full(GROUPS, true_count, dtype=np.int64)
    release = plan.release(counts, np.full(GROUPS, true_sum), None, noise)
    assert release.count is not None and release.sum is not None
    assert plan.count_noise is not None and plan.sum_noise is not None
    covered_counts = np.mean(np.abs(release.count - true_count) <= release.count_ci95)
    assert_coverage(covered_counts, discrete_mass_within(mechanism, plan.count_noise.scale, release.count_ci95))
    covered_sums = np.mean(np.abs(release.sum - true_sum) <= release.sum_ci95)
    scale = plan.sum_noise.scale
    exact = (1 - math.exp(-release.sum_ci95 / scale) if mechanism == "laplace"
             else math.erf(release.sum_ci95 / (scale * math.sqrt(2))))
    assert_coverage(covered_sums, exact)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_mean_intervals_cover_at_least_95_percent(noise: OpenDPNoise, mechanism: str) -> None:
    plan = ReleasePlan.build(
        mechanism=mechanism, epsilon=1.0, delta=0.0 if mechanism == "laplace" else 1e-6,
        bounds=ContributionBounds(1, 1), clip=ClipRange(0.0, 100.0), aggregations={"mean"},
    )
    true_count, true_mean = 1_000, 40.0
    release = plan.release(np.full(GROUPS, true_count, dtype=np.int64), np.full(GROUPS, true_count * true_mean),
                           None, noise)
    assert release.mean is not None and release.mean_ci95 is not None
    assert np.all((release.mean >= 0.0) & (release.mean <= 100.0))
    assert release.mean_ci95.max() < 10.0  # informative, so the coverage check means something
    covered = np.mean(np.abs(release.mean - true_mean) <= release.mean_ci95)
    # conservative by construction: only the lower side is tested (4.5 standard errors of 95%)
    assert covered >= 0.95 - Z * math.sqrt(0.95 * 0.05 / GROUPS)


def test_mean_interval_arithmetic() -> None:
    clip = ClipRange(0.0, 10.0)
    mean, half_width = mean_with_ci(np.array([10, 0, 100]), np.array([50.0, 3.0, -20.0]), 2.0, 10.0, clip)
    # group 0: sums in [40, 60], counts in [8, 12] -> means in [3.33, 7.5]; released 5.0
    assert mean[0] == 5.0 and half_width[0] == pytest.approx(2.5)
    # group 1: count interval [-2, 2] -> true count 1 or 2 -> means in [-3.5, 13] -> clipped to [0, 10]
    assert mean[1] == 3.0 and half_width[1] == pytest.approx(7.0)
    # group 2: all ratios are negative, outside [0, 10]: one interval missed, so the whole range is reported
    assert mean[2] == 0.0 and half_width[2] == pytest.approx(10.0)
    # group 3: ratios partly below the range: the interval is cut at lo
    mean, half_width = mean_with_ci(np.array([100]), np.array([5.0]), 2.0, 10.0, clip)
    assert mean[0] == pytest.approx(0.05) and half_width[0] == pytest.approx(15.0 / 98.0 - 0.05)


def test_mean_interval_without_information_is_the_clip_range() -> None:
    clip = ClipRange(-5.0, 5.0)
    mean, half_width = mean_with_ci(np.array([0]), np.array([1.0]), 0.5, 1.0, clip)
    assert mean[0] == 1.0
    assert half_width[0] == pytest.approx(6.0)  # covers [-5, 5] around 1.0


def test_alpha_is_validated() -> None:
    with pytest.raises(ValueError, match="0.05 for a 95% interval"):
        noise_ci_half_width("laplace", 1.0, None, alpha=0.0)
