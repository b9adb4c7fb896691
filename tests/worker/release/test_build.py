"""``max_released_groups`` of a quantiles query over selected groups, as ``build_release`` applies it.

README: when more groups pass selection than ``max_released_groups``, those with the largest noisy counts
are released (ties by group key) and the others left out -- a choice made from released counts alone.
The reference here reads the noisy counts from the records of the same window released without a cap
(every draw of the counts and of selection replayed), and picks the largest by itself.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import orjson

from stream_dp.dp import OpenDPNoise
from stream_dp.dp.histogram import SparseHistogram
from stream_dp.worker.release.build import build_release
from tests.worker.release.test_selected_group_releases import KEPT_UNITS, _records, _runtime, _window

BINS = 64


class _Replayed:
    """The production noise source, its count and selection draws (``integers``) kept on a first release
    and handed back, in order, on a second: the two releases see the same noisy counts and selection."""

    def __init__(self) -> None:
        self.inner = OpenDPNoise()
        self.drawn: list[np.ndarray] = []
        self.replay: list[np.ndarray] | None = None

    def integers(self, values: np.ndarray, **kwargs: Any) -> np.ndarray:
        if self.replay is not None:
            out = self.replay.pop(0)
            assert out.shape == np.shape(values)
            return out.copy()
        out = self.inner.integers(values, **kwargs)
        self.drawn.append(out.copy())
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _quantiles_runtime(cap: int) -> Any:
    return _runtime({"count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 100],
                                                "bins": BINS, "max_released_groups": cap}})


def test_a_capped_quantiles_window_releases_the_groups_with_the_largest_noisy_counts(caplog):
    kept, made_up, cap = 8, 30, 3
    # 8 groups far above the selection threshold with event counts 1 apart, so that the count noise
    # (scale 5 / (10 / 2) = 1 at least) reorders them: the cap must follow the noisy counts, not the true
    units = [KEPT_UNITS] * kept + [1] * made_up
    counts = [500 + i for i in range(kept)] + [1] * made_up
    group = np.repeat(np.arange(kept + made_up), 5)
    histogram = SparseHistogram.from_cells(kept + made_up, BINS, group, np.arange(len(group)) % BINS)
    window = _window(units, counts=counts, histogram=histogram)
    for _ in range(5):  # each run draws new counts: five different orders
        noise = _Replayed()
        uncapped = _records(build_release(_quantiles_runtime(100_000), window, noise, 130_000))
        noise.replay = list(noise.drawn)
        with caplog.at_level(logging.WARNING, logger="stream_dp.worker.release.build"):
            capped = _records(build_release(_quantiles_runtime(cap), window, noise, 130_000))
        assert noise.replay == []  # the same draws, all of them
        assert {r["group"]["page"] for r in uncapped} == {f"p{i}" for i in range(kept)}
        ranked = sorted(uncapped, key=lambda r: (-r["count"], orjson.dumps([r["group"]["page"]])))
        expected = {r["group"]["page"]: r["count"] for r in ranked[:cap]}
        assert {r["group"]["page"]: r["count"] for r in capped} == expected
        assert all(set(r["quantiles"]) == {"0.5", "0.9"} for r in capped)
        assert any(f"{kept} groups passed selection; the {cap} with the largest noisy counts are released "
                   "(quantiles.max_released_groups), the other 5 left out" in r.getMessage()
                   for r in caplog.records), caplog.text
        caplog.clear()
