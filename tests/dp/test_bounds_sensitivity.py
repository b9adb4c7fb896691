"""Contribution bounds, clip ranges and the sensitivities derived from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.dp import (
    ClipRange,
    ContributionBounds,
    count_sensitivity,
    distinct_units_sensitivity,
    sum_sensitivity,
)


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        ((0, 1), ValueError, "at least 1"),
        ((1, 0), ValueError, "at least 1"),
        ((-3, 2), ValueError, "set max_groups_per_unit"),
        ((1.5, 2), TypeError, "whole number"),
        ((True, 2), TypeError, "whole number"),
        (("3", 2), TypeError, "whole number"),
    ],
)
def test_contribution_bounds_reject_bad_values(args: tuple, error: type[Exception], hint: str) -> None:
    with pytest.raises(error, match=hint):
        ContributionBounds(*args)


def test_contribution_bounds_accept_numpy_integers_as_ints() -> None:
    bounds = ContributionBounds(np.int64(3), np.int32(2))
    assert type(bounds.max_groups_per_unit) is int and bounds.max_groups_per_unit == 3
    assert type(bounds.max_events_per_group) is int and bounds.max_events_per_group == 2


@pytest.mark.parametrize(
    ("lo", "hi", "error", "hint"),
    [
        (1.0, 1.0, ValueError, "lo < hi"),
        (5.0, 1.0, ValueError, "swap them"),
        (0.0, math.inf, ValueError, "must be finite"),
        (math.nan, 1.0, ValueError, "must be finite"),
        ("0", 1.0, TypeError, "real number"),
        (0.0, None, TypeError, "real number"),
    ],
)
def test_clip_range_rejects_bad_values(lo: object, hi: object, error: type[Exception], hint: str) -> None:
    with pytest.raises(error, match=hint):
        ClipRange(lo, hi)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lo", "hi", "magnitude"),
    [(0.0, 100.0, 100.0), (-5.0, 2.0, 5.0), (-1.0, 3.0, 3.0), (-10.0, -2.0, 10.0), (2.0, 7.0, 7.0)],
)
def test_clip_magnitude_is_the_largest_absolute_value(lo: float, hi: float, magnitude: float) -> None:
    assert ClipRange(lo, hi).magnitude == magnitude


def test_sensitivity_formulas() -> None:
    bounds = ContributionBounds(max_groups_per_unit=4, max_events_per_group=3)
    count = count_sensitivity(bounds)
    assert (count.l0, count.linf, count.l1, count.l2) == (4, 3.0, 12.0, 6.0)
    total = sum_sensitivity(bounds, ClipRange(-20.0, 10.0))
    assert (total.l1, total.l2) == (4 * 3 * 20.0, 2 * 3 * 20.0)
    distinct = distinct_units_sensitivity(bounds)
    assert (distinct.l1, distinct.l2) == (4.0, 2.0)


@st.composite
def unit_contributions(draw: st.DrawFn) -> tuple[ContributionBounds, ClipRange, dict[int, list[float]]]:
    """Bounds, a clip range and one unit's contributions that respect them."""
    bounds = ContributionBounds(draw(st.integers(1, 6)), draw(st.integers(1, 5)))
    lo = draw(st.floats(-1e3, 1e3, allow_nan=False))
    hi = draw(st.floats(-1e3, 1e3, allow_nan=False).filter(lambda h: h > lo + 1e-6))
    clip = ClipRange(lo, hi)
    groups = draw(st.lists(st.integers(0, 20), min_size=1, max_size=bounds.max_groups_per_unit, unique=True))
    values = st.floats(lo, hi, allow_nan=False)
    events = {g: draw(st.lists(values, min_size=1, max_size=bounds.max_events_per_group)) for g in groups}
    return bounds, clip, events


@settings(max_examples=200, deadline=None)
@given(unit_contributions())
def test_one_units_change_never_exceeds_the_sensitivities(case: tuple) -> None:
    bounds, clip, events = case
    count_change = np.zeros(21)
    sum_change = np.zeros(21)
    distinct_change = np.zeros(21)
    for group, values in events.items():
        count_change[group] = len(values)
        sum_change[group] = sum(values)
        distinct_change[group] = 1
    slack = 1e-9 * (1 + clip.magnitude * bounds.max_events_per_group * bounds.max_groups_per_unit)
    for change, sensitivity in (
        (count_change, count_sensitivity(bounds)),
        (sum_change, sum_sensitivity(bounds, clip)),
        (distinct_change, distinct_units_sensitivity(bounds)),
    ):
        assert np.count_nonzero(change) <= sensitivity.l0
        assert np.abs(change).max() <= sensitivity.linf + slack
        assert np.abs(change).sum() <= sensitivity.l1 + slack
        assert np.linalg.norm(change) <= sensitivity.l2 + slack


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 50),
    st.integers(1, 50),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(1e-3, 1e6, allow_nan=False),
)
def test_the_sensitivities_are_attained_by_a_maximal_unit(l0: int, linf: int, lo: float, width: float) -> None:
    bounds = ContributionBounds(l0, linf)
    clip = ClipRange(lo, lo + width)
    extreme = clip.lo if abs(clip.lo) >= abs(clip.hi) else clip.hi
    count_change = np.full(l0, float(linf))
    sum_change = np.full(l0, linf * extreme)
    assert count_change.sum() == pytest.approx(count_sensitivity(bounds).l1)
    assert np.linalg.norm(count_change) == pytest.approx(count_sensitivity(bounds).l2)
    assert np.abs(sum_change).sum() == pytest.approx(sum_sensitivity(bounds, clip).l1)
    assert np.linalg.norm(sum_change) == pytest.approx(sum_sensitivity(bounds, clip).l2)
