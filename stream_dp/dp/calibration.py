"""Noise calibration: from a budget and a sensitivity to a certified noise scale.

* Laplace (pure DP): ``scale = Delta_1 / epsilon`` (Dwork, McSherry, Nissim &
  Smith 2006; for the discrete Laplace, Ghosh, Roughgarden & Sundararajan 2012).
* Gaussian (zCDP): ``sigma = Delta_2 / sqrt(2 rho)`` (Bun & Steinke 2016,
  Proposition 1.6; for the discrete Gaussian, Canonne, Kamath & Steinke 2020,
  Theorem 4).

Float vectors are noised by OpenDP on a grid ``2^k``; rounding the inputs to
the grid can widen the distance between neighbouring vectors of ``n``
elements by ``n 2^k`` in l1 (``sqrt(n) 2^k`` in l2), which the privacy map
adds to the sensitivity. The scale is solved
with that term included, so the certified cost (read back from OpenDP's
privacy map, never from the formulas above) stays within the budget, and the
share spent on rounding is reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.accuracy import noise_ci_half_width, noise_std
from stream_dp.dp.measurements import (
    NoiseKind,
    exact_float_vector_measurement,
    float_vector_measurement,
    integer_vector_measurement,
)
from stream_dp.dp.noise import NoiseSource

# The automatic grid spends at most this fraction of a sum's budget on rounding.
AUTO_GRID_ROUNDING_SHARE = 1e-9
# A user-chosen grid may not spend more than this fraction on rounding.
MAX_ROUNDING_SHARE = 0.5
# Finer grids than this make OpenDP's samplers slower for no useful gain.
FINEST_AUTO_GRID_K = -100
# Float rounding in OpenDP's maps may exceed the budget by this relative amount.
CERTIFICATION_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class CalibratedNoise:
    """Noise for one per-group vector, with its cost certified by OpenDP.

    :param kind: ``"laplace"`` (cost is epsilon) or ``"gaussian"`` (cost is rho).
    :param scale: Laplace scale ``b`` or Gaussian ``sigma``, in value units.
    :param sensitivity: l1 (Laplace) or l2 (Gaussian) sensitivity it is calibrated to.
    :param float_grid_k: grid exponent for float vectors; ``None`` for integer vectors.
    :param max_groups: vector length the cost is certified for (float vectors).
    :param cost: epsilon or rho from OpenDP's privacy map.
    :param rounding_cost: the part of ``cost`` caused by rounding to the grid.
    """

    kind: NoiseKind
    scale: float
    sensitivity: float
    float_grid_k: int | None
    max_groups: int | None
    cost: float
    rounding_cost: float

    def apply(self, values: NDArray[Any], noise: NoiseSource, *, changed: int | None = None) -> NDArray[Any]:
        """Noise a vector (``int64`` counts or ``float64`` sums).

        ``changed``: for float vectors, the most coordinates of ``values`` that adding or removing one
        unit can change. Each coordinate is rounded to the grid and noised on its own, so coordinates
        on which two neighbouring inputs agree have the same output law and cost nothing: the loss is
        that of the measurement on the changed coordinates alone, which the certificate for
        ``max_groups`` coordinates covers when ``changed <= max_groups`` (the map grows with the size),
        however long ``values`` is. Without ``changed`` the whole vector must fit ``max_groups``.
        """
        if self.float_grid_k is None:
            return noise.integers(values, kind=self.kind, scale=self.scale)
        covered = values.size if changed is None else changed
        if self.max_groups is not None and covered > self.max_groups:
            what = (f"the release has {values.size} groups" if changed is None
                    else f"one unit can change {changed} coordinates of the release")
            raise ValueError(
                f"{what} but the sum noise is certified for at most max_groups={self.max_groups}; nothing is "
                "released. Rebuild the plan with a larger max_groups (it only changes the tiny float-rounding cost)"
            )
        return noise.floats(values, kind=self.kind, scale=self.scale, k=self.float_grid_k)

    @property
    def std(self) -> float:
        """Standard deviation of the added noise."""
        return noise_std(self.kind, self.scale, self.float_grid_k)

    def ci_half_width(self, alpha: float = 0.05) -> float:
        """Half-width of the ``1 - alpha`` confidence interval around a noisy value."""
        return noise_ci_half_width(self.kind, self.scale, self.float_grid_k, alpha)

    def describe(self) -> dict[str, Any]:
        cost_name = "epsilon" if self.kind == "laplace" else "rho"
        return {
            "noise": ("discrete_" if self.float_grid_k is None else "") + self.kind,
            "scale": self.scale,
            "sensitivity": self.sensitivity,
            "sensitivity_norm": "l1" if self.kind == "laplace" else "l2",
            cost_name: self.cost,
            "std": self.std,
            "ci95": self.ci_half_width(0.05),
            "float_grid_k": self.float_grid_k,
            "max_groups": self.max_groups,
            f"float_rounding_{cost_name}": self.rounding_cost,
        }


def _check_budget(kind: NoiseKind, budget: float) -> None:
    if not (math.isfinite(budget) and budget > 0):
        name = "epsilon" if kind == "laplace" else "rho"
        raise ValueError(f"the {name} for {kind} noise must be positive and finite, got {budget}")


def _certify(measure: Any, d_in: Any, budget: float) -> float:
    cost = float(measure.map(d_in))
    if cost > budget * (1.0 + CERTIFICATION_TOLERANCE):
        raise RuntimeError(f"OpenDP certifies a cost of {cost}, above the budget {budget}; nothing is released")
    return cost


def calibrate_counts(kind: NoiseKind, budget: float, sensitivity: float) -> CalibratedNoise:
    """Integer noise for an ``int64`` vector: ``budget`` is epsilon (Laplace) or rho (Gaussian);
    ``sensitivity`` is the vector's l1 (Laplace, a whole number) or l2 (Gaussian) bound."""
    _check_budget(kind, budget)
    if kind == "laplace":
        scale = sensitivity / budget
        d_in: Any = int(round(sensitivity))
        if d_in != sensitivity:
            raise ValueError(f"an integer vector's l1 sensitivity must be a whole number, got {sensitivity}")
    else:
        scale = sensitivity / math.sqrt(2.0 * budget)
        d_in = float(sensitivity)
    cost = _certify(integer_vector_measurement(kind, scale), d_in, budget)
    return CalibratedNoise(kind, scale, float(sensitivity), None, None, cost, 0.0)


