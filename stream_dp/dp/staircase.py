"""The staircase mechanism on a grid, sampled exactly from CSPRNG bits.

Reference: Q. Geng and P. Viswanath, "The Optimal Noise-Adding Mechanism in
Differential Privacy", IEEE Trans. Inf. Theory 62(2), 2016 (continuous
staircase; for the l1 cost the optimal step fraction is
``gamma* = 1 / (1 + e^(epsilon/2))``), and "The Optimal Mechanism in
Differential Privacy: Multidimensional Setting" / the integer-valued version
(arXiv:1312.0655), whose optimal noise for integer queries is a staircase on
the integers.

The law. Values live on a grid of step ``g`` (``g = 1`` for counts, ``2^k``
for sums); one unit moves a coordinate by at most ``n`` grid steps. With
``b = e^-epsilon`` and a step length ``r`` in ``{1, ..., n}`` the noise ``Z``
(in grid steps) has

    P(Z = z) = b^L(|z|) / C,      L(m) = floor((m + n - r) / n),

so in the block ``[G n, (G + 1) n)`` the first ``r`` magnitudes weigh ``b^G``
and the other ``n - r`` weigh ``b^(G + 1)``. ``n = 1`` is the geometric
(discrete Laplace) mechanism; as ``n`` grows with ``r / n -> gamma`` it tends
to the continuous staircase of step fraction ``gamma``.

Privacy (one coordinate). ``L`` is non-decreasing and ``L(m + n) = L(m) + 1``,
so ``|L(a) - L(a')| <= 1`` whenever ``|a - a'| <= n``; for ``|d| <= n``,
``||z| - |z + d|| <= |d| <= n``, hence ``P(Z = z) / P(Z = z + d) <= 1/b =
e^epsilon``: adding ``Z`` to a grid value that one unit moves by at most ``n``
steps is ``epsilon``-DP. A unit moves at most ``L0`` coordinates of a
per-group vector, so each coordinate gets ``epsilon / L0`` and the vector is
``epsilon``-DP by basic composition (Dwork & Roth, Theorem 3.16). Unlike
Laplace, a staircase's loss does not shrink with the size of the move, which
is why the budget is split over coordinates rather than given to the l1
sensitivity.

Sums are rounded to the grid first: two values ``Delta`` apart round to
indices at most ``ceil(Delta / g) + 1`` apart, which ``n`` covers. That needs
neighbouring group sums exactly ``Delta`` apart at most, not a float sum's
rounding more: the window engine adds each unit's sum on a finer power-of-two
grid, where float64 additions are exact (:mod:`stream_dp.windows.exact_sums`).

Sampling (all exact, from uniform random words): ``|Z| = G n + J`` with ``G``
geometric, ``P(G = i) ~ b^i``, drawn by
:func:`~stream_dp.dp.exact_sampling.geometric` at scale ``1/epsilon`` (epsilon
is a dyadic rational, kept exact), and ``J`` uniform in ``[0, n)`` kept with
probability 1 below ``r`` and ``b`` (an exact Bernoulli(exp(-epsilon)) coin)
from ``r`` on, else redrawn; a fair sign, restarting the draw on a negative
zero. No floating point touches a probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.exact_sampling import (
    INT64_SAFE,
    BitSource,
    bernoulli_exp,
    bernoulli_half,
    geometric,
    uniform_below,
)

# Epsilon is sampled as an exact fraction p / 2^56 (the geometric sampler's
# scale numerator is at most 2^56); a coordinate's epsilon is rounded down to it.
_EPSILON_DENOMINATOR_BITS = 56
MAX_COORDINATE_EPSILON = 64.0
# Steps per sensitivity of the automatic grid for sums: rounding widens a step by 1 / 2^20.
SUM_GRID_STEPS_BITS = 20
# Every step length is tried up to this many steps; beyond, those near gamma* n.
_EXHAUSTIVE_STEPS = 4096


def exact_epsilon(epsilon: float) -> float:
    """The largest float ``<= epsilon`` whose fraction has a denominator of at most ``2^56``.

    :raises ValueError: for epsilon outside ``(0, 64]`` or below ``2^-56``.
    """
    if not (isinstance(epsilon, float | int) and math.isfinite(epsilon) and 0 < epsilon <= MAX_COORDINATE_EPSILON):
        raise ValueError(
            f"a staircase coordinate's epsilon must be in (0, {MAX_COORDINATE_EPSILON:g}], got {epsilon!r}; "
            "lower epsilon or raise max_groups_per_unit's share"
        )
    numerator = math.floor(Fraction(epsilon) * (1 << _EPSILON_DENOMINATOR_BITS))
    if numerator < 1:
        raise ValueError(f"epsilon {epsilon!r} is below 2^-56 per coordinate; the staircase needs a larger epsilon")
    return float(Fraction(numerator, 1 << _EPSILON_DENOMINATOR_BITS))


def optimal_gamma(epsilon: float) -> float:
    """Geng & Viswanath's l1-optimal step fraction ``1 / (1 + e^(epsilon/2))``."""
    return 1.0 / (1.0 + math.exp(epsilon / 2.0))


