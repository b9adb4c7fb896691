"""Each unit's clipped sum in a group on a power-of-two grid, so that group sums are exact.

Why. A release's sensitivity argument needs neighbouring group sums to differ
by the one unit's contribution, at most ``Delta = max_events_per_group *
max(|clip_lo|, |clip_hi|)``. Added up in floating point they need not: taking
one unit out changes how every later addition rounds, so an adversary who
picks the other units' values can move the float sum by more than ``Delta``
(a few grid steps of the staircase's sum grid with ~445k units). Laplace and
Gaussian releases lose almost nothing from that; the staircase's loss doubles
one grid step beyond its stair.

How. Each pair's sum (one unit, one group, ``c`` events) is rounded to the
nearest multiple of ``g = 2^k`` with ``k = floor(log2 Delta) - PAIR_SUM_STEPS_LOG2``,
then moved toward the interior onto the grid points of ``[c lo, c hi]`` (in
exact arithmetic, ``lo`` and ``hi`` the clip bounds as the floats they are):
a unit's contribution stays within what ``c`` clipped values can add up to,
so every group sum stays within ``[count lo, count hi]``, the range the
release checks (``stream_dp.dp.inputs.as_sums``). Rounding to the nearest
point alone is not enough for a bound not exact in binary: 0.3 is put on the
grid point just above ``0.3``, and a release would then refuse the window of
the unit that sent it. The clip range must be at least one grid step wide
(:class:`PairSumGrid` refuses a narrower one), so that every such interval
holds a grid point. Multiples of ``g`` add up exactly in float64 as long as every partial sum
stays below ``2^53 g`` in magnitude, which holds in any order while the
magnitudes of a group's pair sums in a window add up to less than
``2^26 Delta`` (67 million units at the full bound; ``2^53 g > 2^53 Delta /
2^27``): each addition is then exact, across batches, partitions and
partials. Beyond that, additions may round again, by a grid step or more,
which the staircase's one step of widening does not cover: a limit of this
release (the order of additions is by keyed hash, which no producer
chooses). The rounding moves a unit's sum by about a grid step at most,
``g <= Delta / 2^26`` (half of one unless the interval's edge is nearer): a million units
rounded the same way move a sum by less than a fiftieth of one unit's
bound, far below the noise (at least ``Delta / epsilon``).

Vector queries add each pair's feature vector instead (``stream_dp.dp.vectors``):
:func:`truncate_features` puts its coordinates on the grid of its l2 bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: A unit's largest sum in one group spans about 2^26 grid steps.
PAIR_SUM_STEPS_LOG2 = 26
#: The finest grid: the smallest subnormal float64, of which every float is a multiple.
_FINEST_K = -1074


def pair_sum_grid_k(bound: float) -> int | None:
    """The grid exponent ``k`` for pair sums of magnitude at most ``bound`` (``None`` if the bound is 0)."""
    if not (math.isfinite(bound) and bound >= 0):
        raise ValueError(f"a pair sum bound must be a finite number >= 0, got {bound!r}; use "
                         "max_events_per_group * max(|clip_lo|, |clip_hi|)")
    if bound == 0:
        return None
    return max(math.frexp(bound)[1] - 1 - PAIR_SUM_STEPS_LOG2, _FINEST_K)


def _grid_units(value: float, count: int, k: int, rounding: str) -> int:
    """``count * value / 2^k`` in exact arithmetic, rounded ``"down"`` (floor) or ``"up"`` (ceiling)."""
    numerator, denominator = value.as_integer_ratio()  # the float exactly; the denominator is a power of 2
    numerator *= count
    if k < 0:
        numerator <<= -k
    else:
        denominator <<= k
    return numerator // denominator if rounding == "down" else -(-numerator // denominator)


@dataclass(frozen=True)
class PairSumGrid:
    """Where the pair sums of one query's values go: the grid of their bound, within their clip range.

    ``clip_lo``/``clip_hi`` are the clip range each value was clipped into; a pair holds at most
    ``max_events_per_group`` values. Refuses (``ValueError``) a clip range narrower than one grid step,
    in which a pair's sum could have no grid point to go to.
    """

    clip_lo: float
    clip_hi: float
    max_events_per_group: int

    def __post_init__(self) -> None:
        lo, hi = self.clip_lo, self.clip_hi
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"a clip range must be two finite numbers lo <= hi, got [{lo!r}, {hi!r}]")
        if isinstance(self.max_events_per_group, bool) or not isinstance(self.max_events_per_group, int) \
                or self.max_events_per_group < 1:
            raise ValueError(f"max_events_per_group must be a positive int, got {self.max_events_per_group!r}")
        k = self.k
        if k is not None and _grid_units(hi, 1, k, "down") < _grid_units(lo, 1, k, "up"):
            raise ValueError(
                f"the clip range [{lo!r}, {hi!r}] is narrower than one step ({math.ldexp(1.0, k):.3g}) of the grid "
                f"that sums of up to max_events_per_group={self.max_events_per_group} values are added up on "
                f"(about 2^-{PAIR_SUM_STEPS_LOG2} of the largest such sum); widen the clip range"
            )

    @property
    def bound(self) -> float:
        """The largest magnitude of one pair's sum: ``max_events_per_group * max(|clip_lo|, |clip_hi|)``."""
        return self.max_events_per_group * max(abs(self.clip_lo), abs(self.clip_hi))

    @property
    def k(self) -> int | None:
        return pair_sum_grid_k(self.bound)

    @cached_property
    def _limits(self) -> tuple[np.ndarray, np.ndarray]:
        """Per event count ``c`` (index), the lowest and highest grid point of ``[c lo, c hi]``, in steps."""
        k = self.k
        assert k is not None
        counts = range(self.max_events_per_group + 1)
        # at most 2^27 steps in magnitude (c |lo|, c |hi| <= Delta < 2^27 g): exact as float64
        lowest = np.array([_grid_units(self.clip_lo, c, k, "up") for c in counts], dtype=np.float64)
        highest = np.array([_grid_units(self.clip_hi, c, k, "down") for c in counts], dtype=np.float64)
        return lowest, highest

    def quantise(self, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Each pair's sum of ``counts`` clipped values on the grid: the nearest grid point (ties to
        even), or, if that lies outside ``[count lo, count hi]``, the grid point of it nearest to the sum."""
        sums = np.asarray(sums, dtype=np.float64)
        k = self.k
        if k is None:
            return np.zeros_like(sums)
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != sums.shape:
            raise ValueError(f"pass one event count per pair sum: {counts.shape} counts for {sums.shape} sums")
        if counts.size and (counts.min() < 0 or counts.max() > self.max_events_per_group):
            raise ValueError(f"a pair holds 0 to max_events_per_group={self.max_events_per_group} events, got "
                             f"counts {int(counts.min())}..{int(counts.max())}; bound the pairs before adding them up")
        lowest, highest = self._limits
        # ldexp by a power of two is exact; rint rounds to the nearest integer, ties to even
        steps = np.clip(np.rint(np.ldexp(sums, -k)), lowest[counts], highest[counts])
        return np.ldexp(steps, k)


def truncate_features(features: np.ndarray, norm_bound: float) -> np.ndarray:
    """Feature vectors (rows) put on the grid of :func:`pair_sum_grid_k` for ``norm_bound``, each
    coordinate toward zero: no coordinate grows, so no row's l2 norm does, and sums are exact.

    Toward zero rather than to the nearest point, which could lengthen a vector past its bound; the
    bias (under ``2^-26`` of the bound per unit and coordinate) is far below the Gaussian's noise.
    """
    k = pair_sum_grid_k(norm_bound)
    if k is None:
        return np.zeros_like(features, dtype=np.float64)
    return np.ldexp(np.trunc(np.ldexp(np.asarray(features, dtype=np.float64), -k)), k)
