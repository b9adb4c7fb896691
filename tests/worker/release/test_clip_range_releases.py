"""Every release path with sums takes a window whose units sent values at the top of a clip range that is
not exact in binary (and at its bottom, negative ones too), with fewer events than ``max_events_per_group``:
many units in two groups, and one unit alone with one event in each of two others, the attack's case.

The window is built as the worker builds it: the query's own window engine bounds and clips the events,
its partial goes through ``partial_message`` and the combiner, and ``build_release`` draws the release.
Exact sums used to put a unit's 0.3 just above ``count x 0.3``, and the release refused the window. The
reference for the range is exact rational arithmetic on the sums the release was handed.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.windows import RawBatch
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.ingest.partials_out import partial_message
from stream_dp.worker.release.build import build_release

SECRET = b"test-secret-0123456789abcdef"
W0 = 1_704_067_200_000  # a minute boundary
PAGES = ["/top", "/bottom", "/alone_top", "/alone_bottom"]
CLIPS = [(0.0, 0.3), (-12.34, 0.7), (0.0, 1000 / 3), (-0.3, -0.1), (0.1, 99.99)]
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "gaussian": {"mechanism": "gaussian", "delta": 1e-6},
    "staircase": {"mechanism": "staircase"},
    "continual": {"continual": {"period": "10m", "max_windows_per_unit": 1}},
    "hierarchy": {"group_by": ["region", "page"], "groups": {"public": [["r", page] for page in PAGES]},
                  "hierarchy": True},
    "selected": {"groups": {"select": {"delta": 1e-6}}},
}


def _runtime(clip: tuple[float, float], options: dict[str, Any], clock: list[int]) -> Any:
    query = {
        "name": "sums", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m", "allowed_lateness": "1s"}, "group_by": ["page"],
        "groups": {"public": PAGES},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 10},
        "aggregations": {"count": {}, "sum": {"field": "value", "clip": list(clip)}, "mean": {"field": "value"}},
        "epsilon": 1.0, **options,
    }
    if options.get("mechanism") == "staircase" or "continual" in options:
        query["aggregations"].pop("mean")
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-2}]}},
                           "queries": [query]})
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: clock[0])
    return runtime


def _window(runtime: Any, clip: tuple[float, float], clock: list[int]) -> Any:
    """200 units in "/top" at (or over) the clip's top, 200 in "/bottom" at (or under) its bottom, 1 to 10 events
    each; one unit alone in "/alone_top" with one event over the top, one in "/alone_bottom" under the bottom."""
    lo, hi = clip
    values, keys = [], []
    for unit in range(402):
        if unit >= 400:
            page, value, events = ("/alone_top", hi + 1.0, 1) if unit == 400 else ("/alone_bottom", lo - 1.0, 1)
        elif unit % 2 == 0:
            page, value, events = "/top", hi + (unit % 4 == 0), 1 + unit % 10
        else:
            page, value, events = "/bottom", lo - (unit % 4 == 1), 1 + unit % 10
        for i in range(events):
            values.append(orjson.dumps({"user_id": f"u{unit}", "ts": W0 + 1 + i, "page": page, "region": "r",
                                        "value": value}))
            keys.append(f"u{unit}".encode())
    engine = runtime.engine
    engine.assign([0])
    engine.set_partition_count(1)
    n = len(values)
    result = engine.process(RawBatch(values, np.zeros(n), np.arange(n), np.full(n, W0 + 100), keys))
    assert result.accepted == n, result.rejected
    clock[0] = W0 + 10 * 60_000
    (partial,) = engine.tick()
    totals = partial.aggregate(None, histogram=runtime.histogram, features=runtime.features, blocks=runtime.blocks)
    message = partial_message(runtime, partial, totals, input_partitions=1, units=len(partial.units), excluded=0,
                              closed_at_ms=clock[0])
    assert runtime.combiner.add_partial(message, clock[0])
    return runtime.combiner.take(W0)


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("clip", CLIPS)
def test_every_path_with_sums_releases_a_window_of_values_at_the_clip_ends(clip, option):
    clock = [W0 + 1_000]
    runtime = _runtime(clip, OPTIONS[option], clock)
    window = _window(runtime, clip, clock)
    lo, hi = clip
    for count, total in zip(window.count.tolist(), window.sum.tolist()):
        assert count * Fraction(lo) <= Fraction(total) <= count * Fraction(hi), (count, total)
    entry = build_release(runtime, window, OpenDPNoise(), clock[0])  # raised "sums outside [count*lo, count*hi]"
    records = [orjson.loads(value) for _, value in entry.render()]
    pages = {r["group"]["page"] for r in records if r.get("group") and "page" in r["group"]}
    # selection keeps groups of 200 units, far above its threshold (about 30 units at epsilon 1/3 and delta
    # 1e-6), and leaves out those of one unit but once in about 10^6 windows
    assert pages == ({"/top", "/bottom"} if option == "selected" else set(PAGES)), records
