"""Empirical privacy-loss lower bounds from two samples of a mechanism's output.

For neighbouring inputs D and D' and any set S of outputs, an (epsilon,
delta)-DP mechanism M satisfies P[M(D') in S] <= e^epsilon P[M(D) in S] +
delta, both ways round. Each threshold set S = {x >= t} or {x <= t} gives,
from n independent outputs on each side, a one-sided Clopper-Pearson lower
bound on P[M(D') in S] and an upper bound on P[M(D) in S], hence

    epsilon >= ln((lower(P[M(D') in S]) - delta) / upper(P[M(D) in S]))

with confidence 1 - 2 alpha_test. Every threshold, tail and direction tried
is one test; alpha is split over all of them (Bonferroni), so the largest
bound is a valid simultaneous lower bound at confidence 1 - alpha. A sound
mechanism gives a bound at most its claimed epsilon except with probability
alpha; an unsound one (a unit counted three times, say) gives a bound well
above it when n is large enough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta

DEFAULT_ALPHA = 0.01  # 1% chance that a sound release is reported above its epsilon, over all tests of a scenario


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """One-sided ``alpha`` Clopper-Pearson bounds (lower, upper) of a binomial proportion."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes} of {trials}")
    lower = 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1 - alpha, successes + 1, trials - successes))
    return lower, upper


@dataclass(frozen=True)
class EpsilonBound:
    """The largest bound over all tests, and the test that gave it."""

    epsilon: float  # -inf when no test bounds anything
    threshold: float | None
    tail: str | None  # ">=" or "<="
    direction: str | None  # "D' over D" or "D over D'"
    tests: int


def epsilon_lower_bound(
    samples_d: Sequence[float] | np.ndarray,
    samples_d_prime: Sequence[float] | np.ndarray,
    thresholds: Sequence[float],
    *,
    delta: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
) -> EpsilonBound:
    """A simultaneous (1 - alpha) lower bound on epsilon from threshold tests (see the module docstring)."""
    d = np.asarray(samples_d, dtype=np.float64)
    d_prime = np.asarray(samples_d_prime, dtype=np.float64)
    if not len(d) or not len(d_prime):
        raise ValueError("both samples need at least one output")
    if not thresholds:
        raise ValueError("give at least one threshold")
    tests = len(thresholds) * 2 * 2
    per_bound = alpha / (2 * tests)  # two one-sided bounds per test
    best = EpsilonBound(-math.inf, None, None, None, tests)
    for t in thresholds:
        for tail in (">=", "<="):
            in_d = int(np.count_nonzero(d >= t if tail == ">=" else d <= t))
            in_d_prime = int(np.count_nonzero(d_prime >= t if tail == ">=" else d_prime <= t))
            for direction, (k_num, n_num), (k_den, n_den) in (
                ("D' over D", (in_d_prime, len(d_prime)), (in_d, len(d))),
                ("D over D'", (in_d, len(d)), (in_d_prime, len(d_prime))),
            ):
                numerator = clopper_pearson(k_num, n_num, per_bound)[0] - delta
                denominator = clopper_pearson(k_den, n_den, per_bound)[1]
                if numerator <= 0 or denominator <= 0:
                    continue
                bound = math.log(numerator / denominator)
                if bound > best.epsilon:
                    best = EpsilonBound(bound, float(t), tail, direction, tests)
    return best


def grid(samples_d: np.ndarray, samples_d_prime: np.ndarray, points: int = 24) -> list[float]:
    """Thresholds spread over the pooled outputs (quantiles: they do not look at which side is which)."""
    pooled = np.concatenate([np.asarray(samples_d, float), np.asarray(samples_d_prime, float)])
    qs = np.quantile(pooled, np.linspace(0.02, 0.98, points))
    return sorted({float(q) for q in qs})


RENYI_ORDERS = (1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


def binary_renyi(p: float, q: float, order: float) -> float:
    """Renyi divergence of order ``order`` between Bernoulli(p) and Bernoulli(q), 0 < p, q < 1 (KL at 1)."""
    if order == 1.0:
        return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    return math.log(p**order * q ** (1 - order) + (1 - p) ** order * (1 - q) ** (1 - order)) / (order - 1)


@dataclass(frozen=True)
class RhoBound:
    """The largest zCDP bound over all tests, and the test that gave it."""

    rho: float  # 0 when no test bounds anything
    threshold: float | None
    tail: str | None
    direction: str | None
    order: float | None
    tests: int


def rho_lower_bound(
    samples_d: Sequence[float] | np.ndarray,
    samples_d_prime: Sequence[float] | np.ndarray,
    thresholds: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    orders: Sequence[float] = RENYI_ORDERS,
) -> RhoBound:
    """A simultaneous (1 - alpha) lower bound on a mechanism's zCDP parameter rho.

    rho-zCDP means D_a(M(D) || M(D')) <= rho a for every order a > 1 (and KL, its limit at 1),
    both ways round; by data processing the divergence between the two Bernoulli laws of any
    threshold event is at most that. Each (threshold, tail, direction) gives Clopper-Pearson bounds
    p >= lower and q <= upper on the event's two probabilities; when lower > upper, the binary
    divergence is smallest at (lower, upper) inside that box (it grows with p - q on either side of
    equality), so rho >= D_a(lower || upper) / a at every order. Alpha is split over every test
    (Bonferroni); the orders reuse the same intervals, so they cost nothing more. Against Gaussian
    noise this sees a doubled shift over the noise at far fewer samples than the (epsilon, delta)
    bound, whose delta of 1e-6 lies in tails that tens of thousands of samples do not reach.
    """
    d = np.asarray(samples_d, dtype=np.float64)
    d_prime = np.asarray(samples_d_prime, dtype=np.float64)
    if not len(d) or not len(d_prime):
        raise ValueError("both samples need at least one output")
    if not thresholds:
        raise ValueError("give at least one threshold")
    tests = len(thresholds) * 2 * 2
    per_bound = alpha / (2 * tests)
    best = RhoBound(0.0, None, None, None, None, tests)
    for t in thresholds:
        for tail in (">=", "<="):
            in_d = int(np.count_nonzero(d >= t if tail == ">=" else d <= t))
            in_d_prime = int(np.count_nonzero(d_prime >= t if tail == ">=" else d_prime <= t))
            for direction, (k_p, n_p), (k_q, n_q) in (
                ("D' over D", (in_d_prime, len(d_prime)), (in_d, len(d))),
                ("D over D'", (in_d, len(d)), (in_d_prime, len(d_prime))),
            ):
                lower = clopper_pearson(k_p, n_p, per_bound)[0]
                upper = clopper_pearson(k_q, n_q, per_bound)[1]
                if not 0 < upper < lower < 1:
                    continue
                for order in orders:
                    bound = binary_renyi(lower, upper, order) / order
                    if bound > best.rho:
                        best = RhoBound(bound, float(t), tail, direction, order, tests)
    return best
