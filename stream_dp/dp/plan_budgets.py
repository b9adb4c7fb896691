"""Checking a release plan's parameters, and the budget of each of its noise components.

Shared by :mod:`stream_dp.dp.plan` (per-window releases), whose docstring
states how the budget is split, and :mod:`stream_dp.dp.continual`. Every
check says what was wrong and how to fix it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping

from stream_dp.dp.bounds import ClipRange
from stream_dp.dp.loss import PrivacyLoss, zcdp_rho

AGGREGATIONS = frozenset({"count", "sum", "mean"})
# Every component is calibrated to this fraction of its share, so that the
# conservatively rounded costs OpenDP certifies add up to no more than the request.
CALIBRATION_MARGIN = 1.0 - 1e-9


def positive_finite(name: str, value: object, hint: str) -> float:
    """``value`` as a float, or an error naming ``name`` and ending with ``hint`` (how to fix it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}; {hint}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}; {hint}")
    return float(value)


def _check_aggregations(aggregations: Iterable[str]) -> frozenset[str]:
    if isinstance(aggregations, str) or not isinstance(aggregations, Iterable):
        raise TypeError(f"aggregations must be a set such as {{'count', 'sum'}}, got {aggregations!r}")
    chosen = frozenset(aggregations)
    unknown = sorted(chosen - AGGREGATIONS)
    if not chosen or unknown:
        raise ValueError(
            f"aggregations must be a non-empty subset of {sorted(AGGREGATIONS)}, got {sorted(chosen, key=str)}"
        )
    return chosen


def needed_components(aggregations: Iterable[str], clip: ClipRange | None) -> tuple[frozenset[str], bool, bool]:
    """The checked aggregations, and whether they need a count and a sum (a mean needs both; a sum a clip)."""
    chosen = _check_aggregations(aggregations)
    needs_count = bool(chosen & {"count", "mean"})
    needs_sum = bool(chosen & {"sum", "mean"})
    if needs_sum and clip is None:
        raise ValueError(
            f"aggregations {sorted(chosen & {'sum', 'mean'})} need clip=ClipRange(lo, hi): "
            "the clip range bounds what one event can add to a sum"
        )
    return chosen, needs_count, needs_sum


def check_within_request(
    loss: PrivacyLoss, epsilon: float | None, rho: float | None, delta: float, selection_delta: float | None
) -> None:
    """The certified loss may never exceed what was asked for."""
    over = (
        (epsilon is not None and loss.epsilon > epsilon)
        or (rho is not None and (loss.rho is None or loss.rho > rho))
        or loss.delta > delta + (selection_delta or 0.0)
    )
    if over:
        raise RuntimeError(
            f"the certified loss {loss} exceeds the requested budget "
            f"(epsilon={epsilon}, rho={rho}, delta={delta}, selection_delta={selection_delta}); nothing is released"
        )


def laplace_budgets(
    epsilon: object, delta: object, rho: object, noise_shares: Mapping[str, float]
) -> tuple[float, dict[str, float]]:
    """Validated epsilon and the epsilon of each noise component."""
    if rho is not None:
        raise ValueError("rho is the zCDP budget of mechanism='gaussian'; for laplace pass epsilon=... instead")
    total = positive_finite("epsilon", epsilon, "pass the per-window budget, e.g. epsilon=1.0")
    if delta != 0.0:
        raise ValueError(
            f"mechanism='laplace' is pure DP and uses no delta, got delta={delta!r}; set delta=0.0 "
            "(partition selection takes its delta from selection_delta) or use mechanism='gaussian'"
        )
    return total, {c: total * CALIBRATION_MARGIN * share for c, share in noise_shares.items()}


def gaussian_budgets(
    epsilon: object, delta: object, rho: object, selection_delta: float | None, noise_shares: Mapping[str, float]
) -> tuple[float | None, float, dict[str, float]]:
    """Validated epsilon (None in rho mode), delta, and the rho of each noise component."""
    if (epsilon is None) == (rho is None):
        raise ValueError("mechanism='gaussian' needs either epsilon=... with delta=..., or rho=..., not both")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
        raise ValueError(
            f"mechanism='gaussian' needs 0 < delta < 1, got delta={delta!r}: Gaussian noise has no "
            "pure-DP guarantee. Pass e.g. delta=1e-6 (well below 1/number-of-units), or use mechanism='laplace'"
        )
    noise_total = sum(noise_shares.values())
    total: float | None = None
    if rho is not None:
        if selection_delta is not None:
            raise ValueError(
                "partition selection spends epsilon: with selection_delta set, give epsilon=... and "
                "delta=... instead of rho, or use public group keys (selection_delta=None)"
            )
        noise_rho = positive_finite("rho", rho, "pass the per-window zCDP budget, e.g. rho=0.05")
    else:
        total = positive_finite("epsilon", epsilon, "pass the per-window budget, e.g. epsilon=1.0")
        noise_rho = zcdp_rho(total * noise_total, float(delta))
    budgets = {c: noise_rho * CALIBRATION_MARGIN * share / noise_total for c, share in noise_shares.items()}
    return total, float(delta), budgets
