"""Checks on the per-group vectors handed to a release.

A release fails closed: any vector that is malformed, or that contradicts the
contribution bounds the noise is calibrated for, raises ``ValueError`` and
nothing is noised. The checks are vectorised and use only the data, never
publish it (the messages carry counts of offending groups, not values).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ClipRange, ContributionBounds

# float64's unit roundoff: one addition is off by at most this much of its result.
_UNIT_ROUNDOFF = 2.0**-53


def _as_vector(name: str, values: object) -> NDArray[np.generic]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-d array with one entry per group, got shape {array.shape}")
    return array


def as_counts(counts: object) -> NDArray[np.int64]:
    """Per-group event counts as ``int64``; non-negative whole numbers only."""
    array = _as_vector("counts", counts)
    if array.dtype.kind not in "iu":
        raise ValueError(
            f"counts must have an integer dtype, got {array.dtype}; pass np.int64 event counts"
        )
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError("counts exceed the int64 range; nothing is released")
    array = array.astype(np.int64, copy=False)
    negative = int(np.count_nonzero(array < 0))
    if negative:
        raise ValueError(f"counts must be >= 0, {negative} groups are negative; nothing is released")
    return array


def as_distinct_units(
    distinct_units: object, counts: NDArray[np.int64], bounds: ContributionBounds
) -> NDArray[np.int64]:
    """Per-group distinct-unit counts, consistent with the counts and the bounds.

    Every unit in a group adds at least one and at most ``max_events_per_group``
    events, so ``distinct <= count <= distinct * max_events_per_group``.
    """
    array = _as_vector("distinct_units", distinct_units)
    if array.shape != counts.shape:
        raise ValueError(
            f"distinct_units has {array.size} entries but counts has {counts.size}; "
            "pass one distinct-unit count per group, in the same order"
        )
    if array.dtype.kind not in "iu":
        raise ValueError(f"distinct_units must have an integer dtype, got {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if np.any(array < 0) or np.any(array > counts):
        raise ValueError(
            "distinct_units must satisfy 0 <= distinct_units <= counts in every group; "
            "a unit cannot appear in a group without an event there"
        )
    over = int(np.count_nonzero(counts > array * bounds.max_events_per_group))
    if over:
        raise ValueError(
            f"{over} groups have more than max_events_per_group={bounds.max_events_per_group} "
            "events per distinct unit: contributions were not bounded as the plan assumes; "
            "nothing is released"
        )
    return array


def as_sums(sums: object, counts: NDArray[np.int64], clip: ClipRange) -> NDArray[np.float64]:
    """Per-group clipped sums as finite ``float64``, each within ``[count*lo, count*hi]``.

    A sum of ``c`` values clipped into ``[lo, hi]`` lies in ``[c lo, c hi]``;
    anything else means the values were not clipped and the sensitivity the
    noise is calibrated for does not hold. The worker's sums are in the range
    exactly (``stream_dp.windows.exact_sums``); the only slack allowed is what
    float64 additions of ``c`` such values can be off by in any order,
    ``gamma_c * c * max(|lo|, |hi|)`` with ``gamma_n = n u / (1 - n u)``
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2), doubled
    to cover the rounding of the range's own ends. So no volume of data can
    make a sum of clipped values fail this check, and no sum of unclipped ones
    passes it by more than rounding.
    """
    if sums is None:
        raise ValueError("this plan releases sums or means: pass the per-group clipped sums")
    array = _as_vector("sums", sums)
    if array.shape != counts.shape:
        raise ValueError(
            f"sums has {array.size} entries but counts has {counts.size}; pass one sum per group, in the same order"
        )
    if array.dtype.kind not in "fiu":
        raise ValueError(f"sums must be numeric, got dtype {array.dtype}")
    array = array.astype(np.float64, copy=False)
    if not np.all(np.isfinite(array)):
        raise ValueError("sums must be finite (no NaN or infinity); nothing is released")
    count_f = counts.astype(np.float64)
    rounding = count_f * _UNIT_ROUNDOFF
    slack = 2.0 * rounding / np.maximum(1.0 - rounding, 0.5) * count_f * clip.magnitude
    outside = int(np.count_nonzero((array < count_f * clip.lo - slack) | (array > count_f * clip.hi + slack)))
    if outside:
        raise ValueError(
            f"{outside} groups have sums outside [count*lo, count*hi] for clip [{clip.lo}, {clip.hi}]: "
            "values were not clipped as the plan assumes; nothing is released"
        )
    return array
