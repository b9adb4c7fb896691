"""Which input partitions may count as idle, and which closure is durable (pure logic, a stand-in consumer)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from aiokafka.structs import TopicPartition

from stream_dp.worker.kafka.positions import PartitionPositions

T = "in"


@dataclass
class _Record:
    offset: int


@dataclass
class _Consumer:
    """The four calls PartitionPositions makes, answering from dicts."""

    highwaters: dict[TopicPartition, int | None]
    commits: dict[TopicPartition, int | None] = field(default_factory=dict)
    beginnings: dict[TopicPartition, int] = field(default_factory=dict)
    fail_lookups: bool = False
    lookups: int = 0
    fetched_at: int | None = 1_000_000  # last fetch response, ms; the tests' clock reads 1_000_000

    def assignment(self):
        return set(self.highwaters)

    def highwater(self, tp):
        return self.highwaters[tp]

    def last_poll_timestamp(self, tp):
        return self.fetched_at

    async def beginning_offsets(self, tps):
        self.lookups += 1
        if self.fail_lookups:
            raise TimeoutError("broker away")
        return {tp: self.beginnings.get(tp, 0) for tp in tps}

    async def committed(self, tp):
        return self.commits.get(tp)


def _tp(p: int) -> TopicPartition:
    return TopicPartition(T, p)


NOW_MS = 1_000_000


def _positions(consumer: _Consumer) -> PartitionPositions:
    return PartitionPositions(consumer, fresh_fetch_ms=10_000, clock_ms=lambda: NOW_MS)


def _not_idle(consumer: _Consumer, batches: dict | None = None) -> set[int]:
    positions = _positions(consumer)
    positions.note_batches(batches or {})
    asyncio.run(positions.learn_starts())
    return positions.not_idle().get(T, set())


def test_a_partition_whose_end_is_not_known_yet_is_not_idle():
    assert _not_idle(_Consumer({_tp(0): None})) == {0}


def test_an_empty_partition_is_idle_and_one_with_records_waiting_is_not():
    consumer = _Consumer({_tp(0): 0, _tp(1): 7})
    assert _not_idle(consumer) == {1}  # nothing read from 1 yet, 7 records from the log start


def test_reading_starts_at_the_committed_offset_or_the_log_start_if_retention_passed_it():
    consumer = _Consumer({_tp(0): 5, _tp(1): 9, _tp(2): 10},
                         commits={_tp(0): 5, _tp(1): 5, _tp(2): 2}, beginnings={_tp(2): 10})
    assert _not_idle(consumer) == {1}


def test_records_read_move_the_position():
    consumer = _Consumer({_tp(0): 10, _tp(1): 10})
    batches = {_tp(0): [_Record(8)], _tp(1): [_Record(9)]}  # 0 read through 8: offset 9 waits
    assert _not_idle(consumer, batches) == {0}


def test_a_failed_lookup_holds_the_partition_open_and_is_retried():
    consumer = _Consumer({_tp(0): 0}, fail_lookups=True)
    positions = _positions(consumer)
    asyncio.run(positions.learn_starts())
    assert positions.not_idle() == {T: {0}}
    consumer.fail_lookups = False
    asyncio.run(positions.learn_starts())
    assert positions.not_idle() == {}
    asyncio.run(positions.learn_starts())
    assert consumer.lookups == 2  # once known, not asked again


def test_durable_closure_only_rises_and_is_forgotten_with_the_partition():
    positions = _positions(_Consumer({_tp(0): 0}))
    assert positions.durable_through("q", _tp(0)) is None
    positions.restored("q", _tp(0), 5_000)
    positions.committed([("q", _tp(0), 4_000), ("r", _tp(0), 1_000)])
    assert positions.durable_through("q", _tp(0)) == 5_000
    positions.committed([("q", _tp(0), 9_000)])
    assert (positions.durable_through("q", _tp(0)), positions.durable_through("r", _tp(0))) == (9_000, 1_000)
    positions.forget([_tp(0)])
    assert positions.durable_through("q", _tp(0)) is None


def test_while_the_broker_does_not_answer_nothing_is_idle():
    consumer = _Consumer({_tp(0): 5, _tp(1): 5}, commits={_tp(0): 5, _tp(1): 5})
    consumer.fetched_at = NOW_MS - 10_000
    assert _not_idle(consumer) == set()  # read to the end, as a fetch 10 s ago said
    consumer.fetched_at = NOW_MS - 10_001
    assert _not_idle(consumer) == {0, 1}  # no answer for longer: the end is not known
    consumer.fetched_at = None
    assert _not_idle(consumer) == {0, 1}


def test_the_freshness_limit_must_be_positive():
    with pytest.raises(ValueError, match="fresh_fetch_ms must be positive"):
        PartitionPositions(_Consumer({}), fresh_fetch_ms=0)


def test_after_a_stall_of_the_loop_nothing_is_idle_until_watched_again():
    """A worker whose loop stalled (its sends and commits waiting out a broker outage) did not watch
    its partitions meanwhile: a fresh fetch saying "read to the end" then only means the producers'
    buffered records have not arrived yet."""
    clock = [NOW_MS]
    consumer = _Consumer({_tp(0): 5, _tp(1): 5}, commits={_tp(0): 5, _tp(1): 5})
    positions = PartitionPositions(consumer, fresh_fetch_ms=3_000, clock_ms=lambda: clock[0])
    asyncio.run(positions.learn_starts())
    assert positions.not_idle() == {}
    clock[0] += 3_000
    consumer.fetched_at = clock[0]
    assert positions.not_idle() == {}  # watched every 3 s: caught up and idle
    clock[0] += 3_001
    consumer.fetched_at = clock[0]
    assert positions.not_idle() == {T: {0, 1}}  # 3.001 s unwatched
    clock[0] += 200
    assert positions.not_idle() == {}  # watched again