@dataclass(frozen=True, slots=True)
class StaircaseLaw:
    """The noise law above: ``epsilon`` per coordinate, ``steps`` = n, ``lower_steps`` = r, grid ``2^k``.

    Use :meth:`best` to choose ``r``. ``grid_k=None`` is the integer grid (counts).
    """

    epsilon: float
    steps: int
    lower_steps: int
    grid_k: int | None = None

    def __post_init__(self) -> None:
        if exact_epsilon(self.epsilon) != self.epsilon:
            raise ValueError(f"epsilon {self.epsilon!r} is not exact on 2^-56; pass exact_epsilon(epsilon)")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps < 1 << 40:
            raise ValueError(f"steps must be an int in [1, 2^40), got {self.steps!r}")
        if not isinstance(self.lower_steps, int) or not 1 <= self.lower_steps <= self.steps:
            raise ValueError(f"lower_steps must be an int in [1, steps={self.steps}], got {self.lower_steps!r}")

    @classmethod
    def best(cls, epsilon: float, steps: int, grid_k: int | None = None) -> StaircaseLaw:
        """The law of least ``E|Z|`` among step lengths ``r`` (all of them up to 4096 steps)."""
        epsilon = exact_epsilon(epsilon)
        if steps <= _EXHAUSTIVE_STEPS:
            candidates = range(1, steps + 1)
        else:
            centre = round(optimal_gamma(epsilon) * steps)
            candidates = range(max(1, centre - 2), min(steps, centre + 2) + 1)
        laws = [cls(epsilon, steps, r, grid_k) for r in candidates]
        return min(laws, key=lambda law: law.mean_abs_steps)

    # --- exact moments (in grid steps, then value units) ---------------------------

    @property
    def _b(self) -> float:
        return math.exp(-self.epsilon)

    @property
    def _one_minus_b(self) -> float:
        return -math.expm1(-self.epsilon)

    @property
    def _block_weight(self) -> float:
        """``c = r + (n - r) b``: the weight of one block relative to its first magnitude."""
        return self.lower_steps + (self.steps - self.lower_steps) * self._b

    @property
    def _normaliser(self) -> float:
        """``C = 2 c / (1 - b) - 1`` (every magnitude twice, zero once)."""
        return 2.0 * self._block_weight / self._one_minus_b - 1.0

    @property
    def mean_abs_steps(self) -> float:
        """``E|Z|`` in grid steps."""
        n, r, b, q = self.steps, self.lower_steps, self._b, self._one_minus_b
        t1 = r * (r - 1) / 2 + b * (n * (n - 1) / 2 - r * (r - 1) / 2)
        s1 = n * self._block_weight * b / q**2 + t1 / q
        return 2.0 * s1 / self._normaliser

    @property
    def variance_steps(self) -> float:
        """``E[Z^2]`` in grid steps squared (the mean is 0)."""
        n, r, b, q = self.steps, self.lower_steps, self._b, self._one_minus_b

        def squares_below(x: int) -> float:
            return (x - 1) * x * (2 * x - 1) / 6

        t1 = r * (r - 1) / 2 + b * (n * (n - 1) / 2 - r * (r - 1) / 2)
        t2 = squares_below(r) + b * (squares_below(n) - squares_below(r))
        s2 = n * n * self._block_weight * b * (1 + b) / q**3 + 2 * n * t1 * b / q**2 + t2 / q
        return 2.0 * s2 / self._normaliser

    @property
    def grid(self) -> float:
        return 1.0 if self.grid_k is None else math.ldexp(1.0, self.grid_k)

    @property
    def std(self) -> float:
        return math.sqrt(self.variance_steps) * self.grid

    @property
    def mean_abs(self) -> float:
        return self.mean_abs_steps * self.grid

    def pmf(self, z: NDArray[np.int64]) -> NDArray[np.float64]:
        """``P(Z = z)`` for grid steps ``z``."""
        m = np.abs(np.asarray(z, dtype=np.int64))
        level = (m + self.steps - self.lower_steps) // self.steps
        return np.exp(-self.epsilon * level) / self._normaliser

    def _mass_within(self, m: int) -> float:
        """``P(|Z| <= m)``."""
        blocks, j = divmod(m, self.steps)
        b = self._b
        below = self._block_weight * -math.expm1(blocks * math.log(b)) / self._one_minus_b
        partial = b**blocks * (min(j + 1, self.lower_steps) + b * max(0, j + 1 - self.lower_steps))
        return (2.0 * (below + partial) - 1.0) / self._normaliser

    def half_width_steps(self, alpha: float = 0.05) -> int:
        """Smallest ``h`` with ``P(|Z| <= h) >= 1 - alpha``."""
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}; use 0.05 for a 95% interval")
        hi = 1
        while self._mass_within(hi) < 1.0 - alpha:
            hi *= 2
        lo = 0
        while lo < hi:
            mid = (lo + hi) // 2
            if self._mass_within(mid) >= 1.0 - alpha:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def ci_half_width(self, alpha: float = 0.05) -> float:
        """Half-width of a ``1 - alpha`` interval for the true value; on a sum's grid one more
        step covers the input's rounding."""
        extra = 0 if self.grid_k is None else 1
        return (self.half_width_steps(alpha) + extra) * self.grid

    def laplace_peer(self) -> StaircaseLaw:
        """The geometric (discrete Laplace) law of the same epsilon and move of ``n`` steps: ``n = 1``
        on a grid ``n`` times as fine in epsilon, i.e. ``P(z) ~ exp(-epsilon |z| / n)``."""
        return StaircaseLaw(exact_epsilon(self.epsilon / self.steps), 1, 1, self.grid_k)

    # --- sampling -------------------------------------------------------------------

    def sample(self, size: int, bits: BitSource) -> tuple[NDArray[np.int64], dict[int, int]]:
        """``size`` draws of ``Z`` in grid steps; ``{index: draw}`` holds those of magnitude ``>= 2^62``
        (their int64 slot is 0), so callers add them exactly."""
        p, q = Fraction(self.epsilon).as_integer_ratio()
        n = self.steps
        draws = np.zeros(size, dtype=np.int64)
        huge: dict[int, int] = {}
        pending = np.arange(size)
        while pending.size:
            blocks, big_blocks = geometric(pending.size, q, p, bits)  # P(G = i) ~ exp(-i p / q)
            within = self._within_block(pending.size, bits).astype(np.int64)
            negative = bernoulli_half(pending.size, bits)
            big = blocks > (INT64_SAFE - n) // n  # G n + J would reach 2^62
            big[list(big_blocks)] = True
            for i in np.flatnonzero(big).tolist():  # nonzero, so never restarted
                magnitude = big_blocks.get(i, int(blocks[i])) * n + int(within[i])
                huge[int(pending[i])] = -magnitude if negative[i] else magnitude
            magnitudes = np.where(big, 0, np.where(big, 0, blocks) * n + within)
            draws[pending] = np.where(negative, -magnitudes, magnitudes)
            pending = pending[~big & negative & (magnitudes == 0)]  # a negative zero starts over
        return draws, huge

    def _within_block(self, size: int, bits: BitSource) -> NDArray[np.uint64]:
        """``J`` in ``[0, n)`` with weight 1 below ``r`` and ``b`` from ``r`` on (by rejection)."""
        p, q = Fraction(self.epsilon).as_integer_ratio()
        out = np.zeros(size, dtype=np.uint64)
        pending = np.arange(size)
        while pending.size:
            j = uniform_below(np.full(pending.size, np.uint64(self.steps)), bits)
            upper = np.flatnonzero(j >= np.uint64(self.lower_steps))
            kept = np.ones(pending.size, dtype=bool)
            kept[upper] = bernoulli_exp(np.full(upper.size, np.uint64(p)), np.uint64(q), bits)
            out[pending[kept]] = j[kept]
            pending = pending[~kept]
        return out

    def describe(self) -> dict[str, Any]:
        peer = self.laplace_peer()
        return {
            "noise": "staircase",
            "epsilon_per_group": self.epsilon,
            "steps": self.steps,
            "lower_steps": self.lower_steps,
            "gamma": self.lower_steps / self.steps,
            "grid": self.grid,
            "std": self.std,
            "mean_abs_error": self.mean_abs,
            "ci95": self.ci_half_width(0.05),
            "geometric_std": peer.std,
            "geometric_mean_abs_error": peer.mean_abs,
        }


