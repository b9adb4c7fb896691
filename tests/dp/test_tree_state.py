"""Running totals of the tree's int64 node releases saturate at the int64 bounds, never wrap around.

A node drawn at a huge scale (tiny epsilon, large bounds) is itself saturated at a bound, as OpenDP's
saturating cast leaves it; two of them summed by numpy would wrap to the other sign. The reference here
is the exact sum on Python ints, clamped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stream_dp.dp import ContributionBounds
from stream_dp.dp.continual import ContinualPlan
from stream_dp.dp.tree_state import saturating_total

MAX, MIN = int(np.iinfo(np.int64).max), int(np.iinfo(np.int64).min)


def _reference(nodes: list[list[int]]) -> list[int]:
    return [min(max(sum(column), MIN), MAX) for column in zip(*nodes)]


@pytest.mark.parametrize("nodes", [
    [[MAX, MIN, 5, MAX - 1], [MAX, MIN, -7, 2]],
    [[MAX, MIN, MAX, 3], [MAX, MIN, MIN, 4], [1, -1, 1, 5]],
    [[2**62, -(2**62), 2**61, 0], [2**62, -(2**62), 2**61, 0], [2**62, -(2**62), 2**61, 0]],
    [[1, 2, 3, 4]],
])
def test_totals_are_the_exact_sums_clamped_to_int64(nodes: list[list[int]]) -> None:
    arrays = [np.array(node, dtype=np.int64) for node in nodes]
    assert saturating_total(arrays, 4).tolist() == _reference(nodes)


def test_random_nodes_near_the_bounds_match_the_exact_sums() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        depth = int(rng.integers(1, 12))
        nodes = rng.choice([MAX, MIN, 2**62, -(2**62), 0, 1, -1, 2**40], size=(depth, 6)).tolist()
        arrays = [np.array(node, dtype=np.int64) for node in nodes]
        assert saturating_total(arrays, 6).tolist() == _reference(nodes)


class SaturatedNoise:
    """Noise so large that every count node saturates at +int64 max, as a huge draw saturates."""

    def integers(self, values: np.ndarray, **_: Any) -> np.ndarray:
        return np.full(values.shape, MAX, dtype=np.int64)

    def floats(self, values: np.ndarray, **_: Any) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def top_k(self, *_: Any, **__: Any) -> np.ndarray:
        raise AssertionError("the tree draws no top-k")


def test_a_running_count_of_saturated_nodes_stays_saturated() -> None:
    plan = ContinualPlan.build(epsilon=1e-9, bounds=ContributionBounds(10_000, 10_000), clip=None,
                               aggregations={"count"}, windows_per_period=8, max_windows_per_unit=8)
    state = None
    for t in range(1, 8):
        release, state = plan.step(state, t, np.zeros(3, dtype=np.int64), None, SaturatedNoise())
        # window 3 = nodes of levels 0 and 1, window 7 three nodes: each at MAX, their sum beyond it
        assert release.count.tolist() == [MAX] * 3, (t, release.count)
