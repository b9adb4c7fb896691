"""Standard deviations and confidence intervals of the noisy values.

All noise in :mod:`stream_dp.dp` is integer noise on a grid ``g = 2^k``
(``g = 1`` for counts): ``Y = round_g(x) + g * Z`` with ``Z`` discrete Laplace
of scale ``s = scale / g`` or discrete Gaussian of ``sigma = scale / g``, and
``|round_g(x) - x| <= g``. A half-width ``h`` below guarantees

    P(|Y - x| <= h) >= 1 - alpha

for the *closed* interval ``[Y - h, Y + h]``; the intervals depend only on the
noise scale (and, for means, on noisy values), never on the private data.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ClipRange
from stream_dp.dp.measurements import NoiseKind, opendp

# Above this many grid units OpenDP's exact discrete-Gaussian accuracy loops
# for too long; the closed-form bound below is used instead.
_EXACT_GAUSSIAN_LIMIT = 1e4
# The exact discrete-Gaussian variance is summed below this sigma; above it
# the variance equals sigma^2 to within exp(-2 pi^2 sigma^2).
_EXACT_VARIANCE_LIMIT = 50.0


def _discrete_laplace_variance(scale: float) -> float:
    """``Var Z = 2q / (1 - q)^2`` with ``q = exp(-1/scale)`` (two-sided geometric)."""
    one_minus_q = -math.expm1(-1.0 / scale)
    q = 1.0 - one_minus_q
    return 2.0 * q / (one_minus_q * one_minus_q)


def _discrete_gaussian_variance(sigma: float) -> float:
    """Exact for small sigma (summed over +-40 sigma); else ``sigma^2``, an
    upper bound (the discrete Gaussian's variance is below sigma^2, Canonne,
    Kamath & Steinke 2020) that is tight to ``exp(-2 pi^2 sigma^2)`` relative
    once sigma exceeds a few units."""
    if sigma >= _EXACT_VARIANCE_LIMIT:
        return sigma * sigma
    support = np.arange(-math.ceil(40 * sigma) - 1, math.ceil(40 * sigma) + 2, dtype=np.float64)
    weights = np.exp(-(support**2) / (2.0 * sigma * sigma))
    return float(np.sum(support**2 * weights) / np.sum(weights))


def noise_std(kind: NoiseKind, scale: float, k: int | None = None) -> float:
    """Standard deviation of the noise ``g * Z`` (``k=None``: integer noise, ``g = 1``).

    The deterministic rounding of the input (at most ``g``) is not included;
    it is included in :func:`noise_ci_half_width`.
    """
    grid = 1.0 if k is None else math.ldexp(1.0, k)
    units = scale / grid
    variance = _discrete_laplace_variance(units) if kind == "laplace" else _discrete_gaussian_variance(units)
    return grid * math.sqrt(variance)


def _integer_half_width(kind: NoiseKind, units: float, alpha: float) -> float:
    """Smallest-known integer ``h`` with ``P(|Z| <= h) >= 1 - alpha`` (``Z`` in grid units).

    OpenDP's accuracy ``a`` satisfies ``P(|Z| >= a) <= alpha``; for integer ``Z``
    that gives ``P(|Z| <= ceil(a) - 1) >= 1 - alpha``.

    For the discrete Gaussian with large ``sigma`` a closed form is used: the
    normaliser ``sum_x exp(-x^2/2 sigma^2)`` is at least ``sqrt(2 pi) sigma``
    (Poisson summation) and ``exp(-x^2/2 sigma^2) <= int_{x-1}^{x} exp(-y^2/2 sigma^2) dy``
    for ``x >= 1``, so ``P(|Z| >= t) <= P(|N(0, sigma^2)| >= t - 1)`` and
    ``h = ceil(z_{1-alpha/2} sigma)`` suffices.
    """
    dp = opendp()
    if kind == "laplace":
        return float(math.ceil(dp.discrete_laplacian_scale_to_accuracy(units, alpha, T=float)) - 1)
    # a relative slack of 1e-12 covers rounding in the normal quantile
    bound = float(math.ceil(NormalDist().inv_cdf(1.0 - alpha / 2.0) * units * (1.0 + 1e-12)))
    if units <= _EXACT_GAUSSIAN_LIMIT:
        exact = float(math.ceil(dp.discrete_gaussian_scale_to_accuracy(units, alpha, T=float)) - 1)
        return min(exact, bound)
    return bound


def noise_ci_half_width(kind: NoiseKind, scale: float, k: int | None = None, alpha: float = 0.05) -> float:
    """Half-width ``h`` of a ``1 - alpha`` confidence interval ``[Y - h, Y + h]`` for ``x``.

    Integer noise: ``h`` from :func:`_integer_half_width`. Grid ``2^k``:
    ``2^k * (h_units + 1)``, the extra grid step covering the input rounding.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}; use 0.05 for a 95% interval")
    if k is None:
        return _integer_half_width(kind, scale, alpha)
    grid = math.ldexp(1.0, k)
    return grid * (_integer_half_width(kind, scale / grid, alpha) + 1.0)


def mean_with_ci(
    count: NDArray[np.int64],
    total: NDArray[np.float64],
    count_half_width: float,
    sum_half_width: float,
    clip: ClipRange,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Noisy means ``clip(sum / max(count, 1))`` and conservative CI half-widths.

    The mean is post-processing of the noisy count and sum (no extra privacy
    cost; Dwork & Roth Proposition 2.1); clamping into ``[lo, hi]`` is too,
    and the true mean lies there anyway.

    Interval (Bonferroni + interval arithmetic): pass half-widths at level
    ``1 - alpha/2`` each; then with probability ``>= 1 - alpha`` the true sum is
    in ``[S - h_s, S + h_s]`` and the true count in ``[C - h_c, C + h_c]``; a
    group with a mean has count ``>= 1``, so the true mean ``S/C`` lies between
    the extreme corner ratios of that box (``C`` positive, ratio monotone in
    each coordinate), intersected with ``[lo, hi]``. The half-width returned is
    the larger distance from the released mean to either end of that
    interval, so the symmetric interval contains it. When ``C + h_c < 1`` the
    interval is the whole clip range; so it is when the box's ratios all fall
    outside ``[lo, hi]`` (possible only when one of the two intervals missed),
    rather than a misleading zero width.
    """
    count_f = count.astype(np.float64)
    mean = np.clip(total / np.maximum(count_f, 1.0), clip.lo, clip.hi)
    count_low = np.maximum(count_f - count_half_width, 1.0)
    count_high = count_f + count_half_width
    informative = count_high >= 1.0
    count_high = np.maximum(count_high, 1.0)
    sum_low, sum_high = total - sum_half_width, total + sum_half_width
    corners = np.stack([sum_low / count_low, sum_low / count_high, sum_high / count_low, sum_high / count_high])
    lowest, highest = corners.min(axis=0), corners.max(axis=0)
    informative &= (highest >= clip.lo) & (lowest <= clip.hi)
    lower = np.where(informative, np.clip(lowest, clip.lo, clip.hi), clip.lo)
    upper = np.where(informative, np.clip(highest, clip.lo, clip.hi), clip.hi)
    half_width = np.maximum(np.maximum(mean - lower, upper - mean), 0.0)
    return mean, half_width
