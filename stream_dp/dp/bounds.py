"""Per-unit contribution bounds and clip ranges: the inputs to every sensitivity.

The neighbouring relation throughout :mod:`stream_dp.dp` is *add/remove one
privacy unit* (e.g. one ``user_id``) together with all of its contributions,
after the worker has bounded them:

* the unit contributes to at most ``max_groups_per_unit`` groups of a window
  (the L0 bound), and
* to at most ``max_events_per_group`` events in each of those groups
  (the L-infinity bound), and
* every contributed value has been clipped into ``[lo, hi]``.

References: Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo, Gipson,
"Differentially Private SQL with Bounded User Contribution", PoPETs 2020;
Amin, Kulesza, Munoz, Vassilvitskii, "Bounding User Contributions", ICML 2019.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an int, got {value!r} of type {type(value).__name__}; "
            f"pass a whole number such as {name}=1"
        )
    if value < 1:
        raise ValueError(
            f"{name} must be at least 1, got {value}; every privacy unit may contribute "
            f"somewhere, so set {name} to the largest contribution you accept (e.g. 1)"
        )


@dataclass(frozen=True, slots=True)
class ContributionBounds:
    """How much one privacy unit may contribute to one window release.

    :param max_groups_per_unit: L0 bound: number of groups a unit may touch.
    :param max_events_per_group: L-infinity bound: events a unit may add to one group.
    """

    max_groups_per_unit: int
    max_events_per_group: int

    def __post_init__(self) -> None:
        _require_positive_int("max_groups_per_unit", self.max_groups_per_unit)
        _require_positive_int("max_events_per_group", self.max_events_per_group)
        # normalise numpy integers so that describe() stays JSON-serialisable
        object.__setattr__(self, "max_groups_per_unit", int(self.max_groups_per_unit))
        object.__setattr__(self, "max_events_per_group", int(self.max_events_per_group))


@dataclass(frozen=True, slots=True)
class ClipRange:
    """Closed interval ``[lo, hi]`` into which every summed value is clipped."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        for name in ("lo", "hi"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"ClipRange.{name} must be a real number, got {value!r}; "
                    "pass floats such as ClipRange(0.0, 100.0)"
                )
            if not math.isfinite(value):
                raise ValueError(
                    f"ClipRange.{name} must be finite, got {value!r}; an infinite clip bound "
                    "gives infinite sensitivity: choose the largest value you expect, e.g. hi=1e6"
                )
            object.__setattr__(self, name, float(value))
        if not self.lo < self.hi:
            raise ValueError(
                f"ClipRange needs lo < hi, got lo={self.lo!r}, hi={self.hi!r}; "
                "swap them or widen the range"
            )

    @property
    def magnitude(self) -> float:
        """Largest absolute value one clipped event can add to or remove from a sum.

        Under add/remove of a unit a value ``v`` in ``[lo, hi]`` changes a sum by
        ``|v|``, so the bound is ``max(|lo|, |hi|)`` (not ``hi - lo``, which is the
        bound for the change-one relation).
        """
        return max(abs(self.lo), abs(self.hi))