def _grid_rounding(kind: NoiseKind, k: int, max_groups: int) -> float:
    """How far rounding ``max_groups`` sums to the grid ``2^k`` can move them: ``n 2^k`` in l1; in l2 the map
    uses ``(Delta_2 + sqrt(n) 2^k)^2``, about ``2 sqrt(n) 2^k`` more than ``Delta_2``."""
    grid = math.ldexp(1.0, k)
    return max_groups * grid if kind == "laplace" else 2.0 * math.sqrt(max_groups) * grid


def smallest_sum_sensitivity(kind: NoiseKind, max_groups: int) -> float:
    """The smallest sensitivity whose rounding on the finest grid costs at most ``MAX_ROUNDING_SHARE`` of it."""
    return _grid_rounding(kind, FINEST_AUTO_GRID_K, max_groups) / MAX_ROUNDING_SHARE


def _check_sensitivity(kind: NoiseKind, sensitivity: float, max_groups: int) -> None:
    """Refuse a sensitivity no grid serves, saying so, rather than failing in the grid's logarithm."""
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"a sum's sensitivity {sensitivity!r} must be a positive finite number: it is the most one "
                         "unit moves the sums, from the clipping range or norm")
    smallest = smallest_sum_sensitivity(kind, max_groups)
    if sensitivity < smallest:
        raise ValueError(
            f"a sum's sensitivity of {sensitivity:.3g} is below {smallest:.3g}, the smallest the finest float grid "
            f"(2^{FINEST_AUTO_GRID_K}) serves for {max_groups} sums without spending more than half the budget on "
            "rounding: rescale the values to larger units (e.g. micrometres instead of metres)"
        )


