"""Co-partitioning: every event keyed by its unit and on the partition its key maps to.

A unit's contribution is bounded where its events are. If one unit's events
could sit on several partitions (explicit partitions, null keys, another
partitioner), each partition would bound it on its own and the unit would
count several times. The expected partitions here come from kafka-python's
own partitioner and ``zlib.crc32``, not from the code under test.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, RejectReason, WindowEngine, WindowSpec

from ._support import NOW_MS, SECRET, FakeClock, event

SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",))
T = NOW_MS - 30_000


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition kafka-python's DefaultPartitioner gives ``key`` (as Kafka's Java client does)."""
    return (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions


def engine(partitions: list[int], count: int, partitioner: str = "murmur2", *, max_events: int = 1) -> WindowEngine:
    e = WindowEngine(
        SCHEMA,
        WindowSpec(size_ms=60_000, allowed_lateness_ms=5_000, idle_timeout_ms=30_000),
        BoundingSpec(max_groups_per_unit=1, max_events_per_group=max_events, secret=SECRET),
        clock_ms=FakeClock(),
        partitioner=partitioner,
    )
    e.assign(partitions)
    e.set_partition_count(count)
    return e


def records(rows: list[tuple[bytes, bytes | None, int]]) -> RawBatch:
    """(value, key, partition) per record, offsets numbered per partition, stamped T."""
    next_offset: dict[int, int] = {}
    offsets = []
    for _, _, p in rows:
        offsets.append(next_offset.get(p, 0))
        next_offset[p] = offsets[-1] + 1
    return RawBatch([v for v, _, _ in rows], np.array([p for _, _, p in rows]), np.array(offsets),
                    np.full(len(rows), T), keys=[k for _, k, _ in rows])


def test_events_keyed_and_placed_like_kafkas_producer_are_accepted():
    units = [f"user-{i}" for i in range(200)] + ["ü-é", "42"]
    rows = [(event(u, T), u.encode(), kafka_partition(u.encode(), 3)) for u in units]
    result = engine([0, 1, 2], 3).process(records(rows))
    assert result.rejected == {} and result.accepted == len(units)


def test_an_integer_unit_id_is_keyed_by_its_decimal_string():
    result = engine([0], 1).process(records([(event(42, T), b"42", 0), (event(42, T), b"042", 0)]))
    assert result.accepted == 1 and result.rejected == {RejectReason.WRONG_KEY: 1}


@pytest.mark.parametrize("key", [None, b"", b"someone-else", b"user-1\x00", b"user-1 ", b"USER-1"])
def test_a_key_that_is_not_exactly_the_unit_id_is_rejected(key):
    result = engine([0], 1).process(records([(event("user-1", T), key, 0)]))
    assert result.rejected == {RejectReason.WRONG_KEY: 1}
    (rejection,) = result.rejections
    assert "key every event by its 'user_id'" in rejection.detail


def test_an_event_on_another_partition_than_its_keys_is_rejected():
    key = b"user-7"
    right = kafka_partition(key, 3)
    wrong = (right + 1) % 3
    result = engine([0, 1, 2], 3).process(records([(event("user-7", T), key, wrong), (event("user-7", T), key, right)]))
    assert result.accepted == 1 and result.rejected == {RejectReason.WRONG_PARTITION: 1}
    (rejection,) = result.rejections
    assert rejection.partition == wrong and f"partition {right} of 3" in rejection.detail


def test_crc32_partitioner_places_keys_like_librdkafkas_default():
    units = [f"u{i}" for i in range(300)]
    rows = [(event(u, T), u.encode(), zlib.crc32(u.encode()) % 4) for u in units]
    assert engine([0, 1, 2, 3], 4, "crc32").process(records(rows)).accepted == len(units)
    result = engine([0, 1, 2, 3], 4, "murmur2").process(records(rows))
    assert result.rejected.get(RejectReason.WRONG_PARTITION, 0) > 150  # most differ between the two


def test_one_unit_on_three_partitions_of_three_engines_counts_once():
    """The attack: one event of one unit on each of partitions 0, 1, 2, read by three workers."""
    key = b"attacker"
    engines = [engine([p], 3) for p in range(3)]
    kept = 0
    for p, e in enumerate(engines):
        e.process(records([(event("attacker", T), key, p)]))
        e._clock_ms.now_ms += 10 * 60_000  # type: ignore[attr-defined]
        kept += sum(int(partial.pair_count.sum()) for partial in e.tick())
    assert kept == 1  # max_groups_per_unit * max_events_per_group


def test_placement_needs_keys_and_a_partition_count():
    e = engine([0], 1)
    with pytest.raises(ValueError, match="RawBatch.keys"):
        e.process(RawBatch([event("a", T)], np.array([0]), np.array([0]), np.array([T])))
    fresh = WindowEngine(SCHEMA, WindowSpec(size_ms=60_000), BoundingSpec(1, 1, secret=SECRET),
                         clock_ms=FakeClock(), partitioner="murmur2")
    fresh.assign([0])
    with pytest.raises(ValueError, match="set_partition_count"):
        fresh.process(records([(event("a", T), b"a", 0)]))
    with pytest.raises(ValueError, match="partition"):
        WindowEngine(SCHEMA, WindowSpec(size_ms=60_000), BoundingSpec(1, 1, secret=SECRET),
                     clock_ms=FakeClock(), partitioner="random")


def test_windows_open_across_a_partition_count_change_say_so():
    e = engine(list(range(6)), 3, max_events=5)  # owns the partitions the topic will grow to
    key = b"user-1"
    e.process(records([(event("user-1", T), key, kafka_partition(key, 3))]))
    assert e.set_partition_count(3) is False
    assert e.set_partition_count(6) is True
    later = T + 60_000  # a window opened after the change
    e.process(RawBatch([event("user-1", later)], np.array([kafka_partition(key, 6)]), np.array([5]),
                       np.array([later]), keys=[key]))
    e._clock_ms.now_ms += 10 * 60_000  # type: ignore[attr-defined]
    partials = {p.window_start_ms: p for p in e.tick()}
    before, after = partials[T // 60_000 * 60_000], partials[later // 60_000 * 60_000]
    assert (before.partition_count, before.partition_count_changed) == (3, True)
    assert (after.partition_count, after.partition_count_changed) == (6, False)
