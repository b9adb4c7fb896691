"""Top-k groups of a window by event count: report-noisy-max selection.

Under pure DP OpenDP's ``make_noisy_top_k`` runs permute-and-flip (McKenna &
Sheldon, "Permute-and-Flip: A New Mechanism for Differentially Private
Selection", NeurIPS 2020) ``k`` times without replacement: report-noisy-max
with exponential noise, never less accurate than the exponential mechanism
at the same epsilon. One unit changes each group's count by at most
``Linf = max_events_per_group`` and only upwards when added (the scores are
*monotonic*), so OpenDP's map certifies ``epsilon = k * Linf / scale`` and

    scale = k * Linf / epsilon.

The candidate groups must not depend on the data beyond what is already
released: use public group keys, or the groups kept by a release plan's
partition selection (and pay for both).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ContributionBounds
from stream_dp.dp.inputs import as_counts
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.measurements import top_k_measurement
from stream_dp.dp.noise import NoiseSource

_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class TopKPlan:
    """Select the ``k`` groups with the most events. Use :meth:`build`."""

    k: int
    scale: float
    bounds: ContributionBounds
    loss: PrivacyLoss

    @classmethod
    def build(cls, *, epsilon: float, k: int, bounds: ContributionBounds) -> TopKPlan:
        """Calibrate the Gumbel scale for a per-window budget ``epsilon``."""
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not (
            math.isfinite(epsilon) and epsilon > 0
        ):
            raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}; e.g. epsilon=1.0")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}; e.g. k=10 for the top ten groups")
        if not isinstance(bounds, ContributionBounds):
            raise TypeError("bounds must be ContributionBounds(max_groups_per_unit=..., max_events_per_group=...)")
        linf = bounds.max_events_per_group
        scale = int(k) * linf / float(epsilon)
        cost = float(top_k_measurement(int(k), scale).map(linf))
        if cost > epsilon * (1.0 + _TOLERANCE):
            raise RuntimeError(f"OpenDP certifies epsilon={cost} above the budget {epsilon}")
        return cls(int(k), scale, bounds, PrivacyLoss.pure(cost))

    def select(self, counts: NDArray[np.int64], noise: NoiseSource) -> NDArray[np.int64]:
        """Positions of the selected groups, best first.

        With fewer than ``k`` candidates all are ranked; selecting fewer costs no more.
        """
        counts = as_counts(counts)
        return noise.top_k(counts, k=min(self.k, counts.size), scale=self.scale)
