"""TopKPlan: calibration against OpenDP's map and selection behaviour.

The statistical test fails only when its p-value is below P_MIN = 1e-4: a
correct mechanism fails it about once in 10,000 runs, while a doubled epsilon
gives p-values below 1e-20 on the same number of draws.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from stream_dp.dp import ContributionBounds, OpenDPNoise, TopKPlan
from stream_dp.dp.measurements import top_k_measurement

P_MIN = 1e-4


def _permute_and_flip(scores: dict[int, float], scale: float) -> dict[int, float]:
    """One pick by McKenna & Sheldon's permute-and-flip: visit the candidates in a uniformly random order
    and stop at candidate r with probability exp((score_r - max score) / scale); exact, over every order."""
    best = max(scores.values())
    orders = list(itertools.permutations(scores))
    law = dict.fromkeys(scores, 0.0)
    for order in orders:
        running = 1.0 / len(orders)
        for candidate in order:
            accept = math.exp((scores[candidate] - best) / scale)
            law[candidate] += running * accept
            running *= 1.0 - accept
    return law


def _peeled_pairs(scores: list[float], scale: float) -> dict[tuple[int, int], float]:
    """The law of the first two picks when permute-and-flip is peeled: the second pick is a fresh
    permute-and-flip among the candidates left, its best score recomputed."""
    candidates = dict(enumerate(scores))
    pairs = {}
    for first, p_first in _permute_and_flip(candidates, scale).items():
        rest = {c: s for c, s in candidates.items() if c != first}
        for second, p_second in _permute_and_flip(rest, scale).items():
            pairs[(first, second)] = p_first * p_second
    return pairs


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


def test_top_two_follow_peeled_permute_and_flip_at_the_plan_scale(noise: OpenDPNoise) -> None:
    # scale k Linf / epsilon = 2: each of the 12 ordered pairs of the four candidates expects 33 draws or more
    plan = TopKPlan.build(epsilon=1.0, k=2, bounds=ContributionBounds(1, 1))
    counts = np.array([10, 9, 7, 4], dtype=np.int64)
    draws = 20_000
    picks = collections.Counter(tuple(plan.select(counts, noise).tolist()) for _ in range(draws))
    law = _peeled_pairs(counts.tolist(), scale=2.0)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12) and len(law) == 12
    assert set(picks) <= set(law), picks  # two distinct candidates, nothing else
    pairs = sorted(law)
    observed = np.array([picks[p] for p in pairs])
    assert stats.chisquare(observed, np.array([law[p] for p in pairs]) * draws).pvalue > P_MIN, picks
    # the same draws tell the law at twice the epsilon apart (scale 1)
    doubled = _peeled_pairs(counts.tolist(), scale=1.0)
    assert stats.chisquare(observed, np.array([doubled[p] for p in pairs]) * draws).pvalue < 1e-20


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
