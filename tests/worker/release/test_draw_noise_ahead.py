"""The release stage's draw stashes a public-groups query's next noise (``stream_dp.dp.noise_stash``).

Each window here is drawn by ``draw_payload``, as the release stage draws it: after a window of public
groups, the same vectors are drawn for the next one in the background, and that window's release then
draws no random word of its own. A query that selects groups never stashes: its vectors' lengths come
from the data. The law and the take-once rule of the stash are tested in ``tests/dp/test_noise_stash.py``.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.dp.vectorised_noise import VectorisedExactNoise
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.release import draw as release_draw
from tests.dp.test_noise_stash import CountingBits

GROUPS = [f"/p{i}" for i in range(2_000)]


def _runtime(groups: dict):
    config = parse_config({
        "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 100.0, "delta": 1e-3}]}},
        "queries": [{
            "name": "pages", "input_topic": "in", "output_topic": "out",
            "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "1m"}, "group_by": ["page"], "groups": groups,
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}}, "epsilon": 1.0,
        }],
    })
    (runtime,) = build_runtimes(config, secret=b"test-secret-0123456789abcdef", clock_ms=lambda: 0)
    return runtime


def _window(start_ms: int, counts: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(
        query="pages", window_start_ms=start_ms, window_end_ms=start_ms + 60_000, groups=[(g,) for g in GROUPS],
        count=counts.astype(np.int64), sum=counts * 4.0, distinct_units=None,
        histogram=None, features=None, blocks=None, withheld=None,
    )


def _wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the next window's noise was not drawn ahead"
        time.sleep(0.01)


def test_the_window_after_a_public_release_adds_noise_drawn_ahead_and_draws_none():
    runtime = _runtime({"public": GROUPS})
    bits = CountingBits()
    noise = VectorisedExactNoise(bits=bits)
    metrics = WorkerMetrics(CollectorRegistry())
    counts = np.arange(len(GROUPS)) % 7

    async def draw(start_ms: int):
        return await release_draw.draw_payload(runtime, _window(start_ms, counts), noise, metrics, start_ms + 61_000)

    first = asyncio.run(draw(0))
    _wait_for(lambda: noise.stashed("pages") == 2)  # the count's and the sum's vectors

    later: list = []
    noise.predraw = lambda owner, keys: later.append((owner, keys)) or True  # no draw after the second window
    before = bits.words
    second = asyncio.run(draw(60_000))
    assert bits.words == before, "the second window drew random words although its noise was drawn ahead"
    assert noise.stashed("pages") == 0
    assert [owner for owner, _ in later] == ["pages"] and [key[2] for key in later[0][1]] == [len(GROUPS)] * 2

    records = [[orjson.loads(v) for _, v in drawn.release.render()] for drawn in (first, second)]
    assert [len(r) for r in records] == [len(GROUPS)] * 2
    noisy = [np.array([r["count"] for r in window]) for window in records]
    assert not np.array_equal(noisy[0], noisy[1])  # new draws, not the first window's again


def test_selected_groups_and_opendp_noise_are_never_drawn_ahead():
    selected, public = _runtime({"select": {"delta": 1e-6}}), _runtime({"public": GROUPS})
    assert not release_draw._stashes_noise(selected, VectorisedExactNoise())
    assert not release_draw._stashes_noise(public, OpenDPNoise())
    assert release_draw._stashes_noise(public, VectorisedExactNoise())
