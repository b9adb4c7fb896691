"""Where a public-groups query starts publishing is no data's doing.

Every window of a query over public groups is published, data or not, from its first window on: the window
holding the query's publication start, which is the wall clock when a worker first ran the query less its
``allowed_lateness`` (kept in the release ledger by the first worker to ask), or ``window.publish_from``.
Its first window used to be its oldest window with data: one unit alone in an early window made every window
from there on published, where without it they were not. These tests drive events through the query's own
window engine, its partials through the wire format into a release stage (no Kafka, the ledger in memory),
and compare what is published with the rule above.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from aiokafka.structs import TopicPartition

from stream_dp.config import parse_config
from stream_dp.windows import RawBatch
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.ingest.partials_out import partial_message
from stream_dp.worker.partials.wire import Progress, encode_progress, partial_records
from stream_dp.worker.store.ledger import LedgerUnavailable, MemoryReleaseLedger
from tests.worker._offline_stage import offline_stage

SECRET = b"test-secret-0123456789abcdef"
MIN = 60_000
LATENESS_MS = 10_000
T = 1_704_067_225_000  # the stage's wall clock when it first runs the query: 2024-01-01T00:00:25Z
W0 = 1_704_067_200_000  # the window holding T - allowed_lateness
PAGES = ["/a", "/b"]


def _runtime(**window: Any) -> Any:
    query = {
        "name": "pages", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m", "allowed_lateness": "10s", **window}, "group_by": ["page"],
        "groups": {"public": PAGES}, "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}}, "epsilon": 1.0,
    }
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
                           "queries": [query]})
    clock = [0]  # the engine's wall clock (``_partials`` sets it)
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: clock[0])
    runtime.engine_clock = clock
    return runtime


def _partials(runtime: Any, events: list[tuple[str, int, str]]) -> list[bytes]:
    """The partials-topic records of ``events`` (unit, time, page) through the query's engine, every window closed."""
    engine = runtime.engine
    engine.assign([0])
    engine.set_partition_count(1)
    values = [orjson.dumps({"user_id": u, "ts": ts, "page": page}) for u, ts, page in events]
    n = len(values)
    runtime.engine_clock[0] = max((ts for _, ts, _ in events), default=W0) + 1_000  # sent live: none is late
    result = engine.process(RawBatch(values, np.zeros(n), np.arange(n), np.array([ts for _, ts, _ in events]),
                                     [u.encode() for u, _, _ in events]))
    assert result.accepted == n, result
    runtime.engine_clock[0] += 100 * MIN  # the partition falls idle: every window closes
    out: list[bytes] = []
    for partial in [*result.partials, *engine.tick()]:  # closed by the batch's own records, then by idleness
        message = partial_message(runtime, partial, partial.aggregate(), input_partitions=1,
                                  units=len(partial.units), excluded=0, closed_at_ms=W0 + 100 * MIN)
        out += partial_records(message, 1_000_000)
    return out


@dataclass
class _Record:
    offset: int
    value: bytes
    timestamp: int


class _Consumer:
    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("partials", 0)}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        pass


def _release(runtime: Any, records: list[bytes], through_ms: int, *, ledger: MemoryReleaseLedger | None = None,
             monkeypatch: pytest.MonkeyPatch) -> tuple[set[tuple[int, str]], Any]:
    """What a release stage publishes after reading ``records`` and progress through ``through_ms`` (its ledger's
    clock at ``T``): its (window start, page) records, and its metrics registry."""
    ledger = ledger or MemoryReleaseLedger(clock_ms=lambda: T)
    stage, registry, published = offline_stage(runtime, monkeypatch, ledger=ledger, consumer=_Consumer(), now_ms=T)
    values = records + [encode_progress(Progress("pages", 0, 1, through_ms))]
    asyncio.run(stage._step({TopicPartition("partials", 0): [_Record(i, v, T) for i, v in enumerate(values)]}))
    return {(r["window"]["start_ms"], r["group"]["page"]) for r in published}, registry


