"""Calibration: scales from budgets and sensitivities, certified by OpenDP's maps."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.dp import ClipRange, ContributionBounds, ReleasePlan
from stream_dp.dp.calibration import (
    AUTO_GRID_ROUNDING_SHARE,
    calibrate_counts,
    calibrate_sums,
    choose_float_grid_k,
    resolve_budget_split,
    smallest_sum_sensitivity,
)

budgets = st.floats(1e-3, 10.0)


@settings(max_examples=50, deadline=None)
@given(budgets, st.integers(1, 10_000))
def test_laplace_count_scale_is_sensitivity_over_epsilon(epsilon: float, l1: int) -> None:
    calibrated = calibrate_counts("laplace", epsilon, float(l1))
    assert calibrated.scale == pytest.approx(l1 / epsilon, rel=1e-12)
    assert epsilon * (1 - 1e-9) <= calibrated.cost <= epsilon * (1 + 1e-9)
    assert calibrated.rounding_cost == 0.0 and calibrated.float_grid_k is None


@settings(max_examples=50, deadline=None)
@given(budgets, st.floats(0.5, 1e4))
def test_gaussian_count_sigma_is_sensitivity_over_sqrt_two_rho(rho: float, l2: float) -> None:
    calibrated = calibrate_counts("gaussian", rho, l2)
    assert calibrated.scale == pytest.approx(l2 / math.sqrt(2 * rho), rel=1e-12)
    assert rho * (1 - 1e-9) <= calibrated.cost <= rho * (1 + 1e-9)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["laplace", "gaussian"]), budgets, st.floats(1e-3, 1e7), st.integers(1, 10_000_000))
def test_sum_noise_pays_for_rounding_within_the_budget(kind: str, budget: float, sensitivity: float,
                                                        max_groups: int) -> None:
    calibrated = calibrate_sums(kind, budget, sensitivity, max_groups=max_groups)  # type: ignore[arg-type]
    assert calibrated.cost <= budget * (1 + 1e-9)
    assert calibrated.cost >= budget * (1 - 1e-6)
    assert 0.0 <= calibrated.rounding_cost <= 10 * AUTO_GRID_ROUNDING_SHARE * budget
    ideal = sensitivity / budget if kind == "laplace" else sensitivity / math.sqrt(2 * budget)
    assert calibrated.scale == pytest.approx(ideal, rel=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["laplace", "gaussian"]), st.floats(1e-6, 1e9), st.integers(1, 10**8))
def test_chosen_grid_spends_at_most_the_rounding_share(kind: str, sensitivity: float, max_groups: int) -> None:
    k = choose_float_grid_k(kind, sensitivity, max_groups)  # type: ignore[arg-type]
    moved = max_groups * 2.0**k if kind == "laplace" else 2 * math.sqrt(max_groups) * 2.0**k
    assert moved <= AUTO_GRID_ROUNDING_SHARE * sensitivity
    assert 2 * moved > AUTO_GRID_ROUNDING_SHARE * sensitivity  # the coarsest grid that does


def test_explicit_grid_reports_its_rounding_cost() -> None:
    calibrated = calibrate_sums("laplace", 1.0, 100.0, max_groups=1_000_000, k=-30)
    # OpenDP's map: (sensitivity + n 2^k) / scale; the rounding part is n 2^k / scale
    assert calibrated.float_grid_k == -30
    assert calibrated.rounding_cost == pytest.approx(1_000_000 * 2.0**-30 / calibrated.scale, rel=1e-6)
    assert calibrated.cost == pytest.approx(1.0, rel=1e-9)


def test_a_too_coarse_grid_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"float_grid_k <= -\d+"):
        calibrate_sums("laplace", 1.0, 1.0, max_groups=1_000_000, k=-10)
    with pytest.raises(TypeError, match="int exponent"):
        calibrate_sums("laplace", 1.0, 1.0, max_groups=10, k=-10.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_groups must be a positive int"):
        calibrate_sums("laplace", 1.0, 1.0, max_groups=0)


@pytest.mark.parametrize("sensitivity", [0.0, -1.0, math.inf, math.nan])
@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_a_sensitivity_that_is_not_positive_and_finite_is_refused_not_a_math_error(kind, sensitivity) -> None:
    for call in (lambda: choose_float_grid_k(kind, sensitivity, 1_000_000),
                 lambda: calibrate_sums(kind, 1.0, sensitivity, max_groups=1_000_000)):
        with pytest.raises(ValueError, match=r"sensitivity .* must be a positive finite number"):
            call()


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
@pytest.mark.parametrize("max_groups", [1, 1_000_000])
def test_a_sensitivity_below_what_the_finest_grid_serves_is_refused_with_the_fix(kind, max_groups) -> None:
    """The finest grid is 2^-100 and may spend at most half the sensitivity on rounding (n 2^k in l1,
    2 sqrt(n) 2^k in l2, the module's rule): below that, and where the grid's own arithmetic underflows
    (5e-324), the values must be rescaled; the automatic grid never points at a finer float_grid_k."""
    rounding = max_groups * 2.0**-100 if kind == "laplace" else 2 * math.sqrt(max_groups) * 2.0**-100
    floor = rounding / 0.5
    assert smallest_sum_sensitivity(kind, max_groups) == pytest.approx(floor, rel=1e-12)
    assert calibrate_sums(kind, 1.0, floor * 1.001, max_groups=max_groups).float_grid_k == -100
    for sensitivity in (floor * 0.999, 1e-300, 5e-324):
        with pytest.raises(ValueError) as info:
            calibrate_sums(kind, 1.0, sensitivity, max_groups=max_groups)
        message = str(info.value)
        assert re.search(r"below [\d.e+-]+, the smallest .*rescale the values to larger units", message), message
        assert "float_grid_k" not in message
        with pytest.raises(ValueError, match="rescale the values to larger units"):
            choose_float_grid_k(kind, sensitivity, max_groups)


def test_counts_need_a_positive_budget_and_whole_l1() -> None:
    with pytest.raises(ValueError, match="epsilon for laplace noise must be positive"):
        calibrate_counts("laplace", 0.0, 3.0)
    with pytest.raises(ValueError, match="rho for gaussian noise must be positive"):
        calibrate_counts("gaussian", math.inf, 3.0)
    with pytest.raises(ValueError, match="whole number"):
        calibrate_counts("laplace", 1.0, 2.5)


def test_budget_split_defaults_to_equal_shares() -> None:
    assert resolve_budget_split(("selection", "count", "sum"), None) == pytest.approx(
        {"selection": 1 / 3, "count": 1 / 3, "sum": 1 / 3}
    )
    assert resolve_budget_split(("count", "sum"), {"count": 1, "sum": 3}) == {"count": 0.25, "sum": 0.75}


@pytest.mark.parametrize(
    ("override", "error", "hint"),
    [
        ({"count": 1.0}, ValueError, r"missing keys \['sum'\]"),
        ({"count": 1.0, "sum": 1.0, "mean": 1.0}, ValueError, r"unexpected keys \['mean'\]"),
        ({"count": 0.0, "sum": 1.0}, ValueError, "drop the aggregation"),
        ({"count": math.nan, "sum": 1.0}, ValueError, "positive and finite"),
        ({"count": "1", "sum": 1.0}, TypeError, "must be a number"),
        ([("count", 1.0)], TypeError, "must be a mapping"),
    ],
)
def test_budget_split_validation(override: object, error: type[Exception], hint: str) -> None:
    with pytest.raises(error, match=hint):
        resolve_budget_split(("count", "sum"), override)  # type: ignore[arg-type]


@st.composite
def plans(draw: st.DrawFn) -> dict:
    mechanism = draw(st.sampled_from(["laplace", "gaussian"]))
    aggregations = draw(st.sets(st.sampled_from(["count", "sum", "mean"]), min_size=1))
    lo = draw(st.floats(-1e4, 1e4))
    return {
        "mechanism": mechanism,
        "epsilon": draw(st.floats(0.01, 10.0)),
        "delta": 0.0 if mechanism == "laplace" else draw(st.floats(1e-12, 1e-3)),
        "bounds": ContributionBounds(draw(st.integers(1, 20)), draw(st.integers(1, 20))),
        "clip": ClipRange(lo, lo + draw(st.floats(1e-3, 1e4))),
        "aggregations": aggregations,
        "selection_delta": draw(st.one_of(st.none(), st.floats(1e-12, 1e-3))),
    }


@settings(max_examples=30, deadline=None)
@given(plans())
def test_plan_loss_uses_but_never_exceeds_the_request(params: dict) -> None:
    plan = ReleasePlan.build(**params)
    assert plan.loss.epsilon <= params["epsilon"]
    assert plan.loss.epsilon >= params["epsilon"] * (1 - 1e-6)
    allowed_delta = params["delta"] + (params["selection_delta"] or 0.0)
    assert plan.loss.delta <= allowed_delta
    if params["selection_delta"] is None:
        assert plan.loss.rho is not None
    assert sum(plan.budget_split.values()) == pytest.approx(1.0)
