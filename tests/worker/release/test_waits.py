"""Windows past their release timeout: what the release stage asks, leaves out, waits for and reports.

The broker's answers come from a stand-in (``tests/worker/release/test_partition_check.py`` reads them
from the real broker); the combiner, metrics and decisions are the worker's own.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import numpy as np
from prometheus_client import CollectorRegistry

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.partials.wire import PartialAggregate
from stream_dp.worker.release.partition_check import PartitionCheckFailed
from stream_dp.worker.release.partition_lag import PartitionEvidence
from stream_dp.worker.release.waits import PartitionWaits

MIN = 60_000
TOPIC = "in"


class _Broker:
    """Answers ``BrokerPartitions``' two questions from dicts, and records what was asked."""

    def __init__(self, evidence: dict[int, PartitionEvidence], partials_end: int = 10) -> None:
        self.answers = evidence
        self.partials_end = partials_end
        self.asked: list[tuple[list[int], int]] = []
        self.fail = False

    async def evidence(self, partitions, close_ms, broker_stamps=True):
        if self.fail:
            raise PartitionCheckFailed("the broker did not answer")
        self.asked.append(([tp.partition for tp in partitions], close_ms))
        return {tp: self.answers[tp.partition] for tp in partitions}

    async def end_offsets(self, partitions):
        return {tp: self.partials_end for tp in partitions}


def _query(partitions: int = 3) -> SimpleNamespace:
    combiner = WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=10_000,
                              public_groups=None, has_sum=False)
    combiner.add_partial(PartialAggregate(
        query="q", window_start_ms=0, window_end_ms=MIN, partition=0, input_partitions=partitions, groups=[("a",)],
        count=np.array([2]), sum=None, distinct_units=np.array([2]), units_charged=2, units_excluded=0,
        closed_at_ms=MIN + 1_000, placement_partitions=partitions), now_ms=MIN + 1_000)
    config = SimpleNamespace(input_topic=TOPIC, window=SimpleNamespace(allowed_lateness_ms=1_000))
    return SimpleNamespace(name="q", config=config, combiner=combiner)


BEHIND = PartitionEvidence(committed=3, log_start=0, log_end=50, close_offset=20)
NOTHING = PartitionEvidence(committed=9, log_start=0, log_end=9, close_offset=None)


def _waits(query, broker, clock):
    metrics = WorkerMetrics(CollectorRegistry())
    waits = PartitionWaits({"q": query}, metrics, partials_topic="partials", check=broker,
                           partition_counts=lambda topic: 0, check_interval_s=2.0, clock_s=lambda: clock[0])
    return waits, metrics


def _gauge(metrics, name):
    return getattr(metrics, name).labels("q")._value.get()


def test_a_partition_that_is_behind_is_waited_for_and_one_with_nothing_more_left_out(caplog):
    query, clock = _query(), [100.0]
    broker = _Broker({1: BEHIND, 2: NOTHING})
    waits, metrics = _waits(query, broker, clock)
    position = {0: 4}

    async def home_position(home):
        return position[home]

    async def step(now_ms):
        await waits.step(now_ms, {0}, home_position)

    caplog.set_level(logging.INFO, "stream_dp.worker.release.waits")
    asyncio.run(step(MIN + 10_999))  # within the release timeout: nothing asked
    assert broker.asked == [] and _gauge(metrics, "release_waiting_windows") == 0
    asyncio.run(step(MIN + 11_000))
    assert broker.asked == [([1, 2], MIN + 1_000)]  # at the window's close time (end + allowed lateness)
    assert _gauge(metrics, "release_waiting_windows") == 1 and _gauge(metrics, "release_wait_seconds") == 10.0
    assert "partition 1: committed offset 3, close offset 20, log 0..50: 17 records" in caplog.text
    # Partition 2 is left out only once the home partition is read up to where it ended after the answer.
    assert query.combiner.overdue(MIN + 11_000)[0].partitions == [1, 2]
    asyncio.run(step(MIN + 12_000))
    assert broker.asked == [([1, 2], MIN + 1_000)]  # asked again only after check_interval_s
    position[0] = 10
    asyncio.run(step(MIN + 12_000))
    assert query.combiner.overdue(MIN + 12_000)[0].partitions == [1]
    assert query.combiner.ready() == []  # partition 1 is behind: no time makes the window go without it
    clock[0] += 2.0
    asyncio.run(step(MIN + 600_000))
    assert broker.asked[-1] == ([1], MIN + 1_000) and _gauge(metrics, "release_wait_seconds") == 599.0
    broker.answers[1] = PartitionEvidence(committed=20, log_start=0, log_end=50, close_offset=20)
    clock[0] += 2.0
    asyncio.run(step(MIN + 602_000))
    asyncio.run(step(MIN + 602_000))  # the home is read far enough already: applied at once
    assert query.combiner.ready() == [0]
    window = query.combiner.take(0)
    assert window.partitions_missing == [1, 2]
    asyncio.run(step(MIN + 603_000))
    assert _gauge(metrics, "release_waiting_windows") == 0 and _gauge(metrics, "release_wait_seconds") == 0


def test_a_broker_that_does_not_answer_leaves_nothing_out():
    query, clock = _query(), [100.0]
    broker = _Broker({1: NOTHING, 2: NOTHING})
    broker.fail = True
    waits, metrics = _waits(query, broker, clock)

    async def home_position(home):
        return 100

    for k in range(5):
        clock[0] += 2.0
        asyncio.run(waits.step(MIN + 11_000 + k * 2_000, {0}, home_position))
    assert query.combiner.ready() == [] and _gauge(metrics, "release_waiting_windows") == 1
    assert metrics.internal_errors.labels("partition_check_failed")._value.get() == 5


def test_without_a_broker_an_overdue_window_waits_for_the_reports():
    query, clock = _query(), [100.0]
    waits, metrics = _waits(query, None, clock)

    async def home_position(home):
        return 100

    asyncio.run(waits.step(MIN + 3_600_000, {0}, home_position))
    assert query.combiner.ready() == [] and _gauge(metrics, "release_waiting_windows") == 1


def test_partitions_the_metadata_lists_are_waited_for():
    query, clock = _query(partitions=1), [100.0]
    metrics = WorkerMetrics(CollectorRegistry())
    waits = PartitionWaits({"q": query}, metrics, partials_topic="partials", check=None,
                           partition_counts=lambda topic: 4 if topic == TOPIC else 0)
    assert query.combiner.ready() == [0]
    waits.follow_partition_counts()
    assert query.combiner.ready() == [] and query.combiner.overdue(MIN + 11_000)[0].partitions == [1, 2, 3]
