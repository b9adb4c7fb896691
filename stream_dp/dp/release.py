"""The result of one window release, and helpers to align it with the input groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.calibration import CalibratedNoise
from stream_dp.dp.loss import PrivacyLoss


@dataclass(frozen=True, slots=True)
class NoisyRelease:
    """The noisy result of one window release.

    Every array has one entry per input group, in input order. ``keep`` marks
    the groups that may be published (all of them with public group keys);
    entries of the other groups are placeholders (0 for counts, NaN for sums,
    means and mean intervals), not noised, and must not be published: even the
    key of an unselected group is private. Half-widths are for 95% intervals
    ``[value - h, value + h]``.

    ``count`` is clamped at 0; ``count_unclamped`` holds the same draws before
    the clamp, for post-processing that needs unbiased inputs (the least
    squares of a hierarchy: clamped inputs would bias every level upwards).
    It is never published as such.
    """

    keep: NDArray[np.bool_]
    count: NDArray[np.int64] | None
    sum: NDArray[np.float64] | None
    mean: NDArray[np.float64] | None
    count_std: float | None
    sum_std: float | None
    count_ci95: float | None
    sum_ci95: float | None
    mean_ci95: NDArray[np.float64] | None
    loss: PrivacyLoss
    count_unclamped: NDArray[np.int64] | None = None

    @property
    def index(self) -> NDArray[np.intp]:
        """Positions (in the input vectors) of the released groups."""
        return np.flatnonzero(self.keep)


@dataclass(frozen=True, slots=True)
class ReleaseAccuracy:
    """Accuracy of one calibrated noise, computed once per plan."""

    std: float
    ci95: float
    ci975: float  # used for means: each of count and sum at 97.5% (Bonferroni)

    @classmethod
    def of(cls, noise: CalibratedNoise) -> ReleaseAccuracy:
        return cls(noise.std, noise.ci_half_width(0.05), noise.ci_half_width(0.025))


def take(values: NDArray[Any], kept: NDArray[np.intp] | None) -> NDArray[Any]:
    """The entries of the kept groups (all of them when ``kept`` is None)."""
    return values if kept is None else values[kept]


def scatter(
    values: NDArray[Any] | None, kept: NDArray[np.intp] | None, size: int, placeholder: float
) -> NDArray[Any] | None:
    """Back to one entry per input group, placeholders where groups were not kept."""
    if values is None or kept is None:
        return values
    full = np.full(size, placeholder, dtype=values.dtype)
    full[kept] = values
    return full
