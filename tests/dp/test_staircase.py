"""The staircase mechanism: its exact sampler against its density, its moments, its privacy ratio.

The reference law is built here from the README's definition, block by block
(the first ``r`` magnitudes of each block of ``n`` weigh ``b^G``, the rest
``b^(G + 1)``; ``P(z) ~ weight(|z|)``), and normalised by summation: it shares
no code with :mod:`stream_dp.dp.staircase`. The step length is held to Geng &
Viswanath's continuous optimum (their closed form for the least E|X|, itself
checked by minimising the continuous staircase's E|X| numerically), and the
sum law the worker builds to that least E|X| and to the README's comparison
with Laplace; its step length must be the exact argmin of E|Z| summed from the
density in 40-digit decimals.

Statistical tests fail when their p-value is below P_MIN = 1e-4, each one:
with the 15 such assertions below a correct sampler fails the file about once
in 700 runs. The doctored laws below (one step length off, or epsilon 10% off)
give p-values below 1e-30 with the same draws, so the threshold costs no power
(the worker's laws' section lists what each of its tests sees when doctored).

The worker's laws (built as the worker builds them from deploy/queries.example.yaml's
session_minutes, at epsilon 4) have an epsilon just under 2 whose fraction has a denominator of 2^52,
and about 2^21 steps for sums: too many for one chi-square over the density,
so the sum law is checked part by part -- the block index, the inner and outer
part of a step, the position within a step, the sign, E|Z| and E[Z^2] -- each
against its exact law. Last, the sampler is fed every class of 64-bit words on
two small laws and the exact probability of each outcome is compared with the
density.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from stream_dp.config import load_config
from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.exact_sampling import UrandomBits
from stream_dp.dp.plan import ReleasePlan
from stream_dp.dp.staircase import (
    StaircaseLaw,
    calibrate_staircase_counts,
    calibrate_staircase_sums,
    exact_epsilon,
)
from stream_dp.dp.vectorised_noise import VectorisedExactNoise, round_to_grid
from stream_dp.worker.query.costs import build_plan

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


def continuous_staircase_mean_abs(epsilon: float, gamma: float) -> float:
    """``E|X|`` of the continuous staircase of stair width 1 (Geng & Viswanath 2016): density
    proportional to ``b^k`` for ``|x|`` in ``[k, k + gamma)`` and ``b^(k + 1)`` in ``[k + gamma, k + 1)``,
    integrated stair by stair (both signs alike, so one side suffices)."""
    b = math.exp(-epsilon)
    k = np.arange(int(80 / epsilon) + 2, dtype=float)  # b^k below e^-80 beyond
    mass = np.sum(b**k * (gamma + b * (1 - gamma)))
    first = np.sum(b**k * (((k + gamma) ** 2 - k**2) / 2 + b * ((k + 1) ** 2 - (k + gamma) ** 2) / 2))
    return float(first / mass)


def geng_viswanath_least_mean_abs(epsilon: float) -> float:
    """Their closed form of the least ``E|X|`` over gamma, per unit of stair width: ``e^(eps/2) / (e^eps - 1)``
    at ``gamma* = 1 / (1 + e^(eps/2))``; Laplace of the same epsilon has ``1 / eps``."""
    return math.exp(epsilon / 2) / math.expm1(epsilon)


def reference_mean_abs(epsilon: float, n: int, r: int) -> Decimal:
    """``E|Z|`` in grid steps of ``P(z) = b^L(|z|) / C``, summed block by block in 40-digit decimals, so
    that step lengths ``r`` and ``r + 1`` of a ~2^21-step law (``E|Z|`` apart by ~1e-13) are told apart.

    Block ``g`` holds magnitudes ``g n + j``: weight ``b^g`` for ``j < r``, ``b^(g + 1)`` from ``r`` on.
    """
    with localcontext() as context:
        context.prec = 40
        b = (-Decimal(epsilon)).exp()  # Decimal(float) is exact

        def magnitudes(lo: int, hi: int, g: int) -> int:  # sum of g n + j over j in [lo, hi)
            return (hi - lo) * g * n + (hi * (hi - 1) - lo * (lo - 1)) // 2

        first, mass, power = Decimal(0), Decimal(0), Decimal(1)
        for g in range(int(40 * math.log(10) / epsilon) + 10):  # until b^g < 1e-40
            first += power * (magnitudes(0, r, g) + b * magnitudes(r, n, g))
            mass += power * (r + b * (n - r))
            power *= b
        return 2 * first / (2 * mass - 1)  # both signs; zero (weight 1) once


def test_the_references_are_the_density_and_geng_and_viswanath():
    for epsilon, n, r in ((1.5, 7, 3), (0.5, 5, 2), (4.0, 40, 9)):
        epsilon = exact_epsilon(epsilon)
        reach = int(80 * n / epsilon)
        z = np.arange(-reach, reach + 1)
        brute = float(np.sum(np.abs(z) * reference_pmf(epsilon, n, r, reach)))
        assert float(reference_mean_abs(epsilon, n, r)) == pytest.approx(brute, rel=1e-12)
    # the closed form is the minimum of the continuous staircase's E|X| over gamma, found numerically
    for epsilon, versus_laplace in ((0.1, 0.9996), (2.0, 0.851), (4.0, 0.551)):
        best = optimize.minimize_scalar(lambda g: continuous_staircase_mean_abs(epsilon, g), bounds=(0.0, 1.0),
                                        method="bounded", options={"xatol": 1e-10})
        assert best.fun == pytest.approx(geng_viswanath_least_mean_abs(epsilon), rel=1e-9)
        assert best.x == pytest.approx(1 / (1 + math.exp(epsilon / 2)), abs=1e-4)
        assert geng_viswanath_least_mean_abs(epsilon) * epsilon == pytest.approx(versus_laplace, abs=5e-4)


def test_best_step_length_follows_geng_and_viswanath():
    for epsilon in (0.5, 1.0, 2.0, 4.0):
        law = StaircaseLaw.best(epsilon, 100_001, grid_k=-10)
        assert law.lower_steps / law.steps == pytest.approx(1 / (1 + math.exp(epsilon / 2)), abs=1e-4)
    assert StaircaseLaw.best(1.0, 1).lower_steps == 1  # one step: the geometric mechanism
    # more error than Laplace never: at the same epsilon the staircase's E|Z| is at most the geometric's
    for epsilon, n in ((0.1, 3), (1.0, 4), (4.0, 4), (8.0, 2)):
        law = StaircaseLaw.best(epsilon, n)
        assert law.mean_abs <= law.laplace_peer().mean_abs * (1 + 1e-12)


# The README: "at epsilon' = 2 a sum's mean absolute error is 15% below Laplace's, at epsilon' = 4 45% below,
# at epsilon' <= 0.1 the same"; epsilon' is the share of each group a unit may touch.
README_VERSUS_LAPLACE = {0.1: (0.999, 1.0), 2.0: (0.845, 0.855), 4.0: (0.545, 0.555)}


@pytest.mark.parametrize(("epsilon_per_group", "groups_per_unit"),
                         [(0.1, 1), (0.5, 1), (1.0, 1), (2.0, 1), (4.0, 1), (2.0, 2)])
def test_the_sum_law_the_worker_builds_has_the_least_mean_error_of_geng_and_viswanath(
        epsilon_per_group, groups_per_unit):
    bounds = ContributionBounds(max_groups_per_unit=groups_per_unit, max_events_per_group=3)
    clip = ClipRange(-2.0, 10.0)
    width = 3 * 10.0  # a unit moves one group's sum by at most max_events_per_group * max(|lo|, |hi|)
    epsilon = epsilon_per_group * groups_per_unit
    plan = ReleasePlan.build(mechanism="staircase", epsilon=epsilon, bounds=bounds, clip=clip, aggregations={"sum"})
    law = plan.sum_noise.law
    assert law.epsilon == pytest.approx(epsilon_per_group, rel=1e-8) and law.epsilon <= epsilon_per_group
    n, r, grid = law.steps, law.lower_steps, law.grid
    assert n * grid == pytest.approx(width, rel=1e-5)  # the stairs: the move plus a grid step of rounding
    mean_abs = float(reference_mean_abs(law.epsilon, n, r)) * grid
    assert law.mean_abs == pytest.approx(mean_abs, rel=1e-9)
    # the continuous staircase's least E|X| for stairs as wide as the move
    assert mean_abs == pytest.approx(width * geng_viswanath_least_mean_abs(law.epsilon), rel=1e-3)
    # r is the best step length: one step either way costs more
    at_r = reference_mean_abs(law.epsilon, n, r)
    assert reference_mean_abs(law.epsilon, n, r - 1) > at_r and reference_mean_abs(law.epsilon, n, r + 1) > at_r
    # the README's comparison with Laplace at the same epsilon: Laplace's E|X| = width / epsilon', the
    # Laplace plan's sum noise (its scale is its mean absolute error) and the geometric law `plan` prints
    laplace_plan = ReleasePlan.build(mechanism="laplace", epsilon=epsilon, bounds=bounds, clip=clip,
                                     aggregations={"sum"})
    printed = plan.describe()["sum"]["geometric_mean_abs_error"]
    for laplace in (width / law.epsilon, laplace_plan.sum_noise.scale, printed):
        assert laplace == pytest.approx(width / epsilon_per_group, rel=1e-5)
        low, high = README_VERSUS_LAPLACE.get(epsilon_per_group, (0.0, 1.0))
        assert low <= mean_abs / laplace <= high


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


# --- the worker's laws ----------------------------------------------------------------------------
#
# Built by build_plan from the example configuration's staircase query, as the worker and `stream-dp
# plan` build them: the per-group epsilon is rounded down to an exact dyadic (here 9007199245733793 / 2^52,
# just under 2), the count law has max_events_per_group steps, the sum law about 2^21 steps of 2^-13.
#
# Power at these sample sizes, seen on doctored samplers (p-values of a correct one spread over (0, 1)):
# the sum law's r 2% long -> inner part p = 2e-96, outer positions p < 1e-300; 2% short -> inner
# positions p < 1e-300; 0.2% long -> outer positions 3e-27; the blocks' epsilon 1% high -> block index
# 4e-13, E|Z| 8e-10, E[Z^2] 2e-11; the step coin's exponent 1% high -> inner part 3e-21; P(negative) =
# 0.505 -> sign 4e-26; 51% negative in the outer part and 49.6% in the inner -> sign 0.44 but sign by cell
# 8e-33; J the lesser of two uniforms 5% of the time -> positions 2e-5 (inner), 5e-28 (outer). The count
# law: blocks' epsilon 5% high -> 5e-141 (1% high: 1e-3 to 2e-5), step coin 5% high -> 6e-89, r = 1 or 3 -> 0.

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
COUNT_DRAWS = 400_000
SUM_DRAWS = 1_000_000
SUB_BINS = 20


@pytest.fixture(scope="module")
def production_noise():  # type: ignore[no-untyped-def]
    """(count noise, sum noise) of query session_minutes at epsilon 4 (2 per group, where the staircase departs
    most from Laplace), as the worker builds them."""
    query = load_config(EXAMPLE).query("session_minutes").model_copy(update={"epsilon": 4.0})
    assert query.mechanism == "staircase"
    base = build_plan(query).base
    assert base is not None
    return base.count_noise, base.sum_noise


@pytest.fixture(scope="module")
def sum_draws(production_noise):  # type: ignore[no-untyped-def]
    """SUM_DRAWS draws of the sum law, in grid steps, through the release path (noise added to zero sums)."""
    _, noise = production_noise
    released = noise.apply(np.zeros(SUM_DRAWS), VectorisedExactNoise())
    steps = np.ldexp(released, -noise.law.grid_k)
    assert np.array_equal(steps, np.round(steps)), "a released sum is off the grid"
    return steps.astype(np.int64)


@dataclass(frozen=True)
class FactorisedLaw:
    """The staircase law as the sampler builds it: ``|Z| = G n + J``, a sign, zero counted once.

    Computed here by summing over blocks (``P(z) = b^L(|z|) / C``; block ``g`` holds ``r`` magnitudes of
    weight ``b^g`` and ``n - r`` of weight ``b^(g + 1)``), not from the module's closed forms.
    """

    epsilon: float
    n: int
    r: int

    @property
    def b(self) -> float:
        return math.exp(-self.epsilon)

    @property
    def powers(self) -> np.ndarray:
        """``b^g`` for every block until the terms no longer change a float sum."""
        count = int(40 * math.log(10) / self.epsilon) + 2  # b^count < 1e-40
        return self.b ** np.arange(count, dtype=float)

    @property
    def block_sum(self) -> float:
        return float(math.fsum(self.powers))

    @property
    def normaliser(self) -> float:
        """Every magnitude twice (both signs), zero once."""
        return 2 * (self.r + (self.n - self.r) * self.b) * self.block_sum - 1

    def block(self, g: int) -> float:
        """``P(G = g)``."""
        return (2 * (self.r + (self.n - self.r) * self.b) * self.b**g - (g == 0)) / self.normaliser

    def block_and_part(self, g: int, inner: bool) -> float:
        """``P(G = g, J < r)`` or ``P(G = g, J >= r)``."""
        if inner:
            return (2 * self.r * self.b**g - (g == 0)) / self.normaliser
        return 2 * (self.n - self.r) * self.b ** (g + 1) / self.normaliser

    def from_block(self, g: int, inner: bool | None = None) -> float:
        """``P(G >= g)`` for ``g >= 1``, or ``P(G >= g, J < r)`` / ``P(G >= g, J >= r)``."""
        assert g >= 1  # zero, counted once, is in block 0
        weight = {None: self.r + (self.n - self.r) * self.b, True: self.r, False: (self.n - self.r) * self.b}
        return 2 * weight[inner] * math.fsum(self.powers[g:]) / self.normaliser

    @property
    def inner(self) -> float:
        """``P(J < r)``: the draw is in the first ``r`` magnitudes of its block."""
        return (2 * self.r * self.block_sum - 1) / self.normaliser

    def positions(self, lo: int, hi: int) -> float:
        """``P(lo <= J < hi)`` for a range inside one part (``[0, r)`` or ``[r, n)``)."""
        assert 0 <= lo < hi <= self.r or self.r <= lo < hi <= self.n
        weight = 1.0 if hi <= self.r else self.b
        return (2 * (hi - lo) * weight * self.block_sum - (lo == 0)) / self.normaliser

    def moment(self, k: int) -> float:
        """``E[|Z|^k]`` for k = 1, 2: sum over blocks of the block's exact integer power sums."""

        def power_sum(lo: int, hi: int, g: int) -> int:  # sum of (g n + j)^k over j in [lo, hi)
            count, s1 = hi - lo, (hi * (hi - 1) - lo * (lo - 1)) // 2
            if k == 1:
                return count * g * self.n + s1
            s2 = ((hi - 1) * hi * (2 * hi - 1) - (lo - 1) * lo * (2 * lo - 1)) // 6
            return count * (g * self.n) ** 2 + 2 * g * self.n * s1 + s2

        total = math.fsum(
            float(power) * (power_sum(0, self.r, g) + self.b * power_sum(self.r, self.n, g))
            for g, power in enumerate(self.powers)
        )
        return 2 * total / self.normaliser


