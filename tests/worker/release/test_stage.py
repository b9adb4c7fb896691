"""The release stage's count of the privacy loss it released (``stream_dp_epsilon_released_total``).

A continual query charges each unit the period's epsilon once, at the unit's
first window of the period, whichever window that is. The metric follows: it
adds the epsilon once for every period in which the query released a window,
whether the query released the period's first window or started later (it was
deployed mid-period, or its first windows expired), and a tree restarted
within the period adds nothing more. A window another run already wrote to the
ledger (republished after a crash, or replayed) adds nothing either. The
reference below is that sentence: epsilon times the number of periods in
which a window was newly released.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from stream_dp.config import parse_config
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.release import stage as release_module
from stream_dp.worker.release.stage import _Unpublished
from stream_dp.worker.store.ledger import MemoryReleaseLedger
from tests.worker._offline_stage import offline_stage

MINUTE_MS = 60_000
PERIOD_WINDOWS = 8
PERIOD_MS = PERIOD_WINDOWS * MINUTE_MS
PERIOD_START_MS = 1_700_000_040_000 // PERIOD_MS * PERIOD_MS
EPSILON = 1.5
NOW_MS = PERIOD_START_MS + 10 * PERIOD_MS  # every window below is closed, none too old to release


def runtime() -> Any:
    query = {
        "name": "visits", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a", "b", "c"]},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "aggregations": {"count": {}},
        "epsilon": EPSILON, "continual": {"period": "8m", "max_windows_per_unit": 2},
    }
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1d", "epsilon": 100.0}]}},
                           "queries": [query]})
    (built,) = build_runtimes(config, secret=b"k" * 32, clock_ms=lambda: 0)
    return built


def start_of(index: int, period: int = 0) -> int:
    """Start of the ``index``-th window (1-based) of the ``period``-th period."""
    return PERIOD_START_MS + period * PERIOD_MS + (index - 1) * MINUTE_MS


def window(rt: Any, start_ms: int) -> CombinedWindow:
    counts = np.array([5, 3, 1], dtype=np.int64)
    return CombinedWindow(rt.name, start_ms, start_ms + MINUTE_MS, 0, list(rt.public_groups), counts, None,
                          counts.copy(), [], int(counts.sum()), 0, start_ms + MINUTE_MS)


def release(stage: Any, rt: Any, starts: list[int]) -> None:
    """Release these windows in order, as the stage does once each is combined (the others never are)."""
    async def go() -> None:
        for start in starts:
            await stage._publish(_Unpublished(rt, start, start + MINUTE_MS, window=window(rt, start)))
    asyncio.run(go())


def epsilon_released(registry: Any) -> float:
    return registry.get_sample_value("stream_dp_epsilon_released_total", {"query": "visits", "namespace": "users"}) or 0.0


def reference(starts: list[int]) -> float:
    return EPSILON * len({(s - PERIOD_START_MS) // PERIOD_MS for s in starts})


@pytest.mark.parametrize("starts", [
    [start_of(i) for i in range(1, 9)],  # a whole period
    [start_of(i) for i in range(3, 9)],  # deployed within the period
    [start_of(8)],  # only its last window
    [start_of(i) for i in (2, 3, 6, 7)],  # windows 4-5 expired: the tree restarts at window 6
    [start_of(i) for i in (6, 7, 8)] + [start_of(i, 1) for i in (1, 2)],  # into the next period at its start
    [start_of(i) for i in (7, 8)] + [start_of(i, 1) for i in (4, 5)] + [start_of(2, 3)],  # none at a start
], ids=["whole-period", "from-window-3", "last-window", "restarted-tree", "two-periods", "three-periods-late"])
def test_epsilon_counts_once_per_period_with_a_released_window(starts, monkeypatch):
    rt = runtime()
    stage, registry, published = offline_stage(rt, monkeypatch, ledger=MemoryReleaseLedger(), consumer=None,
                                               now_ms=NOW_MS)
    release(stage, rt, starts)
    assert sorted({r["window"]["start_ms"] for r in published}) == starts  # every window was released
    assert epsilon_released(registry) == pytest.approx(reference(starts))


def test_the_restarted_tree_case_does_restart_the_tree(monkeypatch):
    """The gap above is a tree restart within the period, not a window that continues the tree."""
    rt = runtime()
    stage, _, published = offline_stage(rt, monkeypatch, ledger=MemoryReleaseLedger(), consumer=None, now_ms=NOW_MS)
    release(stage, rt, [start_of(i) for i in (2, 3, 6)])
    restarted = {r["window"]["start_ms"]: r["continual"]["tree_restarted_ms"] for r in published}
    assert restarted == {start_of(2): start_of(2), start_of(3): start_of(2), start_of(6): start_of(6)}


class _Crash(Exception):
    pass


def test_a_window_republished_or_replayed_after_a_crash_adds_nothing(monkeypatch):
    """A run releases windows 3 and 4 of a period, then stops after writing window 5 to the ledger and before
    publishing it. The next run (its counters start at zero) is handed window 4 again (a replay), republishes
    window 5 and releases window 6; a third run starts a new tree at window 8 (window 7 expired), then
    releases window 2 of the next period. Over all runs each period counts once."""
    ledger = MemoryReleaseLedger()
    rt = runtime()
    first, first_registry, _ = offline_stage(rt, monkeypatch, ledger=ledger, consumer=None, now_ms=NOW_MS)
    release(first, rt, [start_of(3), start_of(4)])

    async def crash(*_args: Any, **_options: Any) -> Any:
        raise _Crash

    monkeypatch.setattr(release_module, "publish_release", crash)
    with pytest.raises(_Crash):
        release(first, rt, [start_of(5)])
    assert ledger.get("visits", start_of(5)) is not None  # written, never published

    rt = runtime()
    second, second_registry, published = offline_stage(rt, monkeypatch, ledger=ledger, consumer=None, now_ms=NOW_MS)
    release(second, rt, [start_of(4), start_of(5), start_of(6)])
    assert sorted({r["window"]["start_ms"] for r in published}) == [start_of(5), start_of(6)]
    assert second_registry.get_sample_value("stream_dp_windows_republished_total", {"query": "visits"}) == 1
    assert epsilon_released(first_registry) == pytest.approx(EPSILON)
    assert epsilon_released(second_registry) == 0.0

    # A run after that one, on a fresh tree within the same period: nothing more for it.
    rt = runtime()
    third, third_registry, published = offline_stage(rt, monkeypatch, ledger=ledger, consumer=None, now_ms=NOW_MS)
    release(third, rt, [start_of(8), start_of(2, 1)])
    assert [r["continual"]["tree_restarted_ms"] for r in published if r["window"]["start_ms"] == start_of(8)] == \
        [start_of(8)] * 3
    assert epsilon_released(third_registry) == pytest.approx(EPSILON)  # the next period's, once


def test_a_step_publishes_for_its_time_budget_then_leaves_the_rest_in_window_order(monkeypatch):
    """A backlog of windows is published over several steps (each polls the consumer first), never all in
    one step longer than its budget: with no time at all, one window per step, the earliest first."""
    rt = runtime()
    starts = [start_of(i) for i in range(1, 6)]

    def stage_with(budget_s: float):
        stage, _, published = offline_stage(rt, monkeypatch, ledger=MemoryReleaseLedger(), consumer=None,
                                            now_ms=NOW_MS)
        stage.publish_budget_s = budget_s
        stage._unpublished = [_Unpublished(rt, s, s + MINUTE_MS, window=window(rt, s)) for s in reversed(starts)]
        return stage, published

    stage, published = stage_with(0.0)
    seen = []
    for _ in starts:
        asyncio.run(stage._publish_pending())
        seen.append(sorted({r["window"]["start_ms"] for r in published}))
    assert seen == [starts[:k] for k in range(1, len(starts) + 1)]

    stage, published = stage_with(60.0)
    asyncio.run(stage._publish_pending())
    assert sorted({r["window"]["start_ms"] for r in published}) == starts and not stage._unpublished