def _windows(published: set[tuple[int, str]]) -> list[int]:
    """Published windows, as indexes from ``W0``, each with every public group."""
    starts = sorted({start for start, _ in published})
    assert published == {(s, page) for s in starts for page in PAGES}, "a window without all its public groups"
    return [(s - W0) // MIN for s in starts]


def _background(window: int) -> list[tuple[str, int, str]]:
    return [(f"u{window}-{i}", W0 + window * MIN + 1_000 + i, "/a") for i in range(20)]


def test_one_unit_alone_in_an_early_window_publishes_the_same_windows(monkeypatch):
    """D: 20 units in windows 2 and 3; D': D and one unit alone in window 0. Both publish windows 0 to 5 (the
    progress passed 6): every window from the one holding T - allowed_lateness. The earlier rule published
    windows 2 to 5 of D and 0 to 5 of D'."""
    d = _background(2) + _background(3)
    target = [("target", W0 + 30_000, "/b")]
    published = {}
    for label, events, windows in (("D", d, 2), ("D'", d + target, 3)):
        runtime = _runtime()
        records = _partials(runtime, events)
        assert len(records) == windows  # one partial per window with data
        published[label], _ = _release(runtime, records, W0 + 6 * MIN, monkeypatch=monkeypatch)
    assert _windows(published["D'"]) == _windows(published["D"]), {k: _windows(v) for k, v in published.items()}
    assert _windows(published["D"]) == [0, 1, 2, 3, 4, 5]


def test_windows_before_the_start_are_dropped_and_counted_unless_publish_from_says_so(monkeypatch):
    """A backlog: data in the five windows before W0. Without publish_from they are never published (their
    partials counted as before_start); with it, from the window holding it, every window is."""
    backlog = [e for w in range(-5, 0) for e in _background(w)] + _background(1)
    runtime = _runtime()
    published, registry = _release(runtime, _partials(runtime, backlog), W0 + 3 * MIN, monkeypatch=monkeypatch)
    assert _windows(published) == [0, 1, 2]
    assert registry.get_sample_value("stream_dp_partials_unreleasable_total",
                                     {"query": "pages", "reason": "before_start"}) == 5
    since = datetime.datetime.fromtimestamp((W0 - 4 * MIN - 1) / 1000, datetime.timezone.utc).isoformat()
    runtime = _runtime(publish_from=since)  # in window -5
    published, registry = _release(runtime, _partials(runtime, backlog), W0 + 3 * MIN, monkeypatch=monkeypatch)
    assert _windows(published) == [-5, -4, -3, -2, -1, 0, 1, 2]
    assert registry.get_sample_value("stream_dp_partials_unreleasable_total",
                                     {"query": "pages", "reason": "before_start"}) is None


def test_the_first_workers_start_is_kept_for_every_later_worker(monkeypatch):
    """A restart half an hour later (a fresh combiner, the same ledger) publishes from the same first window,
    and so would any other worker of the query."""
    clock = [T]
    ledger = MemoryReleaseLedger(clock_ms=lambda: clock[0])
    first, _ = _release(_runtime(), [], W0 + 2 * MIN, ledger=ledger, monkeypatch=monkeypatch)
    assert _windows(first) == [0, 1]
    clock[0] += 30 * MIN
    later = _runtime()
    stage, _, _ = offline_stage(later, monkeypatch, ledger=ledger, consumer=_Consumer(), now_ms=clock[0])
    asyncio.run(stage.starts.learn([later]))
    assert later.combiner.query_start_ms == W0


def test_a_partial_behind_its_homes_mark_with_no_stored_release_is_never_published(monkeypatch):
    """An earlier run released the home through window 4 (its mark) but, by the ledger, never window 2: a partial
    of window 2 is dropped and counted (behind_mark), as its empty siblings there would be. Published as it was,
    it would tell that window 2 had data."""
    ledger = MemoryReleaseLedger(clock_ms=lambda: T)
    ledger.raise_released_through("pages", 0, W0 + 5 * MIN)
    runtime = _runtime()
    stage, registry, published = offline_stage(runtime, monkeypatch, ledger=ledger, consumer=_Consumer(), now_ms=T)
    asyncio.run(stage.on_assigned({0}))
    records = _partials(runtime, _background(2)) + [encode_progress(Progress("pages", 0, 1, W0 + 7 * MIN))]
    asyncio.run(stage._step({TopicPartition("partials", 0): [_Record(i, v, T) for i, v in enumerate(records)]}))
    assert _windows({(r["window"]["start_ms"], r["group"]["page"]) for r in published}) == [5, 6]
    assert registry.get_sample_value("stream_dp_partials_unreleasable_total",
                                     {"query": "pages", "reason": "behind_mark"}) == 1


class _HoldsOnce(MemoryReleaseLedger):
    """A ledger that cannot store one window's release the first time it is asked to."""

    def __init__(self, window_start_ms: int) -> None:
        super().__init__(clock_ms=lambda: T)
        self.failing = window_start_ms

    def claim(self, query: str, window_start_ms: int, payload: bytes) -> Any:
        if window_start_ms == self.failing:
            self.failing = -1
            raise LedgerUnavailable("test: the ledger did not answer")
        return super().claim(query, window_start_ms, payload)


def test_a_held_window_holds_the_later_windows_of_its_home(monkeypatch):
    """Window 1 cannot be stored: windows 2 and 3 of its home wait behind it, so the home's mark never passes a
    window it has not published (after a crash, one behind the mark is published or never is)."""
    ledger = _HoldsOnce(W0 + MIN)
    runtime = _runtime()
    stage, _, published = offline_stage(runtime, monkeypatch, ledger=ledger, consumer=_Consumer(), now_ms=T)
    monkeypatch.setattr(stage, "retry_backoff_s", 0.0)
    records = _partials(runtime, _background(2)) + [encode_progress(Progress("pages", 0, 1, W0 + 4 * MIN))]
    asyncio.run(stage._step({TopicPartition("partials", 0): [_Record(i, v, T) for i, v in enumerate(records)]}))
    assert _windows({(r["window"]["start_ms"], r["group"]["page"]) for r in published}) == [0]
    assert ledger.released_through("pages", 0) == W0 + MIN
    asyncio.run(stage._step({}))
    assert _windows({(r["window"]["start_ms"], r["group"]["page"]) for r in published}) == [0, 1, 2, 3]