@dataclass(frozen=True, slots=True)
class CalibratedStaircase:
    """Staircase noise for one per-group vector (the counterpart of
    :class:`~stream_dp.dp.calibration.CalibratedNoise`; build it with
    :func:`calibrate_staircase_counts` or :func:`calibrate_staircase_sums`).

    :param law: the noise of one coordinate.
    :param l0: coordinates one unit may move (each gets ``epsilon / l0``).
    :param sensitivity: the largest move of one coordinate, in value units.
    :param cost: epsilon of the whole vector, ``l0 * law.epsilon``.
    """

    law: StaircaseLaw
    l0: int
    sensitivity: float
    cost: float
    kind: str = "staircase"
    max_groups: None = None
    rounding_cost: float = 0.0  # rounding widens the stairs (accuracy), never the loss

    @property
    def float_grid_k(self) -> int | None:
        return self.law.grid_k

    @property
    def scale(self) -> float:
        """Width of one stair in value units (``n`` grid steps)."""
        return self.law.steps * self.law.grid

    @property
    def std(self) -> float:
        return self.law.std

    def ci_half_width(self, alpha: float = 0.05) -> float:
        return self.law.ci_half_width(alpha)

    def apply(self, values: NDArray[Any], noise: Any, *, changed: int | None = None) -> NDArray[Any]:
        """Noise a vector (``int64`` counts or ``float64`` sums) with words from ``noise.words``.

        ``changed`` is accepted as ``CalibratedNoise.apply`` takes it; the staircase's law is exact on its
        grid, so its cost does not depend on how many values are noised."""
        from stream_dp.dp.vectorised_noise import add_grid_noise, add_integer_noise

        values = np.asarray(values)
        if values.ndim != 1:
            raise ValueError(f"noise is added to 1-d vectors, got shape {values.shape}; flatten the array first")
        draws, huge = self.law.sample(values.size, noise.words)
        if self.law.grid_k is None:  # saturating, as the Laplace counts
            return add_integer_noise(np.ascontiguousarray(values, dtype=np.int64), draws, huge)
        return add_grid_noise(np.ascontiguousarray(values, dtype=np.float64), self.law.grid_k, draws, huge)

    def describe(self) -> dict[str, Any]:
        return {**self.law.describe(), "scale": self.scale, "sensitivity": self.sensitivity,
                "sensitivity_norm": "linf per group", "max_groups_per_unit": self.l0, "epsilon": self.cost,
                "float_grid_k": self.law.grid_k, "max_groups": None, "float_rounding_epsilon": 0.0}