def production_factorised(noise) -> FactorisedLaw:  # type: ignore[no-untyped-def]
    return FactorisedLaw(noise.law.epsilon, noise.law.steps, noise.law.lower_steps)


def chi_square_cells(observed: np.ndarray, probabilities: np.ndarray) -> float:
    """Chi-square p-value of counts against exact cell probabilities (which sum to 1); a cell expecting
    fewer than 5 draws is merged with the next (the last with the one before)."""
    expected = np.asarray(probabilities, dtype=float) * observed.sum()
    obs, exp = [], []
    for o, e in zip(observed.tolist(), expected.tolist()):
        if exp and exp[-1] < 5:
            obs[-1] += o
            exp[-1] += e
        else:
            obs.append(o)
            exp.append(e)
    while len(exp) > 1 and exp[-1] < 5:
        obs[-2] += obs.pop()
        exp[-2] += exp.pop()
    exp_arr = np.array(exp) * sum(obs) / sum(exp)  # the probabilities sum to 1 up to float rounding
    return float(stats.chisquare(np.array(obs, dtype=float), exp_arr).pvalue)


def block_index_p(steps: np.ndarray, law: FactorisedLaw, cells: int = 12) -> float:
    """G = floor(|Z| / n) over blocks 0 .. cells - 2 and the tail, against ``P(G = g)``."""
    g = np.minimum(np.abs(steps) // law.n, cells - 1)
    observed = np.bincount(g, minlength=cells)
    probabilities = [law.block(i) for i in range(cells - 1)]
    return chi_square_cells(observed, np.array([*probabilities, law.from_block(cells - 1)]))


def inner_part_p(steps: np.ndarray, law: FactorisedLaw) -> float:
    inner = int(np.count_nonzero(np.abs(steps) % law.n < law.r))
    return float(stats.binomtest(inner, steps.size, law.inner).pvalue)


def block_and_part_p(steps: np.ndarray, law: FactorisedLaw, blocks: int = 4) -> float:
    """The joint law of (G, inner or outer): the part must not depend on the block."""
    m = np.abs(steps)
    g = np.minimum(m // law.n, blocks)
    outer = (m % law.n >= law.r).astype(np.int64)
    observed = np.bincount(2 * g + outer, minlength=2 * blocks + 2)
    probabilities = [law.block_and_part(i, inner) for i in range(blocks) for inner in (True, False)]
    tails = [law.from_block(blocks, True), law.from_block(blocks, False)]
    return chi_square_cells(observed, np.array([*probabilities, *tails]))


def part_edges(law: FactorisedLaw, inner: bool) -> np.ndarray:
    lo, hi = (0, law.r) if inner else (law.r, law.n)
    return np.array([lo + (hi - lo) * i // SUB_BINS for i in range(SUB_BINS + 1)])


def position_p(steps: np.ndarray, law: FactorisedLaw, inner: bool) -> float:
    """J = |Z| mod n within one part, in SUB_BINS bins, against its exact (uniform up to zero) law."""
    j = np.abs(steps) % law.n
    j = j[(j < law.r) == inner]
    edges = part_edges(law, inner)
    observed = np.bincount(np.searchsorted(edges, j, side="right") - 1, minlength=SUB_BINS)
    probabilities = np.array([law.positions(int(a), int(c)) for a, c in zip(edges[:-1], edges[1:])])
    return chi_square_cells(observed, probabilities / probabilities.sum())


def sign_p(steps: np.ndarray, law: FactorisedLaw) -> tuple[float, float]:
    """Negative draws among nonzero ones (1/2), and the sign's independence of the magnitude's cell
    (G = 0, 1, >= 2 crossed with inner / outer): a sign that leans one way in one part and the other way
    in the other can pass the first and fails the second."""
    nonzero = steps[steps != 0]
    fair = float(stats.binomtest(int(np.count_nonzero(nonzero < 0)), nonzero.size, 0.5).pvalue)
    m = np.abs(nonzero)
    cell = 2 * np.minimum(m // law.n, 2) + (m % law.n >= law.r)
    observed = np.bincount(2 * cell + (nonzero < 0), minlength=12)
    zero = 1 / law.normaliser
    cells = [law.block_and_part(0, True) - zero, law.block_and_part(0, False),
             law.block_and_part(1, True), law.block_and_part(1, False),
             law.from_block(2, True), law.from_block(2, False)]
    probabilities = np.repeat(np.array(cells) / (1 - zero) / 2, 2)
    return fair, chi_square_cells(observed, probabilities)


def moments_p(steps: np.ndarray, law: FactorisedLaw) -> tuple[float, float]:
    """Two-sided z-tests (central limit; 10^6 draws of a law with exponential tails) of the sample
    E|Z| and E[Z^2] against the exact ones."""
    out = []
    for k in (1, 2):
        x = np.abs(steps).astype(float) ** k
        z = (x.mean() - law.moment(k)) / (x.std(ddof=1) / math.sqrt(x.size))
        out.append(float(2 * stats.norm.sf(abs(z))))
    return out[0], out[1]


def test_the_worker_laws_are_the_fine_ones(production_noise):
    count, total = production_noise
    for noise in (count, total):
        assert Fraction(noise.law.epsilon).denominator >= 1 << 40, "epsilon should be a long dyadic fraction"
        assert 1.99 < noise.law.epsilon < 2.0
    assert count.law.grid_k is None and count.law.steps == 4  # max_events_per_group
    assert total.law.grid_k is not None and total.law.steps > 1 << 20
    # the statistical tests below need every part visible in the draws
    assert 0 < total.law.lower_steps < total.law.steps and 0 < count.law.lower_steps < count.law.steps


def test_the_worker_count_law_draws_its_exact_pmf(production_noise):
    noise, _ = production_noise
    law = noise.law
    draws = noise.apply(np.zeros(COUNT_DRAWS, np.int64), VectorisedExactNoise())
    reach = 60 * law.steps  # b^60 < 1e-50: nothing beyond
    pmf = reference_pmf(law.epsilon, law.steps, law.lower_steps, reach)
    assert chi_square_p(draws, pmf, reach) > P_MIN


def test_the_worker_sum_law_draws_its_block_index(production_noise, sum_draws):
    assert block_index_p(sum_draws, production_factorised(production_noise[1])) > P_MIN


def test_the_worker_sum_law_draws_the_inner_part_of_a_step_with_its_probability(production_noise, sum_draws):
    law = production_factorised(production_noise[1])
    assert inner_part_p(sum_draws, law) > P_MIN
    assert block_and_part_p(sum_draws, law) > P_MIN


@pytest.mark.parametrize("inner", [True, False], ids=["inner", "outer"])
def test_the_worker_sum_law_draws_uniform_positions_within_a_step(production_noise, sum_draws, inner):
    assert position_p(sum_draws, production_factorised(production_noise[1]), inner) > P_MIN


def test_the_worker_sum_law_draws_a_fair_sign(production_noise, sum_draws):
    fair, independent = sign_p(sum_draws, production_factorised(production_noise[1]))
    assert fair > P_MIN and independent > P_MIN


def test_the_worker_sum_law_draws_its_exact_moments(production_noise, sum_draws):
    mean_abs, second = moments_p(sum_draws, production_factorised(production_noise[1]))
    assert mean_abs > P_MIN and second > P_MIN


@pytest.mark.parametrize(("epsilon", "n", "r"), [(1.999999998, 4, 2), (1.999999998, 7, 3), (0.5, 5, 2), (3.0, 1, 1)])
def test_the_factorised_reference_is_the_density(epsilon, n, r):
    # the parts above must be the density's own: check them against it by brute-force summation
    epsilon = exact_epsilon(epsilon)
    law = FactorisedLaw(epsilon, n, r)
    reach = int(80 * n / epsilon)
    pmf = reference_pmf(epsilon, n, r, reach)
    z = np.arange(-reach, reach + 1)
    m = np.abs(z)
    assert pmf[reach] == pytest.approx(1 / law.normaliser, rel=1e-12)
    for g in range(4):
        assert law.block(g) == pytest.approx(pmf[m // n == g].sum(), rel=1e-12)
        for inner in (True, False):
            in_part = (m // n == g) & ((m % n < r) == inner)
            assert law.block_and_part(g, inner) == pytest.approx(pmf[in_part].sum(), rel=1e-12, abs=1e-300)
    for g in (1, 3):
        assert law.from_block(g) == pytest.approx(pmf[m // n >= g].sum(), rel=1e-12)
        for inner in (True, False):
            in_part = (m // n >= g) & ((m % n < r) == inner)
            assert law.from_block(g, inner) == pytest.approx(pmf[in_part].sum(), rel=1e-12, abs=1e-300)
    assert law.inner == pytest.approx(pmf[m % n < r].sum(), rel=1e-12)
    for lo, hi in ((0, r), (0, 1), (r - 1, r)) + (((r, n), (n - 1, n)) if r < n else ()):
        assert law.positions(lo, hi) == pytest.approx(pmf[(m % n >= lo) & (m % n < hi)].sum(), rel=1e-12)
    assert law.moment(1) == pytest.approx(float((m * pmf).sum()), rel=1e-12)
    assert law.moment(2) == pytest.approx(float((m * m * pmf).sum()), rel=1e-12)


# --- every class of random words, enumerated ------------------------------------------------------
#
# The exact samplers read a random 64-bit word only as `w < c` (rejection limits, Bernoulli thresholds),
# `w % m` (a uniform integer) or `w & 1` (a fair coin); `w & (2^64 - 1)` keeps it whole. So the words
# that take the sampler down one path form, per word, an interval cut out by comparisons, then perhaps
# one residue class of it, and the path's probability is a product of exact counts over 2^64. The
# sampler is handed placeholder words whose every read is a branch point; each path is replayed from the
# start with its branch choices (the sampler is a deterministic function of its words), the next one
# found by backtracking, depth first. A path whose probability falls below the floor stops there and
# its probability counts as unexplored: every outcome's enumerated probability is then exact and at
# most its true one, and falls short of it by at most the unexplored total. The words' denominators
# must stay small (every residue is a branch), hence epsilon 1/2 and 1 rather than the worker's 2^52.
#
# Seen on doctored samplers: r off by one either way, the coin taken from r + 1 on, or a negative zero
# kept put 9% to 107% more on some outcome than the density; P(negative) = 0.55 breaks P(z) = P(-z);
# J = word % n (a bias of 2^-64) breaks the positions' equality; at epsilon 1 the blocks' epsilon or
# the step coin's exponent 10% high breaks the levels' equality. At epsilon 1/2 the coin 10% high
# passes (no probability moves by more than the unexplored mass): the tests above catch 1%.

WORD = 1 << 64
# (epsilon, n, r, floor, most unexplored mass, whether the blocks' factor and the step's coin are one coin)
ENUMERATED_LAWS = [(0.5, 3, 2, Fraction(1, 10_000), 0.15, False), (1.0, 3, 2, Fraction(1, 10_000), 0.1, True)]


class _BelowFloor(Exception):
    """The path's probability fell below the enumeration's floor."""


class WordClasses:
    """Runs ``draw(bits)`` on every class of random words with probability at least ``floor``."""

    def __init__(self, floor: Fraction, max_branches: int = 10_000) -> None:
        self.floor = floor
        self.max_branches = max_branches

    def run(self, draw):  # type: ignore[no-untyped-def]
        """``({outcome: exact probability}, unexplored probability)``."""
        outcomes: dict = {}
        unexplored = Fraction(0)
        self._choices: list[list[int]] = []  # [chosen branch, branches] at each branch point of the path
        while True:
            self._at, self._weight, self._words = 0, Fraction(1), []
            try:
                outcome = draw(self._bits)
                outcomes[outcome] = outcomes.get(outcome, Fraction(0)) + self._weight
            except _BelowFloor:
                unexplored += self._weight
            del self._choices[self._at:]
            while self._choices and self._choices[-1][0] == self._choices[-1][1] - 1:
                self._choices.pop()
            if not self._choices:
                return outcomes, unexplored
            self._choices[-1][0] += 1

    def _bits(self, n: int) -> np.ndarray:
        words = np.zeros(n, dtype=np.uint64).view(_TracedWords)
        words.ids = np.arange(len(self._words), len(self._words) + n)
        words.source = self
        self._words.extend([(0, WORD)] * n)  # each word: the interval its class lies in, None once read whole
        return words

    def _branch(self, size: int, options: list) -> object:
        options = [(count, value) for count, value in options if count > 0]
        if self._at == len(self._choices):
            assert self._at < self.max_branches, "a path reads more words than any sound sampler of these laws"
            self._choices.append([0, len(options)])
        chosen, branches = self._choices[self._at]
        assert branches == len(options), "the sampler is not a deterministic function of its words"
        self._at += 1
        count, value = options[chosen]
        self._weight *= Fraction(count, size)
        if self._weight < self.floor:
            raise _BelowFloor
        return value

    def less(self, word: int, c: int) -> bool:
        lo, hi = self._interval(word)
        below, above = (lo, min(hi, c)), (max(lo, c), hi)
        outcome, self._words[word] = self._branch(hi - lo, [(below[1] - below[0], (True, below)),
                                                            (above[1] - above[0], (False, above))])
        return outcome

    def residue(self, word: int, m: int) -> int:
        lo, hi = self._interval(word)
        assert 1 <= m <= 4096, f"a residue modulo {m}: too many branches to enumerate"
        self._words[word] = None

        def count(r: int) -> int:  # x in [lo, hi) with x = r mod m
            return max(0, (hi - r + m - 1) // m) - max(0, (lo - r + m - 1) // m)

        return self._branch(hi - lo, [(count(r), r) for r in range(m)])

    def _interval(self, word: int) -> tuple[int, int]:
        interval = self._words[word]
        assert interval is not None, "a word was read again after its value was used"
        return interval


class _TracedWords(np.ndarray):
    """Placeholder uint64 words: reading them asks :class:`WordClasses` which class they are in."""

    ids: np.ndarray
    source: WordClasses

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        out = super().__getitem__(key)
        if not isinstance(out, _TracedWords):
            raise TypeError("a random word was read as a scalar: the enumeration cannot follow that read")
        out.ids, out.source = self.ids[key], self.source
        return out

    def tobytes(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise TypeError("random words read as bytes: the enumeration cannot follow that read")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):  # type: ignore[no-untyped-def]
        if method != "__call__" or kwargs or len(inputs) != 2 or inputs[0] is not self \
                or isinstance(inputs[1], _TracedWords):
            raise TypeError(f"random words read through {ufunc.__name__}: the enumeration cannot follow that read")
        constants = np.broadcast_to(np.asarray(inputs[1], dtype=np.uint64), self.shape).tolist()
        ids = self.ids.tolist()
        if ufunc is np.bitwise_and and all(c == WORD - 1 for c in constants):
            return self
        if ufunc is np.less:
            return np.array([self.source.less(i, c) for i, c in zip(ids, constants)], dtype=bool)
        if ufunc is np.remainder or (ufunc is np.bitwise_and and all(c == 1 for c in constants)):
            moduli = constants if ufunc is np.remainder else [2] * len(ids)
            return np.array([self.source.residue(i, m) for i, m in zip(ids, moduli)], dtype=np.uint64)
        raise TypeError(f"random words read through {ufunc.__name__}: the enumeration cannot follow that read")


def one_draw(law: StaircaseLaw):  # type: ignore[no-untyped-def]
    def draw(bits):  # type: ignore[no-untyped-def]
        draws, huge = law.sample(1, bits)
        assert huge == {}
        return int(draws[0])

    return draw


@dataclass(frozen=True)
class Enumerated:
    """What the enumeration of ``law``'s sampler says against the density of (epsilon, n, r)."""

    excess: float  # largest enumerated P(z) / exact P(z) - 1: at most float rounding
    shortfall: float  # largest exact P(z) - enumerated P(z): at most the unexplored mass
    unexplored: Fraction
    lopsided: int  # outcomes z with enumerated P(z) != P(-z)
    uneven: int  # (block, part) pairs whose positions do not all get the same enumerated probability
    unequal_levels: int  # weights b^L whose outcomes z > 0 do not all get the same enumerated probability


def enumerate_sampler(law: StaircaseLaw, epsilon: float, n: int, r: int, floor: Fraction) -> Enumerated:
    outcomes, unexplored = WordClasses(floor).run(one_draw(law))
    assert sum(outcomes.values()) + unexplored == 1  # the classes partition the words: nothing lost or doubled
    reach = max(60 * n, max(abs(z) for z in outcomes))
    pmf = reference_pmf(epsilon, n, r, reach)
    enumerated = np.zeros(2 * reach + 1)
    for z, p in outcomes.items():
        enumerated[z + reach] = float(p)
    # Exact equalities, whatever the floor: the paths to z and -z differ only in the sign word's low bit,
    # those to two positions of one part of a block only in the residue a word leaves (each residue is
    # left by as many words), so their enumerated probabilities are equal fractions.
    lopsided = sum(outcomes[z] != outcomes.get(-z) for z in outcomes if z != 0)
    parts: dict[tuple[int, bool], list[Fraction]] = {}
    for z, p in outcomes.items():
        if z > 0:
            parts.setdefault((z // n, z % n < r), []).append(p)
    positions = {(g, inner): (r if inner else n - r) - (g == 0 and inner) for g, inner in parts}  # zero apart
    uneven = sum(len(set(found)) != 1 or len(found) != positions[part] for part, found in parts.items())
    levels: dict[int, set[Fraction]] = {}
    for z, p in outcomes.items():
        if z > 0:
            levels.setdefault((z + n - r) // n, set()).add(p)
    unequal_levels = sum(len(found) != 1 for found in levels.values())
    return Enumerated(float(np.max(enumerated / pmf - 1)), float(np.max(pmf - enumerated)), unexplored,
                      lopsided, uneven, unequal_levels)


@pytest.mark.parametrize(("epsilon", "n", "r", "floor", "most_unexplored", "one_coin"), ENUMERATED_LAWS)
def test_every_class_of_random_words_gives_the_density_exactly(epsilon, n, r, floor, most_unexplored, one_coin):
    law = StaircaseLaw(exact_epsilon(epsilon), n, r)
    found = enumerate_sampler(law, law.epsilon, n, r, floor)
    # no outcome gets more than its probability (float rounding of the reference aside) ...
    assert found.excess <= 1e-12
    # ... nor less than it by more than the mass left unexplored, which stays small
    assert found.shortfall <= float(found.unexplored) + 1e-15
    assert found.unexplored <= most_unexplored, "more words per draw than before: lower the floor"
    # a fair sign, independent of the magnitude; every position of a part equally likely
    assert found.lopsided == 0 and found.uneven == 0
    if one_coin:
        # At epsilon 1 each block of the geometric index costs one Bernoulli(e^-1) coin, and so does the
        # outer part of a step: a magnitude of weight b^L is reached through L such coins whichever way,
        # so outcomes of one weight have equal enumerated probabilities, exactly -- unless the geometric's
        # ratio or the step's coin is off (the floor's shortfall hides errors of 10% in either).
        assert found.unequal_levels == 0