def choose_float_grid_k(kind: NoiseKind, sensitivity: float, max_groups: int) -> int:
    """Coarsest grid ``2^k`` whose rounding costs at most ``AUTO_GRID_ROUNDING_SHARE`` of the budget.

    Laplace: ``n 2^k <= share * Delta_1``. Gaussian: the map uses
    ``(Delta_2 + sqrt(n) 2^k)^2``, so ``2 sqrt(n) 2^k <= share * Delta_2``. Never finer than
    ``FINEST_AUTO_GRID_K``; a sensitivity even that grid cannot serve is refused (``ValueError``).
    """
    _check_sensitivity(kind, sensitivity, max_groups)
    if kind == "laplace":
        allowed = AUTO_GRID_ROUNDING_SHARE * sensitivity / max_groups
    else:
        allowed = AUTO_GRID_ROUNDING_SHARE * sensitivity / (2.0 * math.sqrt(max_groups))
    return max(math.floor(math.log2(allowed)), FINEST_AUTO_GRID_K)


def calibrate_sums(
    kind: NoiseKind, budget: float, sensitivity: float, *, max_groups: int, k: int | None = None
) -> CalibratedNoise:
    """Float noise for vectors of at most ``max_groups`` sums, on the grid ``2^k``
    (``k=None`` chooses it with :func:`choose_float_grid_k`)."""
    _check_budget(kind, budget)
    if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1:
        raise ValueError(f"max_groups must be a positive int, got {max_groups!r}; e.g. max_groups=1_000_000")
    _check_sensitivity(kind, sensitivity, max_groups)
    if k is None:
        k = choose_float_grid_k(kind, sensitivity, max_groups)
    elif isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"float_grid_k must be an int exponent such as -40, got {k!r}")
    grid = math.ldexp(1.0, k)
    rounding = _grid_rounding(kind, k, max_groups)
    if kind == "laplace":
        scale = (sensitivity + rounding) / budget
    else:
        scale = (sensitivity + math.sqrt(max_groups) * grid) / math.sqrt(2.0 * budget)
    if rounding > MAX_ROUNDING_SHARE * sensitivity:
        coarsest = choose_float_grid_k(kind, sensitivity, max_groups)
        raise ValueError(
            f"float_grid_k={k} with max_groups={max_groups} would spend more than half of the sum's "
            f"budget on float rounding; use float_grid_k <= {coarsest} (or None to choose it), "
            "or lower max_groups, or rescale the values to larger units"
        )
    d_in = float(sensitivity)
    cost = _certify(float_vector_measurement(kind, scale, k, max_groups), d_in, budget)
    exact_cost = float(exact_float_vector_measurement(kind, scale, max_groups).map(d_in))
    return CalibratedNoise(kind, scale, d_in, k, max_groups, cost, max(cost - exact_cost, 0.0))


def resolve_budget_split(components: tuple[str, ...], override: Mapping[str, float] | None) -> dict[str, float]:
    """Normalised shares of the budget per component (``selection``, ``count``, ``sum``).

    Default: equal shares. An override gives a positive weight to every
    component (weights are normalised, so ``{"count": 1, "sum": 3}`` gives the
    sum three quarters).
    """
    if override is None:
        return {component: 1.0 / len(components) for component in components}
    if not isinstance(override, Mapping):
        raise TypeError(f"budget_split must be a mapping such as {{'count': 1, 'sum': 1}}, got {override!r}")
    unknown = sorted(set(override) - set(components))
    missing = sorted(set(components) - set(override))
    if unknown or missing:
        raise ValueError(
            f"budget_split must give a weight to exactly {sorted(components)}; "
            f"unexpected keys {unknown}, missing keys {missing}"
        )
    weights: dict[str, float] = {}
    for component in components:
        weight = override[component]
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.floating, np.integer)):
            raise TypeError(f"budget_split[{component!r}] must be a number, got {weight!r}")
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(
                f"budget_split[{component!r}] must be positive and finite, got {weight}; "
                "every component needs some budget: drop the aggregation instead of giving it 0"
            )
        weights[component] = float(weight)
    total = sum(weights.values())
    return {component: weight / total for component, weight in weights.items()}
