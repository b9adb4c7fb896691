"""Each unit's clipped sum in a group on a power-of-two grid, so that group sums are exact.

Why. A release's sensitivity argument needs neighbouring group sums to differ
by the one unit's contribution, at most ``Delta = max_events_per_group *
max(|clip_lo|, |clip_hi|)``. Added up in floating point they need not: taking
one unit out changes how every later addition rounds, so an adversary who
picks the other units' values can move the float sum by more than ``Delta``
(a few grid steps of the staircase's sum grid with ~445k units). Laplace and
Gaussian releases lose almost nothing from that; the staircase's loss doubles
one grid step beyond its stair.

How. Each pair's sum (one unit, one group) is rounded to the nearest multiple
of ``g = 2^k`` with ``k = floor(log2 Delta) - PAIR_SUM_STEPS_LOG2``, then
clamped to ``[-floor(Delta / g) g, floor(Delta / g) g]``, inside
``[-Delta, Delta]``: a unit's contribution stays within the bound it had.
Multiples of ``g`` add up exactly in float64 as long as every partial sum
stays below ``2^53 g`` in magnitude, which holds in any order while the
magnitudes of a group's pair sums in a window add up to less than
``2^26 Delta`` (67 million units at the full bound; ``2^53 g > 2^53 Delta /
2^27``): each addition is then exact, across batches, partitions and
partials. Beyond that, additions may round again, by a grid step or more,
which the staircase's one step of widening does not cover: a limit of this
release (the order of additions is by keyed hash, which no producer
chooses). The rounding moves a unit's sum by at most ``g / 2 <= Delta /
2^27``: a million units rounded the same way move a sum by less than a
hundredth of one unit's bound, far below the noise (at least ``Delta /
epsilon``).

Vector queries add each pair's feature vector instead (``stream_dp.dp.vectors``):
:func:`truncate_features` puts its coordinates on the grid of its l2 bound.
"""

from __future__ import annotations

import math

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


def quantise_pair_sums(sums: np.ndarray, bound: float) -> np.ndarray:
    """``sums`` rounded to the grid of :func:`pair_sum_grid_k` (ties to even) and clamped within ``bound``."""
    k = pair_sum_grid_k(bound)
    if k is None:
        return np.zeros_like(sums, dtype=np.float64)
    limit = math.ldexp(math.floor(math.ldexp(bound, -k)), k)  # the largest grid point <= bound
    # ldexp by a power of two is exact; rint rounds to the nearest integer, ties to even
    return np.clip(np.ldexp(np.rint(np.ldexp(np.asarray(sums, dtype=np.float64), -k)), k), -limit, limit)


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
