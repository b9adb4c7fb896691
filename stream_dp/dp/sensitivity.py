"""Sensitivities of the per-group vectors of one window release.

Notation: ``L0 = max_groups_per_unit``, ``Linf = max_events_per_group`` and
``m = max(|lo|, |hi|)`` for a clip range ``[lo, hi]``. Adding or removing one
privacy unit changes at most ``L0`` coordinates of a per-group vector, each by
at most ``c`` (``c = Linf`` for counts, ``Linf * m`` for clipped sums, ``1``
for distinct-unit counts). The change vector ``d`` therefore satisfies

    ||d||_1 <= L0 * c            and        ||d||_2 <= sqrt(L0) * c,

both attained when the unit contributes the maximum to ``L0`` groups.
Reference: Wilson et al., "Differentially Private SQL with Bounded User
Contribution", PoPETs 2020, Sections 3-4; Dwork & Roth, "The Algorithmic
Foundations of Differential Privacy", Definitions 3.1 and 3.8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stream_dp.dp.bounds import ClipRange, ContributionBounds


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """Norm bounds of the change one privacy unit causes in a per-group vector.

    :param l0: number of coordinates that may change.
    :param linf: largest change of one coordinate.
    """

    l0: int
    linf: float

    @property
    def l1(self) -> float:
        """``||d||_1 <= l0 * linf``."""
        return self.l0 * self.linf

    @property
    def l2(self) -> float:
        """``||d||_2 <= sqrt(l0) * linf``."""
        return math.sqrt(self.l0) * self.linf


def count_sensitivity(bounds: ContributionBounds) -> Sensitivity:
    """Sensitivity of the per-group event-count vector.

    L1 = L0 * Linf, L2 = sqrt(L0) * Linf (module docstring).
    """
    return Sensitivity(l0=bounds.max_groups_per_unit, linf=float(bounds.max_events_per_group))


def sum_sensitivity(bounds: ContributionBounds, clip: ClipRange) -> Sensitivity:
    """Sensitivity of the per-group clipped-sum vector.

    Each event adds a value in ``[lo, hi]``, so one unit moves one group's sum by
    at most ``Linf * max(|lo|, |hi|)``: L1 = L0 * Linf * m, L2 = sqrt(L0) * Linf * m.
    """
    return Sensitivity(
        l0=bounds.max_groups_per_unit,
        linf=bounds.max_events_per_group * clip.magnitude,
    )


def distinct_units_sensitivity(bounds: ContributionBounds) -> Sensitivity:
    """Sensitivity of the per-group distinct-unit-count vector (partition selection).

    A unit is counted once in each group it touches: L0 groups, change 1 each.
    """
    return Sensitivity(l0=bounds.max_groups_per_unit, linf=1.0)
