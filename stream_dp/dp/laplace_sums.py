"""The exact law of a sum of ``p`` independent Laplace noises, and its confidence half-widths.

A running total of the binary tree mechanism carries the noise of ``p`` nodes
(:mod:`stream_dp.dp.continual`); its intervals come from the law of
``S = Z_1 + ... + Z_p``, computed here in closed form so that the cost does not
grow with the scale (a convolution of pmfs truncated at a tail mass of 1e-12
needs about ``55 * scale`` points per node, too many for the scales a long
period calls for).

Discrete Laplace, ``P(Z = z) = (1 - q)/(1 + q) q^|z|`` with ``q = exp(-1/scale)``.
Its probability generating function ``((1 - q)^2 / ((1 - q x)(1 - q/x)))^p``
is proper rational in ``x``; the partial fractions at the pole ``x = 1/q``
(order ``p``) carry all non-negative powers, so for ``z >= 0``

    P(S = z) = sum_{n<p} a_n C(z + n, n) q^z,

and, with ``w_n = a_n / (1 - q)^(n + 1)`` and ``NB(r)`` the number of failures
before the ``r``-th success of Bernoulli(``1 - q``) trials,

    P(S >= x) = sum_{n<p} w_n P(NB(n + 1) >= x),
    w_n = (1 + q)^-p sum_{i+j = p-1-n} C(p, i) (-1)^i C(p-1+j, j) (1 - q)^i (1 + q)^-j,
    P(NB(r) >= x) = sum_{k<r} C(x + r - 1, k) (1 - q)^k q^(x + r - 1 - k)

(the last: fewer than ``r`` successes in the first ``x + r - 1`` trials). The
alternating sum in ``w_n`` is evaluated in exact rational arithmetic on the
float ``q``, and the binomial tail as at most ``p`` positive terms in log space.

Continuous Laplace of scale ``b``: ``S = G_1 - G_2`` with ``G_i ~ Gamma(p, b)``,
and integrating ``P(G_1 > x + y)`` against the density of ``G_2`` gives, with
``v = x / b``,

    P(S > x) = e^-v sum_{n<p} c_n v^n / n!,    c_n = sum_{m <= p-1-n} C(p-1+m, m) 2^-(p+m).

For ``p = 1`` both reduce to the familiar ``q^x/(1 + q)`` and ``e^-v / 2``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.calibration import CalibratedNoise
from stream_dp.dp.release import ReleaseAccuracy

# Half-widths are chosen so that the computed tail is below alpha by this
# relative margin: it covers the float error of the evaluation, so the
# interval never covers less than claimed.
_TAIL_MARGIN = 1e-9
# Continuous quantiles are bisected to this relative width (upper end kept).
_BISECTION_WIDTH = 1e-13


def _check(terms: int, scale: float) -> None:
    if isinstance(terms, bool) or not isinstance(terms, int) or terms < 1:
        raise ValueError(f"the number of summed noises must be a positive int, got {terms!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the Laplace scale must be positive and finite, got {scale!r}")


def discrete_weights(terms: int, q: float) -> NDArray[np.float64]:
    """``w_0 .. w_{p-1}`` of the module docstring (exact rationals, rounded once)."""
    exact_q = Fraction(q)
    one_minus, one_plus = 1 - exact_q, 1 + exact_q
    weights = []
    for n in range(terms):
        m = terms - 1 - n
        total = sum(
            (-1) ** i * math.comb(terms, i) * math.comb(terms - 1 + m - i, m - i) * one_minus**i / one_plus ** (m - i)
            for i in range(m + 1)
        )
        weights.append(float(total / one_plus**terms))
    return np.asarray(weights, dtype=np.float64)


def _discrete_tail(x: int, scale: float, weights: NDArray[np.float64]) -> float:
    """``P(S >= x)`` for an integer ``x >= 0`` (module docstring); ``log q = -1/scale`` exactly."""
    terms = weights.size
    n = np.arange(terms, dtype=np.float64)[:, None]  # NB(n + 1) in row n
    k = np.arange(terms, dtype=np.float64)[None, :]
    trials = x + n  # x + r - 1 with r = n + 1
    # log C(trials, k) as a running sum of log((trials - i + 1) / i); entries with k > n are masked below
    steps = np.log(np.maximum(trials - k[:, 1:] + 1.0, 1.0) / k[:, 1:])
    log_binomial = np.concatenate([np.zeros((terms, 1)), np.cumsum(steps, axis=1)], axis=1)
    log_terms = log_binomial + k * math.log(-math.expm1(-1.0 / scale)) - (trials - k) / scale
    tails = np.where(k <= n, np.exp(log_terms), 0.0).sum(axis=1)
    return float(np.dot(weights, tails))


def discrete_laplace_sum_tail(terms: int, scale: float, x: int) -> float:
    """``P(Z_1 + ... + Z_p >= x)`` for ``p = terms`` i.i.d. discrete Laplace of ``scale`` and integer ``x >= 0``."""
    _check(terms, scale)
    return _discrete_tail(int(x), scale, discrete_weights(terms, math.exp(-1.0 / scale)))


def discrete_laplace_sum_half_width(terms: int, scale: float, alpha: float) -> float:
    """Smallest integer ``h`` with ``P(|Z_1 + ... + Z_p| <= h) >= 1 - alpha``.

    By symmetry ``P(|S| > h) = 2 P(S >= h + 1)``; the tail is decreasing in
    ``h``, so the smallest ``h`` is found by doubling and integer bisection.
    """
    _check(terms, scale)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}; use 0.05 for a 95% interval")
    weights = discrete_weights(terms, math.exp(-1.0 / scale))

    def covers(h: int) -> bool:
        return 2.0 * _discrete_tail(h + 1, scale, weights) <= alpha * (1.0 - _TAIL_MARGIN)

    if covers(0):
        return 0.0
    low, high = 0, 1  # covers(low) is False
    while not covers(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        if covers(middle):
            high = middle
        else:
            low = middle
    return float(high)


def laplace_sum_tail(terms: int, scale: float, x: float) -> float:
    """``P(L_1 + ... + L_p > x)`` for ``p = terms`` i.i.d. continuous Laplace of ``scale`` and ``x >= 0``."""
    _check(terms, scale)
    v = x / scale
    coefficients = [sum(math.comb(terms - 1 + m, m) * 2.0 ** -(terms + m) for m in range(terms - n))
                    for n in range(terms)]
    return math.exp(-v) * sum(c * v**n / math.factorial(n) for n, c in enumerate(coefficients))


def laplace_sum_quantile(terms: int, scale: float, alpha: float) -> float:
    """Smallest ``h`` (to a relative ``1e-13``, rounded up) with ``P(|L_1 + ... + L_p| <= h) >= 1 - alpha``."""
    _check(terms, scale)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}; use 0.05 for a 95% interval")

    def covers(h: float) -> bool:
        return 2.0 * laplace_sum_tail(terms, scale, h) <= alpha * (1.0 - _TAIL_MARGIN)

    low, high = 0.0, scale
    while not covers(high):
        low, high = high, 2.0 * high
    while high - low > _BISECTION_WIDTH * high:
        middle = low + (high - low) / 2.0
        if covers(middle):
            high = middle
        else:
            low = middle
    return high


def count_total_accuracy(noise: CalibratedNoise, terms: int) -> ReleaseAccuracy:
    """Exact law of the sum of ``terms`` discrete Laplace node noises (module docstring)."""
    return ReleaseAccuracy(
        std=math.sqrt(terms) * noise.std,
        ci95=discrete_laplace_sum_half_width(terms, noise.scale, 0.05),
        ci975=discrete_laplace_sum_half_width(terms, noise.scale, 0.025),
    )


def sum_total_accuracy(noise: CalibratedNoise, terms: int) -> ReleaseAccuracy:
    """Sum noise on the grid ``g = 2^k``: each node adds ``g Z`` to its input rounded to the grid.

    Coupling: ``Z = floor(E_1/g) - floor(E_2/g)`` with ``E_i`` exponential of
    mean ``scale`` is the discrete Laplace of the grid, and ``E_1 - E_2`` is
    Laplace(``scale``), so ``|g Z - (E_1 - E_2)| < g``; with the rounding
    (at most ``g`` per node, as :mod:`stream_dp.dp.accuracy` counts it) the
    total error is within ``2 p g`` of a sum of ``p`` continuous Laplace noises,
    whose exact quantile gives the half-width.
    """
    assert noise.float_grid_k is not None
    slack = 2.0 * terms * math.ldexp(1.0, noise.float_grid_k)
    return ReleaseAccuracy(
        std=math.sqrt(terms) * noise.std,
        ci95=laplace_sum_quantile(terms, noise.scale, 0.05) + slack,
        ci975=laplace_sum_quantile(terms, noise.scale, 0.025) + slack,
    )
