"""The staircase mechanism: its exact sampler against its density, its moments, its privacy ratio.

The reference law is built here from the README's definition, block by block
(the first ``r`` magnitudes of each block of ``n`` weigh ``b^G``, the rest
``b^(G + 1)``; ``P(z) ~ weight(|z|)``), and normalised by summation: it shares
no code with :mod:`stream_dp.dp.staircase`.

Statistical tests fail when the chi-square p-value is below P_MIN = 1e-4 (a
correct sampler fails one of the five laws about once in 2,000 runs); the
doctored laws below (one step length off, or epsilon 10% off) give p-values
below 1e-30 with the same draws, so the threshold costs no power.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp.exact_sampling import UrandomBits
from stream_dp.dp.plan import ReleasePlan
from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.staircase import (
    StaircaseLaw,
    calibrate_staircase_counts,
    calibrate_staircase_sums,
    exact_epsilon,
    optimal_gamma,
)
from stream_dp.dp.vectorised_noise import VectorisedExactNoise, round_to_grid

P_MIN = 1e-4
DRAWS = 200_000
LAWS = [(1.0, 1, 1), (2.0, 2, 1), (0.5, 3, 2), (4.0, 5, 2), (1.5, 7, 7)]


def reference_pmf(epsilon: float, n: int, r: int, reach: int) -> np.ndarray:
    """P(Z = z) for z in [-reach, reach], from the definition, normalised over that range."""
    b = math.exp(-epsilon)
    magnitude_weight = []
    block = 0
    while len(magnitude_weight) <= reach:
        magnitude_weight += [b**block] * r + [b ** (block + 1)] * (n - r)
        block += 1
    weight = np.array(magnitude_weight[: reach + 1])
    pmf = np.concatenate([weight[:0:-1], weight])
    return pmf / pmf.sum()


def chi_square_p(draws: np.ndarray, pmf: np.ndarray, reach: int) -> float:
    """Goodness of fit over z in [-reach, reach], cells with expectation below 5 merged into the tails."""
    z = np.arange(-reach, reach + 1)
    expected = pmf * draws.size
    keep = expected >= 5
    lo, hi = z[keep].min(), z[keep].max()
    inside = (z >= lo) & (z <= hi)
    observed = np.array([(draws == v).sum() for v in z[inside]], dtype=float)
    observed = np.concatenate([[(draws < lo).sum()], observed, [(draws > hi).sum()]])
    expect = np.concatenate([[pmf[z < lo].sum()], pmf[inside], [pmf[z > hi].sum()]]) * draws.size
    expect *= observed.sum() / expect.sum()
    return float(stats.chisquare(observed, expect).pvalue)


@pytest.mark.parametrize(("epsilon", "n", "r"), LAWS)
def test_sampler_draws_the_staircase_density(epsilon, n, r):
    law = StaircaseLaw(exact_epsilon(epsilon), n, r)
    draws, huge = law.sample(DRAWS, UrandomBits())
    assert huge == {}
    reach = 60 * n
    assert chi_square_p(draws, reference_pmf(law.epsilon, n, r, reach), reach) > P_MIN


def test_the_fit_rejects_a_doctored_law():
    law = StaircaseLaw(exact_epsilon(4.0), 5, 2)
    draws, _ = law.sample(DRAWS, UrandomBits())
    reach = 300
    assert chi_square_p(draws, reference_pmf(law.epsilon, 5, 3, reach), reach) < 1e-30
    assert chi_square_p(draws, reference_pmf(law.epsilon * 1.1, 5, 2, reach), reach) < 1e-30


@pytest.mark.parametrize(("epsilon", "n", "r"), [*LAWS, (0.05, 4, 3), (3.0, 1000, 180)])
def test_moments_and_interval_match_the_reference(epsilon, n, r):
    law = StaircaseLaw(exact_epsilon(epsilon), n, r)
    reach = int(60 * n / min(epsilon, 1.0))
    pmf = reference_pmf(law.epsilon, n, r, reach)
    z = np.arange(-reach, reach + 1)
    assert law.mean_abs_steps == pytest.approx(float((np.abs(z) * pmf).sum()), rel=1e-9)
    assert law.std == pytest.approx(math.sqrt(float((z * z * pmf).sum())), rel=1e-9)
    assert law.pmf(z) == pytest.approx(pmf, rel=1e-9, abs=1e-300)
    for alpha in (0.05, 0.025, 0.3):
        h = law.half_width_steps(alpha)
        within = np.cumsum(pmf[reach:]) * 2 - pmf[reach]  # P(|Z| <= m)
        assert within[h] >= 1 - alpha - 1e-12
        assert h == 0 or within[h - 1] < 1 - alpha + 1e-12


@pytest.mark.parametrize(("epsilon", "n", "r"), [*LAWS, (3.0, 40, 9)])
def test_a_move_of_at_most_n_steps_changes_no_probability_by_more_than_e_to_the_epsilon(epsilon, n, r):
    reach = 30 * n
    pmf = reference_pmf(exact_epsilon(epsilon), n, r, reach)
    worst = max(float(np.max(pmf[: pmf.size - d] / pmf[d:])) for d in range(1, n + 1))
    worst = max(worst, max(float(np.max(pmf[d:] / pmf[: pmf.size - d])) for d in range(1, n + 1)))
    assert worst <= math.exp(epsilon) * (1 + 1e-9)
    # one step further the ratio exceeds the bound: n is the stairs' true reach, not a loose one
    beyond = float(np.max(pmf[: pmf.size - n - 1] / pmf[n + 1:]))
    assert beyond > math.exp(epsilon) * (1 + 1e-6)


def test_best_step_length_follows_geng_and_viswanath():
    for epsilon in (0.5, 1.0, 2.0, 4.0):
        law = StaircaseLaw.best(epsilon, 100_001, grid_k=-10)
        assert law.lower_steps / law.steps == pytest.approx(optimal_gamma(epsilon), abs=1e-4)
    assert StaircaseLaw.best(1.0, 1).lower_steps == 1  # one step: the geometric mechanism
    # more error than Laplace never: at the same epsilon the staircase's E|Z| is at most the geometric's
    for epsilon, n in ((0.1, 3), (1.0, 4), (4.0, 4), (8.0, 2)):
        law = StaircaseLaw.best(epsilon, n)
        assert law.mean_abs <= law.laplace_peer().mean_abs * (1 + 1e-12)


def test_counts_split_epsilon_over_the_groups_a_unit_touches():
    noise = calibrate_staircase_counts(1.0, max_groups_per_unit=3, max_events_per_group=4)
    assert Fraction(noise.law.epsilon) * 3 <= 1
    assert noise.cost <= 1.0 and noise.cost == pytest.approx(1.0, rel=1e-12)
    assert noise.law.steps == 4 and noise.law.grid_k is None


def test_sum_stairs_cover_the_rounding_of_both_neighbours():
    noise = calibrate_staircase_sums(2.0, max_groups_per_unit=1, per_group_sensitivity=37.5)
    k, n = noise.law.grid_k, noise.law.steps
    rng = np.random.default_rng(7)  # input values only, never noise
    x = rng.uniform(-1e6, 1e6, 50_000)
    y = x + rng.uniform(-37.5, 37.5, x.size)
    ix, _ = round_to_grid(x, k)
    iy, _ = round_to_grid(y, k)
    assert int(np.abs(ix - iy).max()) <= n
    assert n * 2.0**k < 37.5 * (1 + 1e-5)  # and barely wider than the sensitivity


def test_huge_draws_are_exact_python_ints():
    law = StaircaseLaw(exact_epsilon(2.0**-30), 1 << 39, 1 << 38)
    draws, huge = law.sample(2_000, UrandomBits())
    assert huge, "magnitudes near 2^69 must be carried as Python ints"
    assert all(abs(v) >= 1 << 62 for v in huge.values())
    assert all(draws[i] == 0 for i in huge)
    noise = type("Words", (), {"words": staticmethod(UrandomBits())})()
    from stream_dp.dp.staircase import CalibratedStaircase

    counts = CalibratedStaircase(law, 1, float(1 << 39), law.epsilon).apply(np.zeros(2_000, np.int64), noise)
    assert counts.min() >= -(1 << 63) and counts.max() <= (1 << 63) - 1
    assert (counts == (1 << 63) - 1).any() and (counts == -(1 << 63)).any()  # saturated, as Laplace counts


def test_release_plan_with_staircase_noise_states_its_law():
    bounds = ContributionBounds(max_groups_per_unit=2, max_events_per_group=3)
    plan = ReleasePlan.build(mechanism="staircase", epsilon=2.0, bounds=bounds, clip=ClipRange(0.0, 10.0),
                             aggregations={"count", "sum", "mean"})
    assert plan.loss.epsilon <= 2.0 and plan.loss.delta == 0.0
    described = plan.describe()
    assert described["mechanism"] == "staircase" and described["count"]["noise"] == "staircase"
    assert described["count"]["epsilon_per_group"] * 2 <= 1.0
    noise = VectorisedExactNoise()
    counts = np.full(20_000, 50, dtype=np.int64)
    release = plan.release(counts, counts * 5.0, None, noise)
    # the released counts' spread is the law's (loose: 20,000 draws, 5% of the std)
    assert np.std(release.count - 50) == pytest.approx(plan.count_noise.std, rel=0.05)
    assert np.std(release.sum - 250) == pytest.approx(plan.sum_noise.std, rel=0.05)
    assert release.count_ci95 == plan.count_noise.ci_half_width(0.05)
    assert np.mean(np.abs(release.count - 50) <= release.count_ci95) >= 0.94
    assert np.all(np.isfinite(release.mean))


def test_geometric_is_the_laplace_plan():
    bounds = ContributionBounds(max_groups_per_unit=1, max_events_per_group=2)
    geometric = ReleasePlan.build(mechanism="geometric", epsilon=0.5, bounds=bounds)
    laplace = ReleasePlan.build(mechanism="laplace", epsilon=0.5, bounds=bounds)
    assert geometric.describe() == laplace.describe()
