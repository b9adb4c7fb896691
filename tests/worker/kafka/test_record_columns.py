"""Records as columns: the same RawBatch as from aiokafka's records, and list-like reading."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from stream_dp.windows.batch import NO_TIMESTAMP
from stream_dp.worker.ingest.decode import raw_batch as _raw_batch
from stream_dp.worker.kafka.record_columns import CREATE_TIME, LOG_APPEND_TIME, RecordColumns, RecordView, raw_batch


def record(offset, timestamp=1_000, key=b"k", value=b"v"):
    return SimpleNamespace(offset=offset, timestamp=timestamp, key=key, value=value)


def same_batch(a, b):
    assert list(a.values) == list(b.values)
    assert list(a.keys) == list(b.keys)
    for name in ("partitions", "offsets", "timestamps", "producer_stamped"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tolist() == y.tolist(), name


def test_columns_make_the_raw_batch_that_records_make():
    records = {
        TopicPartition("t", 2): [record(5, 10, b"a", b"x"), record(6, None, None, None), record(9, 0, b"c", b"zz")],
        TopicPartition("t", 0): [record(0, -1, b"d", b"w")],
    }
    items = list(records.items())
    expected = _raw_batch(items)
    columns = [(tp, RecordColumns.of_records(rs)) for tp, rs in items]
    same_batch(raw_batch(columns), expected)
    same_batch(_raw_batch(columns), expected)  # the ingest stage's entry point takes either
    same_batch(raw_batch(columns[:1]), _raw_batch(items[:1]))
    # a record without a timestamp (None, 0 or -1) counts as having none
    assert raw_batch(columns).timestamps.tolist() == [10, NO_TIMESTAMP, NO_TIMESTAMP, NO_TIMESTAMP]


def test_consecutive_offsets_need_not_be_read():
    records = [record(o) for o in (7, 8, 9)]
    assert RecordColumns.of_records(records, consecutive_from=7).offsets.tolist() == [7, 8, 9]
    assert RecordColumns.of_records(records).offsets.dtype == np.int64


def test_columns_read_like_a_list_of_records():
    columns = RecordColumns.of_records([record(3, 30, b"a", b"1"), record(4, 40, b"b", b"2"), record(6, 60, b"c", b"3")])
    assert len(columns) == 3 and columns and not RecordColumns.empty()
    assert columns[0] == RecordView(3, 30, b"a", b"1") and columns[-1].offset == 6
    assert [r.offset for r in columns] == [3, 4, 6]
    assert isinstance(columns[0].offset, int)
    tail = columns[1:]
    assert isinstance(tail, RecordColumns) and tail.offsets.tolist() == [4, 6] and tail.values == [b"2", b"3"]
    assert columns.from_offset(5).offsets.tolist() == [6]
    assert columns.from_offset(0) is columns
    assert RecordColumns.concat([columns[:1], columns[2:]]).keys == [b"a", b"c"]
    with pytest.raises(ValueError, match="different lengths"):
        RecordColumns(np.zeros(1, np.int64), np.zeros(2, np.int64), [b""], [b""])


def test_who_stamped_a_record_is_its_batchs_timestamp_type_or_its_own():
    records = [record(0), record(1)]
    assert RecordColumns.of_records(records, timestamp_type=LOG_APPEND_TIME).producer_stamped.tolist() == [False, False]
    assert RecordColumns.of_records(records, timestamp_type=CREATE_TIME).producer_stamped.tolist() == [True, True]
    broker = SimpleNamespace(offset=2, timestamp=5, key=b"k", value=b"v", timestamp_type=LOG_APPEND_TIME)
    producer = SimpleNamespace(offset=3, timestamp=6, key=b"k", value=b"v", timestamp_type=CREATE_TIME)
    # a record that does not say who stamped it counts as its producer's: no clock unless producers are trusted
    columns = RecordColumns.of_records([broker, producer, record(4)])
    assert columns.producer_stamped.tolist() == [False, True, True]
    assert columns[1:].producer_stamped.tolist() == [True, True]
    assert RecordColumns.concat([columns[:1], columns[2:]]).producer_stamped.tolist() == [False, True]
    assert raw_batch([(TopicPartition("t", 0), columns)]).producer_stamped.tolist() == [False, True, True]
    assert _raw_batch([(TopicPartition("t", 0), [broker, producer, record(4)])]).producer_stamped.tolist() == [
        False, True, True]
