"""Release time per group of quantiles, mean_vector and covariance windows, through ``build_release``.

    .venv/bin/python tests/perf/bench_group_release.py              # ~1 min on 2 cores
    .venv/bin/python tests/perf/bench_group_release.py --groups 2000

Builds each query as ``run`` does (``build_runtimes``), with ``--groups`` public groups of 200 units
each, and times the whole window release as the release stage draws it (noise, post-processing,
records). Prints microseconds per group and quantile (quantiles, per bins) and per group and
noised coordinate (vectors): the figures ``stream_dp.config.release_time`` bounds a window's
release time with. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.dp.histogram import SparseHistogram
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.release.build import build_release

SECRET = b"bench-secret-0123456789abcdef"
UNITS = 200


def _runtime(aggregations: dict, groups: int, mechanism: str) -> object:
    query = {
        "name": "bench", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1h"}, "group_by": ["page"], "groups": {"public": [f"p{i}" for i in range(groups)]},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": aggregations, "mechanism": mechanism, "epsilon": 1.0,
        **({"delta": 1e-6} if mechanism == "gaussian" else {}),
    }
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1d", "epsilon": 100.0, "delta": 1e-3}]}},
                           "queries": [query]})
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: 0)
    return runtime


def _window(groups: int, **columns: object) -> CombinedWindow:
    units = np.full(groups, UNITS, dtype=np.int64)
    return CombinedWindow(query="bench", window_start_ms=0, window_end_ms=3_600_000, home=0,
                          groups=[(f"p{i}",) for i in range(groups)], count=units, sum=None, distinct_units=units,
                          partitions_missing=[], units_charged=int(units.sum()), units_excluded=0,
                          closed_at_ms=3_600_000, **columns)


def _time(runtime: object, window: CombinedWindow, noise: OpenDPNoise) -> float:
    started = time.perf_counter()
    build_release(runtime, window, noise, 3_700_000)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=1000)
    args = parser.parse_args()
    g, noise = args.groups, OpenDPNoise()
    rng = np.random.default_rng(0)  # synthetic data only; noise never comes from numpy
    for bins in (64, 256, 1024, 2048, 4096):
        q = [0.1, 0.5, 0.9]
        runtime = _runtime({"count": {}, "quantiles": {"field": "v", "q": q, "bounds": [0, 100], "bins": bins}},
                           g, "laplace")
        group = np.repeat(np.arange(g), UNITS)
        histogram = SparseHistogram.from_cells(g, bins, group, rng.integers(0, bins, len(group)))
        _time(runtime, _window(10, histogram=SparseHistogram.from_cells(10, bins, np.arange(10), np.arange(10))),
              noise)  # warm the measurement cache
        seconds = _time(runtime, _window(g, histogram=histogram), noise)
        print(f"quantiles bins {bins:>4}: {seconds / (g * len(q)) * 1e6:7.1f} us per group and quantile")
    for kind, dims in (("mean_vector", (2, 16, 64)), ("covariance", (2, 8, 16))):
        for d in dims:
            runtime = _runtime({"count": {}, kind: {"fields": [f"x{i}" for i in range(d)], "clip_norm": 1.0}},
                               g, "gaussian")
            width = runtime.plan.vector.features.width
            features = rng.normal(size=(g, width)) * UNITS
            _time(runtime, _window(10, features=features[:10]), noise)
            seconds = _time(runtime, _window(g, features=features), noise)
            print(f"{kind:>11} d {d:>2} ({width:>3} coordinates): {seconds / g * 1e6:8.1f} us per group, "
                  f"{seconds / (g * width) * 1e6:5.1f} us per coordinate")


if __name__ == "__main__":
    main()
