"""Top-k groups of a window by event count: report-noisy-max selection.

Under pure DP OpenDP's ``make_noisy_top_k`` runs permute-and-flip (McKenna &
Sheldon, "Permute-and-Flip: A New Mechanism for Differentially Private
Selection", NeurIPS 2020), peeled ``k`` times without replacement: each pick
visits the candidates left in a uniformly random order and stops at ``c``
with an exact ``Bernoulli(exp(-(max - count_c) / scale))`` coin (OpenDP draws
these coins on rationals; no noise value is added to any count). That law is
report-noisy-max with exponential noise of the same ``scale`` (Ding et al.,
"The Permute-and-Flip Mechanism is Identical to Report-Noisy-Max with
Exponential Noise", 2021), never less accurate than the exponential mechanism
at the same epsilon. No Gumbel noise is drawn: that is OpenDP's zCDP path
(the exponential mechanism), which top_k never takes -- it is pure epsilon-DP
in every query, a ``gaussian`` one included.

One unit changes each group's count by at most ``Linf = max_events_per_group``
and only upwards when added (the scores are *monotonic*), so OpenDP's map
certifies ``epsilon = k * Linf / scale`` and

    scale = k * Linf / epsilon.

**Accuracy** (what ``stream-dp plan`` prints). A pick lands on candidate ``c``
only if ``c``'s own coin comes up when it is visited, so with probability at
most ``exp(-gap_c / scale)``, ``gap_c`` the best count less ``c``'s. Over the
``m - 1`` other candidates, the first pick misses a group that leads every
other by ``gap`` with probability at most ``(m - 1) exp(-gap / scale)``: a lead
of ``scale * ln((m - 1) / beta)`` events ranks it first with probability at
least ``1 - beta``.

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
        """Calibrate the permute-and-flip (exponential noise) scale for a per-window budget ``epsilon``."""
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