def _per_group_epsilon(epsilon: float, l0: int) -> float:
    """``epsilon / l0`` rounded down to an exact dyadic, so that ``l0`` groups spend at most ``epsilon``."""
    share = exact_epsilon(min(epsilon / l0, MAX_COORDINATE_EPSILON))
    while Fraction(share) * l0 > Fraction(epsilon):
        share = exact_epsilon(math.nextafter(share, 0.0))
    return share


def calibrate_staircase_counts(epsilon: float, *, max_groups_per_unit: int, max_events_per_group: int
                               ) -> CalibratedStaircase:
    """Integer staircase for a count vector: ``n = max_events_per_group`` steps, ``epsilon / L0`` per group.

    With ``max_events_per_group = 1`` it is the geometric mechanism itself (the optimum for counts of sensitivity 1).
    """
    share = _per_group_epsilon(epsilon, max_groups_per_unit)
    law = StaircaseLaw.best(share, int(max_events_per_group))
    return CalibratedStaircase(law, max_groups_per_unit, float(max_events_per_group),
                               float(Fraction(share) * max_groups_per_unit))


def calibrate_staircase_sums(epsilon: float, *, max_groups_per_unit: int, per_group_sensitivity: float
                             ) -> CalibratedStaircase:
    """Staircase on a grid of about ``2^-20`` of the per-group sensitivity for a clipped-sum vector."""
    if not (math.isfinite(per_group_sensitivity) and per_group_sensitivity > 0):
        raise ValueError(f"a sum's per-group sensitivity must be positive and finite, got {per_group_sensitivity}")
    share = _per_group_epsilon(epsilon, max_groups_per_unit)
    k = math.floor(math.log2(per_group_sensitivity)) - SUM_GRID_STEPS_BITS
    steps = math.ceil(Fraction(per_group_sensitivity) / Fraction(2) ** k) + 1  # + 1: both sides' rounding
    law = StaircaseLaw.best(share, steps, k)
    return CalibratedStaircase(law, max_groups_per_unit, float(per_group_sensitivity),
                               float(Fraction(share) * max_groups_per_unit))
