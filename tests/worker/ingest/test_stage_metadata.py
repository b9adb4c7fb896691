"""Reading the committed window progress at assignment: retried while the broker recovers.

Pure retry logic, on a stand-in for the admin call (the broker side is exercised by the broker-outage
and fault tests)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.ingest.stage import IngestStage


class _FlakyAdmin:
    """Fails ``failures`` times (as a coordinator that is still loading does), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self, partitions):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("GroupCoordinatorNotAvailableError")
        return {tp: '{"record_clock_ms": 5}' for tp in partitions}


def _read(failures: int, monkeypatch):
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    registry = CollectorRegistry()
    admin = _FlakyAdmin(failures)
    stage = SimpleNamespace(read_commit_metadata=admin, metrics=WorkerMetrics(registry=registry))
    got = asyncio.run(IngestStage._read_commit_metadata(stage, [TopicPartition("in", 0)]))
    unreadable = registry.get_sample_value("stream_dp_internal_errors_total", {"kind": "commit_metadata_unreadable"})
    return got, admin.calls, unreadable


async def _no_sleep(_seconds: float) -> None:
    return None


def test_a_coordinator_that_answers_after_a_few_errors_still_gives_the_progress(monkeypatch):
    got, calls, unreadable = _read(3, monkeypatch)
    assert got == {TopicPartition("in", 0): '{"record_clock_ms": 5}'} and calls == 4
    assert not unreadable


def test_progress_that_stays_unreadable_is_counted_and_the_worker_goes_on(monkeypatch):
    got, calls, unreadable = _read(100, monkeypatch)
    assert got == {} and calls == 6 and unreadable == 1
