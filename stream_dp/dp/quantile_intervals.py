"""95% intervals, in the field's units, for the quantiles of each group: read off a noisy histogram.

The exponential mechanism (``stream_dp.dp.quantiles``) releases one bin edge
per quantile, whose accuracy it can state in ranks only. A value interval
needs to know where the group's values lie, which costs privacy: with
``value_interval: true`` half of the quantiles' share of epsilon goes to a
noisy histogram of each group's values, from which a 95% interval
``[lower, upper]`` for every quantile is post-processing.

**Histogram.** The group's bin counts ``h_0 .. h_{B-1}`` (the bins of
``stream_dp.dp.histogram``: bin ``b`` holds ``[c_b, c_{b+1})``, the last
one ``hi`` too) each get discrete Laplace noise of scale ``b_h``. A unit adds
at most ``Linf = max_events_per_group`` values to each of at most ``L0 =
max_groups_per_unit`` groups, each value one to one bin: the l1 sensitivity
of all groups' counts together is ``L0 Linf``, so ``b_h = L0 Linf / eps_h``
(OpenDP's ``make_laplace`` certifies it). The noisy counts are published
nowhere; only the edges below are.

**Band.** For a level ``q`` and an edge ``c_j`` (``j = 1..B``) let ``L_j`` be
the number of values below it (bins ``< j``), ``A_j = n - L_j`` the number
at or above it, and ``D_j = (1 - q) L_j - q A_j``: ``D_j >= 0`` exactly when
``L_j >= q n``. Its noisy counterpart ``D'_j`` sums the noisy bins the same
way; ``D'_j - D_j`` is ``(1 - q)`` times a sum of ``j`` independent discrete
Laplace variables minus ``q`` times a sum of ``B - j`` others. Chernoff's
bound with the discrete Laplace's moment generating function ``M(t) = (1 -
p)^2 / ((1 - p e^t)(1 - p e^-t))``, ``p = e^(-1/b_h)``, gives, for every
``t`` with ``max(q, 1 - q) t < 1/b_h``::

    P(|D'_j - D_j| >= w) <= 2 exp(-t w) M((1 - q) t)^j M(q t)^(B - j);

``w_qj`` is the least ``w`` over a grid of ``t`` that puts this at ``(1 -
CONFIDENCE) / B``. By the union bound over ``j``, with probability at least
``CONFIDENCE`` every ``|D'_j - D_j| < w_qj`` at once: the event ``E_q``. No
group size enters: ``n`` cancels out of the comparison with ``q n``.

**Interval.** Let ``k = ceil(q n)`` and ``x_(k)`` the ``k``-th smallest of the
group's (clipped) values, the quantile a record's value estimates (numpy's
``inverted_cdf``)::

    lower = c_a,  a = max{j : D'_j + w_qj < 0}    (a = 0 if none: lower = lo)
    upper = c_z,  z = min{j : D'_j - w_qj >= 0}   (z = B if none: upper = hi)

On ``E_q``: ``D_a < 0``, so ``L_a < q n <= k``: fewer than ``k`` values lie in
the bins below ``c_a`` and ``x_(k) >= c_a``; and ``D_z > 0``, so ``L_z >= q n``,
an integer, hence ``L_z >= k``: ``k`` values lie below ``c_z`` and ``x_(k) <
c_z``. So ``lower <= x_(k) <= upper`` with probability at least ``CONFIDENCE``,
per group and quantile (a group without values has no quantile to cover).
Unlike ``q_interval``, nothing here depends on how the values share bins.
The interval and the released value are drawn independently, so the value
can fall outside it (rarely: both are 95% statements about the same point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ContributionBounds
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.measurements import integer_vector_measurement
from stream_dp.dp.noise import NoiseSource
from stream_dp.dp.plan_budgets import CALIBRATION_MARGIN

CONFIDENCE = 0.95
# Chernoff parameters t = u / b_h: any u in (0, 1) gives a valid bound, the grid takes the best of these.
_CHERNOFF_U = np.concatenate([np.arange(1, 256) / 256.0, 1.0 - np.exp2(-np.arange(9, 30))])


def _log_mgf(t: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
    """``log M(t)`` of the discrete Laplace of ``scale``, for ``0 <= t < 1/scale`` (expm1 keeps small 1/scale exact)."""
    inv = 1.0 / scale
    return 2.0 * np.log(-np.expm1(-inv)) - np.log(-np.expm1(t - inv)) - np.log(-np.expm1(-t - inv))


def _chernoff_exponents(q: float, j: NDArray[np.float64], bins: int, scale: float) -> tuple[NDArray, NDArray]:
    """The grid's ``t`` and, per ``j``, ``log E e^(tX)`` of ``X = D'_j - D_j`` at level ``q`` (module docstring)."""
    t = _CHERNOFF_U / (scale * max(q, 1.0 - q))  # (G,)
    j = np.asarray(j, dtype=np.float64)[..., None]
    return t, j * _log_mgf((1.0 - q) * t, scale) + (bins - j) * _log_mgf(q * t, scale)


def tail_bound(w: float, q: float, j: int, bins: int, scale: float) -> float:
    """Chernoff's bound on ``P(|D'_j - D_j| >= w)`` at level ``q`` (module docstring), the best over the grid."""
    t, log_mgf = _chernoff_exponents(q, np.float64(j), bins, scale)
    return float(min(1.0, 2.0 * np.exp((-t * w + log_mgf).min())))


def band_widths(q: float, bins: int, scale: float, beta: float) -> NDArray[np.float64]:
    """``w_qj`` for ``j = 1..bins``: the least ``w`` over the grid with ``tail_bound <= beta / bins``.

    For one ``t`` the bound is at most the target exactly when ``w >= (log(2 / target) + log E e^(tX)) / t``.
    """
    t, log_mgf = _chernoff_exponents(q, np.arange(1, bins + 1), bins, scale)
    return ((math.log(2.0 * bins / beta) + log_mgf) / t).min(axis=1)


@dataclass(frozen=True)
class ValueIntervalPlan:
    """The noisy histogram of each group, calibrated to ``epsilon``. Use :meth:`build`."""

    q: tuple[float, ...]
    edges: NDArray[np.float64]  # the bins + 1 bin edges, as the quantiles' candidates
    scale: float  # b_h, discrete Laplace on each bin count
    band: NDArray[np.float64]  # (len(q), bins): w_qj
    loss: PrivacyLoss

    @classmethod
    def build(
        cls, *, epsilon: float, q: tuple[float, ...], edges: NDArray[np.float64], bounds: ContributionBounds
    ) -> ValueIntervalPlan:
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")
        bins = len(edges) - 1
        sensitivity = bounds.max_groups_per_unit * bounds.max_events_per_group
        scale = sensitivity / (epsilon * CALIBRATION_MARGIN)
        cost = float(integer_vector_measurement("laplace", scale).map(sensitivity))
        if cost > epsilon:
            raise RuntimeError(f"OpenDP certifies epsilon={cost} above the budget {epsilon}; nothing is released")
        band = np.stack([band_widths(level, bins, scale, 1.0 - CONFIDENCE) for level in q])
        return cls(tuple(q), np.asarray(edges, dtype=np.float64), scale, band, PrivacyLoss.pure(cost))

    @property
    def bins(self) -> int:
        return len(self.edges) - 1

    def intervals(self, counts: NDArray[np.int64], noise: NoiseSource) -> NDArray[np.float64]:
        """``(groups, len(q), 2)``: each group's ``[lower, upper]`` per quantile, from its bin ``counts``."""
        counts = np.asarray(counts, dtype=np.int64)
        noisy = noise.integers(counts.ravel(), kind="laplace", scale=self.scale).reshape(counts.shape)
        below = np.cumsum(noisy, axis=1, dtype=np.float64)  # noisy L_1 .. L_B
        above = below[:, -1:] - below  # noisy A_j: the bins from j on
        j = np.arange(1, self.bins + 1)
        out = np.empty((counts.shape[0], len(self.q), 2), dtype=np.float64)
        for i, level in enumerate(self.q):
            d = (1.0 - level) * below - level * above
            last = np.where(d + self.band[i] < 0, j, 0).max(axis=1)
            first = np.where(d - self.band[i] >= 0, j, self.bins).min(axis=1)
            lower, upper = np.minimum(last, first), np.maximum(last, first)  # ordered on E_q; kept so off it
            out[:, i, 0], out[:, i, 1] = self.edges[lower], self.edges[upper]
        return out

    def rank_reach(self) -> list[float]:
        """Per quantile, the widest ``w_qj``: an end of the interval lies about ``w`` to ``2w`` ranks off."""
        return self.band.max(axis=1).tolist()

    def describe(self) -> dict[str, Any]:
        return {"mechanism": "laplace", "noise": "discrete_laplace", "kind": "noisy_histogram",
                "scale": self.scale, "confidence": CONFIDENCE, "epsilon": self.loss.epsilon}
