"""Partition selection: OpenDP-certified threshold, run vectorised.

Statistical checks use 5,000 groups per distinct count and fail only below
p = 1e-4 per comparison after a Bonferroni correction over the compared
counts: a correct implementation fails about once in 10,000 runs, while a
threshold off by one unit shifts keep rates by several points and is seen.
"""

from __future__ import annotations

import math

import numpy as np
import opendp.prelude as dp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from stream_dp.dp import ContributionBounds, OpenDPNoise, PartitionSelection
from stream_dp.dp.measurements import laplace_threshold_measurement

P_MIN = 1e-4
PER_COUNT = 5_000


@settings(max_examples=25, deadline=None)
@given(st.floats(0.05, 5.0), st.floats(1e-10, 1e-2), st.integers(1, 20))
def test_threshold_is_the_smallest_that_opendp_certifies(epsilon: float, delta: float, l0: int) -> None:
    selection = PartitionSelection.calibrate(epsilon=epsilon, delta=delta, bounds=ContributionBounds(l0, 3))
    assert selection.scale == pytest.approx(l0 / epsilon)
    tau = selection.threshold
    spent_epsilon, _ = laplace_threshold_measurement(selection.scale, tau).map((l0, l0, 1))
    # delta is read one step lower: OpenDP 0.16's map is off by one (issue #2922)
    _, spent_delta = laplace_threshold_measurement(selection.scale, tau - 1).map((l0, l0, 1))
    assert spent_delta <= delta and spent_epsilon <= epsilon * (1 + 1e-9)
    assert (selection.loss.epsilon, selection.loss.delta) == (spent_epsilon, spent_delta)
    if tau > 2:
        _, looser_delta = laplace_threshold_measurement(selection.scale, tau - 2).map((l0, l0, 1))
        assert looser_delta > delta


def test_a_single_unit_group_is_released_with_probability_at_most_delta() -> None:
    for l0 in (1, 4):
        selection = PartitionSelection.calibrate(epsilon=1.0, delta=1e-6, bounds=ContributionBounds(l0, 1))
        # l0 groups that only this unit populates: any of them released
        assert 1 - (1 - selection.keep_probability(1)) ** l0 <= selection.loss.delta <= 1e-6
        assert selection.keep_probability(selection.threshold) > 0.5


def test_opendp_threshold_map_still_misses_the_mass_at_the_threshold() -> None:
    # Regression guard for opendp/opendp#2922, which _threshold_loss corrects. If this
    # fails, OpenDP's map counts the mass at the threshold and the correction is redundant.
    scale, tau = 1.0, 3
    _, opendp_delta = laplace_threshold_measurement(scale, tau).map((1, 1, 1))
    q = math.exp(-1 / scale)
    single_unit_keep = q ** (tau - 1) / (1 + q)  # P(1 + Z >= tau)
    assert opendp_delta == pytest.approx(q**tau / (1 + q), rel=1e-9)
    assert opendp_delta < single_unit_keep


def test_measured_release_rate_of_a_single_unit_group_is_within_delta(noise: OpenDPNoise) -> None:
    # a large delta makes the release of a single-unit group frequent enough to measure
    selection = PartitionSelection.calibrate(epsilon=1.0, delta=0.05, bounds=ContributionBounds(1, 1))
    draws = 20_000
    dp.enable_features("contrib")
    theirs = len(laplace_threshold_measurement(selection.scale, selection.threshold)(dict.fromkeys(range(draws), 1)))
    ours = int(selection.select(np.ones(draws, dtype=np.int64), noise).sum())
    # one-sided binomial tests at p = 1e-4 each: the rates may not exceed the claimed delta
    for released in (theirs, ours):
        assert stats.binomtest(released, draws, selection.loss.delta, alternative="greater").pvalue > P_MIN


def _keep_rates(kept: np.ndarray, values: np.ndarray, distinct: np.ndarray) -> np.ndarray:
    return np.array([kept[values == n].mean() for n in distinct])


def test_vectorised_selection_matches_opendps_threshold_measurement(noise: OpenDPNoise) -> None:
    # a large delta puts the threshold low so that keep rates are far from 0 and 1
    selection = PartitionSelection.calibrate(epsilon=1.0, delta=0.05, bounds=ContributionBounds(2, 1))
    tau = selection.threshold
    distinct = np.array([max(tau - 3, 0), tau - 1, tau, tau + 2], dtype=np.int64)
    values = np.repeat(distinct, PER_COUNT)
    ours = selection.select(values, noise)

    dp.enable_features("contrib")
    measurement = laplace_threshold_measurement(selection.scale, tau)
    released = measurement(dict(zip(range(values.size), values.tolist())))
    theirs = np.zeros(values.size, dtype=bool)
    theirs[list(released)] = True

    p_min = P_MIN / distinct.size  # Bonferroni over the compared counts
    for n, our_rate, their_rate in zip(distinct, _keep_rates(ours, values, distinct),
                                       _keep_rates(theirs, values, distinct), strict=True):
        expected = selection.keep_probability(int(n))
        assert stats.binomtest(round(our_rate * PER_COUNT), PER_COUNT, expected).pvalue > p_min
        assert stats.binomtest(round(their_rate * PER_COUNT), PER_COUNT, expected).pvalue > p_min


def test_an_off_by_one_threshold_would_be_detected(noise: OpenDPNoise) -> None:
    selection = PartitionSelection.calibrate(epsilon=1.0, delta=0.05, bounds=ContributionBounds(2, 1))
    kept = selection.select(np.full(PER_COUNT, selection.threshold, dtype=np.int64), noise)
    wrong = selection.keep_probability(selection.threshold + 1)
    assert stats.binomtest(int(kept.sum()), PER_COUNT, wrong).pvalue < P_MIN


def test_keep_probability_matches_the_discrete_laplace_tail() -> None:
    selection = PartitionSelection.calibrate(epsilon=0.5, delta=1e-5, bounds=ContributionBounds(1, 1))
    q = math.exp(-1 / selection.scale)
    support = np.arange(-2000, 2001)
    pmf = (1 - q) / (1 + q) * q ** np.abs(support)
    for n in (0, 5, selection.threshold - 1, selection.threshold, selection.threshold + 7):
        assert selection.keep_probability(n) == pytest.approx(pmf[support >= selection.threshold - n].sum(), rel=1e-9)


@pytest.mark.parametrize(
    ("epsilon", "delta", "hint"),
    [(0.0, 1e-6, "positive finite epsilon"), (math.inf, 1e-6, "positive finite epsilon"),
     (1.0, 0.0, "selection_delta=1e-6"), (1.0, 1.0, "public")],
)
def test_selection_validation(epsilon: float, delta: float, hint: str) -> None:
    with pytest.raises(ValueError, match=hint):
        PartitionSelection.calibrate(epsilon=epsilon, delta=delta, bounds=ContributionBounds(1, 1))
