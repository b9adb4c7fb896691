"""TopKPlan: calibration against OpenDP's map and selection behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.dp import ContributionBounds, OpenDPNoise, TopKPlan
from stream_dp.dp.measurements import top_k_measurement


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 10.0), st.integers(1, 50), st.integers(1, 20))
def test_scale_is_k_linf_over_epsilon_and_certified(epsilon: float, k: int, linf: int) -> None:
    plan = TopKPlan.build(epsilon=epsilon, k=k, bounds=ContributionBounds(5, linf))
    assert plan.scale == pytest.approx(k * linf / epsilon)
    assert plan.loss.epsilon == pytest.approx(epsilon, rel=1e-9)
    assert top_k_measurement(k, plan.scale).map(linf) <= epsilon * (1 + 1e-9)
    assert plan.loss.rho == pytest.approx(plan.loss.epsilon**2 / 2)


def test_clear_winners_are_selected_best_first(noise: OpenDPNoise) -> None:
    plan = TopKPlan.build(epsilon=2.0, k=2, bounds=ContributionBounds(1, 1))
    counts = np.zeros(1_000, dtype=np.int64)
    counts[[17, 420]] = [50_000, 90_000]
    assert plan.select(counts, noise).tolist() == [420, 17]


def test_fewer_candidates_than_k(noise: OpenDPNoise) -> None:
    plan = TopKPlan.build(epsilon=1.0, k=5, bounds=ContributionBounds(1, 1))
    assert sorted(plan.select(np.array([3, 1], dtype=np.int64), noise).tolist()) == [0, 1]
    assert plan.select(np.empty(0, dtype=np.int64), noise).size == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "hint"),
    [
        ({"epsilon": 0.0, "k": 1}, ValueError, "epsilon=1.0"),
        ({"epsilon": math.inf, "k": 1}, ValueError, "positive and finite"),
        ({"epsilon": 1.0, "k": 0}, ValueError, "k=10"),
        ({"epsilon": 1.0, "k": 2.5}, ValueError, "positive int"),
    ],
)
def test_topk_validation(kwargs: dict, error: type[Exception], hint: str) -> None:
    with pytest.raises(error, match=hint):
        TopKPlan.build(bounds=ContributionBounds(1, 1), **kwargs)


def test_topk_rejects_negative_counts(noise: OpenDPNoise) -> None:
    plan = TopKPlan.build(epsilon=1.0, k=1, bounds=ContributionBounds(1, 1))
    with pytest.raises(ValueError, match="counts must be >= 0"):
        plan.select(np.array([1, -2], dtype=np.int64), noise)
