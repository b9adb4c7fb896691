"""Mean vectors and covariance: sensitivity, exact noise law, post-processing against numpy, interval coverage.

Statistical checks use the real OpenDP samplers and fail by chance with
probability below ``P_MIN`` each (KS tests), or are binomial coverage checks
with a margin of more than 4 standard deviations.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp import ContributionBounds, OpenDPNoise
from stream_dp.dp.vectors import (
    FeatureSpec,
    VectorPlan,
    clip_l2,
    covariance_block,
    group_row_sums,
    group_row_sums_in_blocks,
    mean_vector_block,
    psd_projection,
)

P_MIN = 1e-4
FIELDS = ("a", "b", "c")


def _plan(kind: str, *, rho: float = 0.5, clip_norm: float = 2.0, groups: int = 2) -> VectorPlan:
    return VectorPlan.build(kind=kind, fields=FIELDS, clip_norm=clip_norm, rho=rho, delta=1e-6,
                            bounds=ContributionBounds(groups, 5))


def test_clipping_scales_long_vectors_down_and_leaves_short_ones():
    v = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    assert np.allclose(clip_l2(v, 1.0), [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])


def test_clipping_a_vector_of_subnormal_fields_leaves_it_as_it_is_without_an_overflow():
    # its norm squares to 0; a bound over the smallest normal number overflowed (a warning, an error here)
    v = np.array([[5e-324, -5e-324], [3.0, 4.0]])
    assert clip_l2(v, 1000.0).tolist() == [[5e-324, -5e-324], [3.0, 4.0]]


@pytest.mark.parametrize("kind", ["mean_vector", "covariance"])
def test_one_unit_moves_the_feature_sums_by_at_most_the_sensitivity(kind):
    """Neighbouring datasets (one unit's vectors in L0 groups added), worst directions included:
    the l2 distance of the concatenated group sums never exceeds the plan's sensitivity, and comes
    within 1e-9 of it (so the bound is tight, not merely safe)."""
    plan = _plan(kind, groups=3)
    spec = plan.features
    rng = np.random.default_rng(0)
    worst = 0.0
    base = spec.group_sums(rng.integers(0, 3, 50), spec.of_means(rng.normal(0, 3, (50, 3))), 3)
    directions = [rng.normal(0, 1, 3) * 100 for _ in range(200)] + [np.array([1e6, 0, 0])]
    for direction in directions:
        # the unit's vector in each of its 3 groups (long ones are clipped)
        extra = spec.group_sums(np.arange(3), spec.of_means(np.tile(direction, (3, 1))), 3)
        worst = max(worst, float(np.linalg.norm((base + extra - base).reshape(-1))))
    assert worst <= plan.sensitivity * (1 + 1e-12)
    assert worst >= plan.sensitivity * (1 - 1e-9)
    # from the definitions, not from FeatureSpec: sqrt(L0) * sqrt(2) C, or sqrt(L0) * sqrt(3) C^2
    expected = math.sqrt(3) * (math.sqrt(2) * 2.0 if kind == "mean_vector" else math.sqrt(3) * 2.0**2)
    assert plan.sensitivity == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["mean_vector", "covariance"])
def test_noise_is_gaussian_with_the_stated_sd_on_every_coordinate(kind):
    plan = _plan(kind, rho=0.8)
    sums = np.zeros((3000, plan.features.width))
    noisy = plan.noisy(sums, OpenDPNoise())
    z = noisy.reshape(-1) / plan.sigma
    assert stats.kstest(z, stats.norm().cdf).pvalue > P_MIN
    # coordinates are independent: neighbouring coordinates uncorrelated (|r| < 5 / sqrt(n))
    r = np.corrcoef(noisy[:, 0], noisy[:, -1])[0, 1]
    assert abs(r) < 5 / math.sqrt(len(noisy))
    # the stated sigma is the calibrated one: rho = Delta^2 / (2 sigma^2) within the budget
    assert plan.sensitivity**2 / (2 * plan.sigma**2) <= 0.8 * (1 + 1e-9)
    assert plan.loss.rho <= 0.8 * (1 + 1e-9)


def test_post_processing_without_noise_gives_numpys_mean_and_population_covariance():
    rng = np.random.default_rng(5)
    vectors = rng.normal([1.0, -2.0, 0.5], [0.3, 0.5, 0.2], (400, 3))  # all within C = 10
    spec = FeatureSpec("covariance", 3, 10.0)
    sums = spec.group_sums(np.zeros(400, dtype=np.int64), spec.of_means(vectors), 1)[0]
    block = covariance_block(sums, 10.0, 0.0, FIELDS)
    assert block["units"] == pytest.approx(400)
    assert np.allclose(block["mean"], vectors.mean(axis=0))
    assert np.allclose(block["covariance"], np.cov(vectors.T, bias=True), atol=1e-9)
    assert np.allclose(block["second_moment"], vectors.T @ vectors / 400)
    spec_m = FeatureSpec("mean_vector", 3, 10.0)
    sums_m = spec_m.group_sums(np.zeros(400, dtype=np.int64), spec_m.of_means(vectors), 1)[0]
    block_m = mean_vector_block(sums_m, 10.0, 0.0, FIELDS)
    assert block_m["units"] == pytest.approx(400) and np.allclose(block_m["mean"], vectors.mean(axis=0))
    assert np.allclose(block_m["sum"], vectors.sum(axis=0))


def test_released_covariances_are_positive_semi_definite_whatever_the_noise():
    plan = _plan("covariance", rho=0.01)  # heavy noise: most raw matrices are indefinite
    rng = np.random.default_rng(2)
    vectors = rng.normal(0.0, 0.5, (30, 3))
    spec = plan.features
    sums = spec.group_sums(np.zeros(30, dtype=np.int64), spec.of_means(vectors), 1)
    raised = 0
    for _ in range(200):
        (block,) = plan.rows(plan.noisy(sums, OpenDPNoise()))
        raised += block["eigenvalues_raised"]
        if block["covariance"] is not None:
            eigenvalues = np.linalg.eigvalsh(np.array(block["covariance"]))
            assert eigenvalues.min() >= -1e-9 * max(1.0, abs(eigenvalues).max())
            assert np.allclose(block["covariance"], np.array(block["covariance"]).T)
    assert raised > 0  # the projection had work to do


def test_psd_projection_is_the_nearest_psd_matrix():
    rng = np.random.default_rng(3)
    m = rng.normal(0, 1, (4, 4))
    m = (m + m.T) / 2
    projected, raised = psd_projection(m)
    assert raised == int((np.linalg.eigvalsh(m) < 0).sum())
    # any other PSD matrix (random ones here) is at least as far from m in Frobenius norm
    best = np.linalg.norm(m - projected)
    for _ in range(300):
        a = rng.normal(0, 1, (4, 4))
        assert np.linalg.norm(m - a @ a.T) >= best - 1e-12


def test_mean_intervals_cover_the_true_mean_95_percent_of_the_time():
    """Delta-method intervals, count noise included: coverage over 400 releases x 3 fields of a group
    of 60 units stays within [0.92, 0.99] (binomial sd of the rate at 0.95 is 0.0063)."""
    plan = _plan("mean_vector", rho=0.05, clip_norm=3.0, groups=1)
    rng = np.random.default_rng(4)
    vectors = rng.normal([1.0, -1.0, 0.5], 0.4, (60, 3))
    spec = plan.features
    sums = spec.group_sums(np.zeros(60, dtype=np.int64), spec.of_means(vectors), 1)
    truth = vectors.mean(axis=0)
    hits = trials = 0
    for _ in range(400):
        (block,) = plan.rows(plan.noisy(sums, OpenDPNoise()))
        if block["mean"] is None:
            continue
        for mean, half, true in zip(block["mean"], block["mean_ci95"], truth):
            hits += abs(mean - true) <= half
            trials += 1
    assert trials >= 1100
    assert 0.92 <= hits / trials <= 0.99


def test_bad_plans_say_how_to_fix_them():
    with pytest.raises(ValueError, match="clip_norm must be a positive"):
        _plan("mean_vector", clip_norm=0.0)
    with pytest.raises(ValueError, match="repeat a field"):
        VectorPlan.build(kind="covariance", fields=("a", "a"), clip_norm=1.0, rho=1.0, delta=1e-6,
                         bounds=ContributionBounds(1, 1))
    with pytest.raises(ValueError, match="takes 1 to 16 fields"):
        VectorPlan.build(kind="covariance", fields=tuple(f"f{i}" for i in range(17)), clip_norm=1.0, rho=1.0,
                         delta=1e-6, bounds=ContributionBounds(1, 1))
    with pytest.raises(ValueError, match=r"shape \(groups, 4\)"):
        _plan("mean_vector").noisy(np.zeros((2, 3)), OpenDPNoise())


@pytest.mark.parametrize(("kind", "power"), [("mean_vector", 1), ("covariance", 2)])
def test_a_clip_norm_too_small_to_calibrate_is_refused_with_the_smallest_that_is_not(kind, power):
    """The sensitivity is sqrt(L0) sqrt(2) C for a mean vector and sqrt(L0) sqrt(3) C^2 for a covariance (the
    module's rule); the float noise's finest grid 2^-100 serves l2 sensitivities down to 2 sqrt(n) 2^-100 / 0.5
    for n certified coordinates (stream_dp.dp.calibration). A smaller norm -- or one whose square underflows --
    is refused naming clip_norm and the rescaling, with the smallest norm that builds."""
    bounds, width = ContributionBounds(2, 1), 3 if kind == "mean_vector" else 6  # two fields
    floor = 2 * math.sqrt(1_000_000 * width) * 2.0**-100 / 0.5
    expected = (floor / (math.sqrt(2) * (math.sqrt(2) if kind == "mean_vector" else math.sqrt(3)))) ** (1 / power)
    for tiny in (1e-300, 1e-200, 1e-40, expected * 0.99):
        with pytest.raises(ValueError) as info:
            VectorPlan.build(kind=kind, fields=("a", "b"), clip_norm=tiny, rho=0.5, delta=1e-6, bounds=bounds)
        message = str(info.value)
        found = re.search(rf"{kind} clip_norm {tiny:g} is too small to calibrate.*rescale the fields to larger units"
                          r".*clip_norm of at least ([\d.e+-]+)", message)
        assert found, message
        stated = float(found.group(1))
        assert expected <= stated <= 1.02 * expected, (stated, expected)
    plan = VectorPlan.build(kind=kind, fields=("a", "b"), clip_norm=stated, rho=0.5, delta=1e-6, bounds=bounds)
    assert plan.noise.float_grid_k == -100


@pytest.mark.parametrize("kind", ["mean_vector", "covariance"])
def test_a_window_of_more_groups_than_max_groups_is_noised(kind):
    """``max_groups`` is what the float rounding is certified for, and only the coordinates one unit can
    change cost anything (each is rounded and noised on its own): a window of ``max_groups + 1`` groups is
    noised, where it used to be refused -- and the refused window failed again on every retry."""
    bounds = ContributionBounds(2, 1)
    plan = VectorPlan.build(kind=kind, fields=("a", "b"), clip_norm=1.0, rho=0.5, delta=1e-6, bounds=bounds,
                            max_groups=3)
    width = plan.features.width
    assert plan.changed_coordinates == 2 * width <= plan.noise.max_groups == 3 * width
    noisy = plan.noisy(np.zeros((4, width)), OpenDPNoise())
    assert noisy.shape == (4, width) and np.isfinite(noisy).all()
    # what one unit can change must fit the certificate
    with pytest.raises(ValueError, match="raise max_groups to at least max_groups_per_unit"):
        VectorPlan.build(kind=kind, fields=("a", "b"), clip_norm=1.0, rho=0.5, delta=1e-6,
                         bounds=ContributionBounds(4, 1), max_groups=3)


def test_feature_layout_is_the_upper_triangle_of_the_augmented_outer_product():
    spec = FeatureSpec("covariance", 2, 10.0)
    (row,) = spec.of_means(np.array([[2.0, 3.0]]))
    x = [2.0, 3.0, 10.0]
    assert row.tolist() == [x[i] * x[j] for i, j in itertools.combinations_with_replacement(range(3), 2)]


def test_block_sums_are_the_one_shot_sums_bit_for_bit():
    """Sums built a block of rows at a time equal, bit for bit, rows added one after the other in their
    order per group (a plain loop, and ``group_row_sums``): blocks cut inside groups, blocks of one row,
    groups without rows, and magnitudes 16 decades apart, so that the order of additions shows in the
    rounding."""
    rng = np.random.default_rng(11)
    for trial in range(150):
        n, groups, width = int(rng.integers(0, 120)), int(rng.integers(1, 9)), int(rng.integers(1, 7))
        group = rng.integers(0, groups, n)
        rows = rng.normal(0.0, 1.0, (n, width)) * 10.0 ** rng.integers(-8, 9, (n, 1))
        loop = np.zeros((groups, width))
        for g, row in zip(group.tolist(), rows):
            loop[g] += row
        block_elements = int(rng.integers(1, 4 * width + 2))  # blocks of 1 to ~4 rows
        blocks = group_row_sums_in_blocks(group, groups, width, lambda positions: rows[positions],
                                          block_elements=block_elements)
        assert blocks.tobytes() == loop.tobytes() == group_row_sums(group, rows, groups, width).tobytes(), trial


def test_block_sums_never_ask_for_more_than_a_block_of_rows():
    rows = np.arange(60.0).reshape(20, 3)
    asked = []

    def rows_of(positions):
        asked.append(len(positions))
        return rows[positions]

    group_row_sums_in_blocks(np.arange(20) % 4, 4, 3, rows_of, block_elements=12)
    assert asked == [4] * 5
