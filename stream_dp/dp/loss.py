"""Privacy-loss values: composition and conversions between DP notions.

A :class:`PrivacyLoss` states what one mechanism (one window release, one
query, a whole horizon...) costs one privacy unit. Three notions are used:

* pure / approximate DP, ``(epsilon, delta)`` (Dwork & Roth 2014, Def. 2.4);
* zero-concentrated DP, ``rho``-zCDP (Bun & Steinke, "Concentrated
  Differential Privacy: Simplifications, Extensions, and Lower Bounds",
  TCC 2016, Def. 1.1);
* the conversion ``rho``-zCDP => ``(epsilon, delta)``-DP of Canonne, Kamath &
  Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
  Corollary 13 -- the same bound OpenDP's ``make_zCDP_to_approxDP`` uses::

      delta(eps) = inf_{a > 1} exp((a - 1)(a rho - eps)) / (a - 1) * (1 - 1/a)^a
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

# Bisection stops when the bracket is this small relative to its upper end;
# results are always taken from the conservative end of the bracket.
_RELATIVE_TOLERANCE = 1e-12


def _check_real(name: str, value: object, *, hint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}; {hint}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value!r}; {hint}")
    return value


def cdp_delta(rho: float, epsilon: float) -> float:
    """Smallest ``delta`` such that ``rho``-zCDP implies ``(epsilon, delta)``-DP.

    Canonne, Kamath & Steinke 2020, Corollary 13 (module docstring). The
    infimum over ``a`` is found by bisection on the derivative of the exponent,
    as in OpenDP's ``cdp_delta``; any ``a > 1`` gives a valid bound, so an
    inexact minimiser only makes the result conservative.
    """
    if rho < 0 or epsilon < 0:
        raise ValueError(f"rho and epsilon must be non-negative, got rho={rho}, epsilon={epsilon}")
    if rho == 0 or math.isinf(epsilon):
        return 0.0
    if math.isinf(rho):
        return 1.0
    a_min, a_max = 1.01, (epsilon + 1.0) / (2.0 * rho) + 2.0
    while True:
        a_mid = a_min + (a_max - a_min) / 2.0
        if a_mid in (a_min, a_max):
            break
        derivative = (2.0 * a_mid - 1.0) * rho - epsilon + math.log1p(-1.0 / a_mid)
        if derivative < 0:
            a_min = a_mid
        else:
            a_max = a_mid
    a = a_max
    exponent = (a - 1.0) * (a * rho - epsilon) + a * math.log1p(-1.0 / a)
    try:
        delta = math.exp(exponent) / (a - 1.0)
    except OverflowError:
        return 1.0
    return min(delta, 1.0)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ``epsilon`` such that ``rho``-zCDP implies ``(epsilon, delta)``-DP.

    Inverts :func:`cdp_delta` by bisection, starting from Bun & Steinke's
    Proposition 1.3 bound ``rho + 2 sqrt(rho ln(1/delta))`` (always valid).
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(
            f"converting zCDP to (epsilon, delta)-DP needs 0 < delta < 1, got delta={delta}; "
            "rho-zCDP gives no finite epsilon at delta=0: pass a small delta such as 1e-6"
        )
    if rho == 0:
        return 0.0
    lo, hi = 0.0, rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    while hi - lo > _RELATIVE_TOLERANCE * hi:
        mid = lo + (hi - lo) / 2.0
        if cdp_delta(rho, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ``rho`` such that ``rho``-zCDP implies ``(epsilon, delta)``-DP.

    Used to calibrate Gaussian noise to an ``(epsilon, delta)`` budget; the
    bisection keeps the end of the bracket that satisfies the budget.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(
            f"the gaussian mechanism needs 0 < delta < 1, got delta={delta}; "
            "pass delta=1e-6 (or smaller than 1/number-of-units) or use mechanism='laplace'"
        )
    if epsilon <= 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    lo, hi = 0.0, epsilon
    while cdp_delta(hi, epsilon) <= delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > _RELATIVE_TOLERANCE * hi:
        mid = lo + (hi - lo) / 2.0
        if cdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class PrivacyLoss:
    """What a mechanism costs one privacy unit.

    ``(epsilon, delta)``: the mechanism is ``(epsilon, delta)``-DP.
    ``rho``: when not ``None``, the mechanism is *also* ``rho``-zCDP. Both
    statements hold at once; each composes on its own, so adding two losses
    adds epsilons and deltas (basic composition, Dwork & Roth Theorem 3.16)
    and adds rhos when both sides have one (Bun & Steinke 2016, Lemma 2.3).
    """

    epsilon: float
    delta: float = 0.0
    rho: float | None = None

    def __post_init__(self) -> None:
        epsilon = _check_real("epsilon", self.epsilon, hint="pass e.g. epsilon=1.0")
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}; a privacy loss is never negative")
        delta = _check_real("delta", self.delta, hint="pass e.g. delta=1e-6, or 0.0 for pure DP")
        if not 0.0 <= delta < 1.0:
            raise ValueError(
                f"delta must be in [0, 1), got {delta}; use 0.0 for pure DP or a small "
                "value such as 1e-6 (well below 1/number-of-units)"
            )
        object.__setattr__(self, "epsilon", epsilon)
        object.__setattr__(self, "delta", delta)
        if self.rho is not None:
            rho = _check_real("rho", self.rho, hint="pass e.g. rho=0.01, or None if not zCDP")
            if rho < 0:
                raise ValueError(f"rho must be >= 0, got {rho}")
            object.__setattr__(self, "rho", rho)

    @classmethod
    def pure(cls, epsilon: float) -> PrivacyLoss:
        """An ``epsilon``-DP loss; pure DP is also ``epsilon**2 / 2``-zCDP
        (Bun & Steinke 2016, Proposition 1.4; OpenDP ``make_pureDP_to_zCDP``)."""
        loss = cls(epsilon)
        return cls(loss.epsilon, 0.0, loss.epsilon**2 / 2.0)

    @classmethod
    def from_zcdp(cls, rho: float, delta: float) -> PrivacyLoss:
        """A ``rho``-zCDP loss, stated in ``(epsilon, delta)`` at the given delta."""
        rho = _check_real("rho", rho, hint="pass e.g. rho=0.01")
        if rho < 0:
            raise ValueError(f"rho must be >= 0, got {rho}")
        return cls(zcdp_epsilon(rho, delta), delta, rho)

    def __add__(self, other: PrivacyLoss) -> PrivacyLoss:
        if not isinstance(other, PrivacyLoss):
            return NotImplemented
        rho = None if self.rho is None or other.rho is None else self.rho + other.rho
        return PrivacyLoss(self.epsilon + other.epsilon, self.delta + other.delta, rho)

    def __mul__(self, times: int) -> PrivacyLoss:
        """Basic composition of ``times`` runs of the same mechanism."""
        if isinstance(times, bool) or not isinstance(times, numbers.Integral) or times < 0:
            return NotImplemented
        rho = None if self.rho is None else self.rho * times
        return PrivacyLoss(self.epsilon * times, self.delta * times, rho)

    __rmul__ = __mul__

    def to_approx_dp(self, delta: float) -> PrivacyLoss:
        """The tightest ``(epsilon, delta)`` statement this loss supports at ``delta``.

        Candidates: the stored ``epsilon`` (valid when ``delta >= self.delta``)
        and, when ``rho`` is known, ``zcdp_epsilon(rho, delta)``.
        """
        delta = _check_real("delta", delta, hint="pass e.g. delta=1e-6")
        candidates = []
        if delta >= self.delta:
            candidates.append(self.epsilon)
        if self.rho is not None and 0.0 < delta < 1.0:
            candidates.append(zcdp_epsilon(self.rho, delta))
        if not candidates:
            raise ValueError(
                f"this loss is ({self.epsilon}, {self.delta})-DP without a zCDP statement, so it "
                f"gives no guarantee at the smaller delta={delta}; ask for delta >= {self.delta}"
            )
        return PrivacyLoss(min(candidates), delta, self.rho)

    def advanced_composition(self, times: int, delta_slack: float) -> PrivacyLoss:
        """Advanced composition of ``times`` runs (Dwork, Rothblum & Vadhan 2010,
        Theorem III.3; Dwork & Roth Theorem 3.20)::

            epsilon' = sqrt(2 k ln(1/delta_slack)) * epsilon + k * epsilon * (e^epsilon - 1)
            delta'   = k * delta + delta_slack

        Reported as an alternative to basic composition; it is smaller only
        for many runs of a small epsilon.
        """
        if isinstance(times, bool) or not isinstance(times, numbers.Integral) or times < 1:
            raise ValueError(f"times must be a positive int, got {times!r}")
        if not 0.0 < delta_slack < 1.0:
            raise ValueError(f"delta_slack must be in (0, 1), got {delta_slack}; try 1e-6")
        eps = self.epsilon
        epsilon = math.sqrt(2.0 * times * math.log(1.0 / delta_slack)) * eps + times * eps * math.expm1(eps)
        rho = None if self.rho is None else self.rho * times
        return PrivacyLoss(epsilon, times * self.delta + delta_slack, rho)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, for release metadata."""
        return {"epsilon": self.epsilon, "delta": self.delta, "rho": self.rho}
