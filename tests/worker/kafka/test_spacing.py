"""Spaced work (offset commits, progress heartbeats): at most once an interval, and at once the first time,
however long the machine has been up (the monotonic clock counts from the boot, on Linux)."""

from __future__ import annotations

import asyncio
import time

from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.ingest.stage import IngestStage
from stream_dp.worker.kafka.spacing import Spacing


def test_due_at_once_then_once_an_interval_whatever_the_clocks_zero() -> None:
    for first_s in (0.0, 30.0, -1e6, 1e9):  # booted just now, 30 s ago, or a clock with another zero
        spacing = Spacing(60.0, clock_s=lambda: first_s)
        now_s = spacing.now()
        assert now_s == first_s and spacing.due(now_s)
        spacing.done(now_s)
        assert not spacing.due(first_s) and not spacing.due(first_s + 59.999)
        assert spacing.due(first_s + 60.0) and spacing.due(first_s + 1e6)


def test_the_monotonic_clock_is_read_when_built_not_when_imported(monkeypatch) -> None:
    monkeypatch.setattr(time, "monotonic", lambda: 12.5)
    assert Spacing(1.0).now() == 12.5


class _Consumer:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, object]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("events", 0)}

    async def commit(self, offsets: dict[TopicPartition, object]) -> None:
        self.commits.append(offsets)


class _Producer:
    async def flush(self) -> None:
        return None


def test_the_ingest_stage_commits_at_once_on_a_machine_booted_seconds_ago(monkeypatch) -> None:
    monkeypatch.setattr(time, "monotonic", lambda: 30.0)  # up 30 s; commits every 60 s
    consumer = _Consumer()
    stage = IngestStage(
        [], consumer, _Producer(), None, None, WorkerMetrics(registry=CollectorRegistry()),  # type: ignore[arg-type]
        partials_topic="partials", partials_partitions=1, alerts_topic="alerts", dead_letter_topic="dead",
        read_commit_metadata=lambda partitions: {}, commit_interval_s=60.0,
    )
    assert stage.store.verify()  # the in-process store: charging may go on
    offsets = {TopicPartition("events", 0): (7, "{}")}
    stage.committable = lambda: (offsets, [])  # type: ignore[method-assign]
    asyncio.run(stage._commit())
    assert consumer.commits == [offsets]
