"""The release stage stashes a public-groups query's next noise (``stream_dp.dp.noise_stash``).

Each window here goes through the release stage's own publish path (Kafka replaced by a list): once a
window of public groups is published -- not before, where the draw would slow the publish -- the same
vectors are drawn for the next one in the background, and that window's release then draws no random
word of its own. A query that selects groups never stashes: its vectors' lengths come
from the data. The law and the take-once rule of the stash are tested in ``tests/dp/test_noise_stash.py``.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.dp.vectorised_noise import VectorisedExactNoise
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.release import draw as release_draw
from stream_dp.worker.release import stage as release_stage
from stream_dp.worker.release.stage import _Unpublished
from stream_dp.worker.store.ledger import MemoryReleaseLedger
from tests.dp.test_noise_stash import CountingBits
from tests.worker._offline_stage import offline_stage

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


def _window(runtime, start_ms: int) -> CombinedWindow:
    counts = (np.arange(len(GROUPS)) % 7).astype(np.int64)
    return CombinedWindow(runtime.name, start_ms, start_ms + 60_000, 0, list(runtime.public_groups), counts,
                          counts * 4.0, counts.copy(), [], int(counts.sum()), 0, start_ms + 60_000)


def _wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the next window's noise was not drawn ahead"
        time.sleep(0.01)


def test_the_window_after_a_public_release_adds_noise_drawn_ahead_once_published(monkeypatch):
    runtime = _runtime({"public": GROUPS})
    stage, _, published = offline_stage(runtime, monkeypatch, ledger=MemoryReleaseLedger(), consumer=None,
                                        now_ms=10**12)
    bits = CountingBits()
    stage.noise = noise = VectorisedExactNoise(bits=bits)
    seen_while_publishing: list[tuple[int, bool]] = []
    publish = release_stage.publish_release

    async def watched(producer, topic, release, **options):  # the stash as each publish starts
        seen_while_publishing.append((noise.stashed("pages"), "pages" in noise._stash._drawing))
        return await publish(producer, topic, release, **options)

    monkeypatch.setattr(release_stage, "publish_release", watched)

    async def release(start_ms: int) -> None:
        await stage._publish(_Unpublished(runtime, start_ms, start_ms + 60_000, window=_window(runtime, start_ms)))

    asyncio.run(release(0))
    _wait_for(lambda: noise.stashed("pages") == 2)  # the count's and the sum's vectors, drawn after the publish
    assert seen_while_publishing == [(0, False)], "the next window's noise was drawn beside the publish"

    later: list = []
    noise.predraw = lambda owner, keys: later.append((owner, keys)) or True  # no draw after the second window
    before = bits.words
    asyncio.run(release(60_000))
    assert bits.words == before, "the second window drew random words although its noise was drawn ahead"
    assert noise.stashed("pages") == 0
    assert [owner for owner, _ in later] == ["pages"] and [key[2] for key in later[0][1]] == [len(GROUPS)] * 2

    assert len(published) == 2 * len(GROUPS)
    first, second = (np.array([r["count"] for r in published if r["window"]["start_ms"] == s]) for s in (0, 60_000))
    assert not np.array_equal(first, second)  # new draws, not the first window's again


def test_selected_groups_and_opendp_noise_are_never_drawn_ahead():
    selected, public = _runtime({"select": {"delta": 1e-6}}), _runtime({"public": GROUPS})
    assert not release_draw._stashes_noise(selected, VectorisedExactNoise())
    assert not release_draw._stashes_noise(public, OpenDPNoise())
    assert release_draw._stashes_noise(public, VectorisedExactNoise())


def test_a_draw_ahead_that_fails_is_logged_and_one_cancelled_with_the_loop_is_not(caplog):
    async def settle():
        loop = asyncio.get_running_loop()
        failed, cancelled = loop.create_future(), loop.create_future()
        failed.set_exception(MemoryError("no room"))
        cancelled.cancel()
        for future in (failed, cancelled):
            release_draw._report_predraw(future, "pages")  # a cancelled future's exception() would raise here

    asyncio.run(settle())
    logged = [r.getMessage() for r in caplog.records if "drawn ahead" in r.getMessage()]
    assert logged == ["noise for the next window of pages was not drawn ahead: MemoryError('no room')"]
