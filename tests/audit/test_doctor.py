"""The audit's doctored builds (pure): what each changes, and that nothing stays changed after one."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.dp.histogram import SparseHistogram
from stream_dp.dp.staircase import CalibratedStaircase
from stream_dp.windows.partial import BlockValues
from stream_dp.worker import app
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.release import draw as release_draw
from tests.audit.doctor import DOCTORINGS, doctored, doubled, local_epsilon


class _Recording:
    def __init__(self) -> None:
        self.scales: list[float] = []

    def integers(self, values, *, kind, scale):
        self.scales.append(scale)
        return values

    def floats(self, values, *, kind, scale, k):
        self.scales.append(scale)
        return values

    def top_k(self, scores, *, k, scale):
        self.scales.append(scale)
        return np.arange(k)

    def words(self, n):
        return np.zeros(n, dtype=np.uint64)


@pytest.mark.parametrize("doctoring", [None, *DOCTORINGS])
def test_a_doctoring_lasts_only_as_long_as_its_context(doctoring):
    before = (app.noise_source, release_draw.build_release, CalibratedStaircase.apply)
    with doctored(doctoring):
        during = (app.noise_source, release_draw.build_release, CalibratedStaircase.apply)
    assert (app.noise_source, release_draw.build_release, CalibratedStaircase.apply) == before
    assert (during == before) == (doctoring is None)


def test_noise_half_asks_every_law_for_half_its_scale(monkeypatch):
    inner = _Recording()
    monkeypatch.setattr(app, "noise_source", lambda *args, **kwargs: inner)
    with doctored("noise_half"):
        source = app.noise_source("exact")
        source.integers(np.zeros(2, dtype=np.int64), kind="laplace", scale=4.0)
        source.floats(np.zeros(2), kind="gaussian", scale=3.0, k=-20)
        source.top_k(np.zeros(3, dtype=np.int64), k=1, scale=8.0)
    assert inner.scales == [2.0, 1.5, 4.0]
    assert local_epsilon(1.0, "noise_half") == 2.0 and local_epsilon(1.0, "sensitivity_x2") == 1.0


def test_sensitivity_x2_doubles_every_total_and_puts_a_block_value_in_two_blocks():
    class Query:
        class plan:
            class sample_aggregate:
                blocks = 4

    window = CombinedWindow(
        query="q", window_start_ms=0, window_end_ms=1000, home=0, groups=[("a",), ("b",)],
        count=np.array([3, 0]), sum=np.array([1.5, 0.0]), distinct_units=np.array([2, 0]), partitions_missing=[],
        units_charged=2, units_excluded=0, closed_at_ms=1000,
        histogram=SparseHistogram(2, 2, np.array([0]), np.array([1]), np.array([3])),
        features=np.array([[1.0, 2.0], [0.0, 0.0]]),
        blocks=BlockValues(np.array([0], np.int32), np.array([3], np.int32), np.array([7.0])),
    )
    twice = doubled(Query, window)
    assert twice.count.tolist() == [6, 0] and twice.sum.tolist() == [3.0, 0.0]
    assert twice.distinct_units.tolist() == [4, 0] and twice.histogram.count.tolist() == [6]
    assert twice.features.tolist() == [[2.0, 4.0], [0.0, 0.0]]
    assert sorted(zip(twice.blocks.block.tolist(), twice.blocks.value.tolist())) == [(0, 7.0), (3, 7.0)]
