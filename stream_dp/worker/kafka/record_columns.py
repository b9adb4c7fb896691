"""Kafka records as columns: one partition's records of one poll without an object per record.

The ingest loop needs, per record, its offset, timestamp (and who stamped it), key and value. Reading
them from one ``ConsumerRecord`` per message cost a third of the worker's time;
``RecordColumns`` holds them as two numpy arrays (offsets, timestamps) and two
lists (keys, values), built straight from the client's record batches
(``kafka.columnar_consumer``), and ``raw_batch`` joins the columns of a poll into the
engine's ``RawBatch``.

``RecordColumns`` also reads like the list of records it replaces -- ``len``,
truthiness, ``records[0].offset``, ``records[-1].offset``, iteration -- so code
written for lists of records keeps working (slowly, through ``RecordView``).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any, NamedTuple, overload

import numpy as np

from stream_dp.windows.batch import NO_TIMESTAMP, RawBatch

_OFFSET = attrgetter("offset")
_TIMESTAMP = attrgetter("timestamp")
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
#: Kafka's timestamp types: a record batch's attribute, and each record's (aiokafka's ``timestamp_type``).
CREATE_TIME, LOG_APPEND_TIME = 0, 1


class RecordView(NamedTuple):
    """One record of a ``RecordColumns``, for code that reads records one by one."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


class RecordColumns(Sequence[RecordView]):
    """One partition's records, index-aligned: ``offsets`` (int64, increasing), ``timestamps``
    (int64 epoch ms, ``NO_TIMESTAMP`` where a record has none), ``keys``, ``values`` and
    ``producer_stamped`` (True where the producer, not the broker, set the timestamp; all True when
    not given: a stamp nobody vouches for is not the broker's)."""

    __slots__ = ("offsets", "timestamps", "keys", "values", "producer_stamped")

    def __init__(self, offsets: np.ndarray, timestamps: np.ndarray, keys: list[bytes | None],
                 values: list[bytes | None], producer_stamped: np.ndarray | None = None) -> None:
        if not len(offsets) == len(timestamps) == len(keys) == len(values):
            raise ValueError(f"columns of different lengths: {len(offsets)}, {len(timestamps)}, {len(keys)}, {len(values)}")
        if producer_stamped is None:
            producer_stamped = np.ones(len(offsets), dtype=bool)
        elif len(producer_stamped) != len(offsets):
            raise ValueError(f"{len(producer_stamped)} producer_stamped flags for {len(offsets)} records")
        self.offsets = offsets
        self.timestamps = timestamps
        self.keys = keys
        self.values = values
        self.producer_stamped = producer_stamped

    @classmethod
    def empty(cls) -> RecordColumns:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), [], [], np.zeros(0, dtype=bool))

    @classmethod
    def of_records(cls, records: Sequence[Any], *, consecutive_from: int | None = None,
                   timestamp_type: int | None = None) -> RecordColumns:
        """Columns of record objects with ``offset``, ``timestamp``, ``key`` and ``value`` attributes
        (aiokafka's ``ConsumerRecord`` or a record batch's records).

        ``consecutive_from``: the records' offsets are known to run from this one without gaps.
        A timestamp that is ``None``, ``-1`` or ``0`` counts as none (``NO_TIMESTAMP``), as the
        ingest stage always read it. ``timestamp_type``: the record batch's (``LOG_APPEND_TIME`` when
        the broker stamped it); without it each record's own ``timestamp_type`` is read (a record
        without one counts as stamped by its producer).
        """
        n = len(records)
        if consecutive_from is not None:
            offsets = np.arange(consecutive_from, consecutive_from + n, dtype=np.int64)
        else:
            offsets = np.fromiter(map(_OFFSET, records), dtype=np.int64, count=n)
        try:
            timestamps = np.fromiter(map(_TIMESTAMP, records), dtype=np.int64, count=n)
        except TypeError:  # a record of the old message format without a timestamp (None)
            timestamps = np.fromiter((t or NO_TIMESTAMP for t in map(_TIMESTAMP, records)), dtype=np.int64, count=n)
        timestamps[timestamps == 0] = NO_TIMESTAMP
        if timestamp_type is not None:
            producer_stamped = np.full(n, timestamp_type != LOG_APPEND_TIME, dtype=bool)
        else:
            producer_stamped = np.fromiter((getattr(r, "timestamp_type", None) != LOG_APPEND_TIME for r in records),
                                           dtype=bool, count=n)
        return cls(offsets, timestamps, list(map(_KEY, records)), list(map(_VALUE, records)), producer_stamped)

    @classmethod
    def concat(cls, parts: Sequence[RecordColumns]) -> RecordColumns:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for part in parts:
            keys.extend(part.keys)
            values.extend(part.values)
        return cls(np.concatenate([p.offsets for p in parts]), np.concatenate([p.timestamps for p in parts]), keys, values,
                   np.concatenate([p.producer_stamped for p in parts]))

    def from_offset(self, offset: int) -> RecordColumns:
        """The records at or after ``offset``."""
        start = int(np.searchsorted(self.offsets, offset, side="left"))
        return self if start == 0 else self[start:]

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    @overload
    def __getitem__(self, index: int) -> RecordView: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    def __getitem__(self, index: int | slice) -> RecordView | RecordColumns:
        if isinstance(index, slice):
            return RecordColumns(self.offsets[index], self.timestamps[index], self.keys[index], self.values[index],
                                 self.producer_stamped[index])
        return RecordView(int(self.offsets[index]), int(self.timestamps[index]), self.keys[index], self.values[index])

    def __iter__(self) -> Iterator[RecordView]:
        return map(RecordView, self.offsets.tolist(), self.timestamps.tolist(), self.keys, self.values)

    def __repr__(self) -> str:
        if not self:
            return "RecordColumns([])"
        return f"RecordColumns({len(self)} records, offsets {int(self.offsets[0])}..{int(self.offsets[-1])})"


def raw_batch(items: Iterable[tuple[Any, RecordColumns]]) -> RawBatch:
    """One poll's records of one topic, ``(TopicPartition, RecordColumns)`` per partition, as a ``RawBatch``."""
    items = list(items)
    if len(items) == 1:
        tp, columns = items[0]
        return RawBatch(values=columns.values, partitions=np.full(len(columns), tp.partition, dtype=np.int32),
                        offsets=columns.offsets, timestamps=columns.timestamps, keys=columns.keys,
                        producer_stamped=columns.producer_stamped)
    joined = RecordColumns.concat([columns for _, columns in items])
    partitions = np.concatenate([np.full(len(columns), tp.partition, dtype=np.int32) for tp, columns in items])
    return RawBatch(values=joined.values, partitions=partitions, offsets=joined.offsets, timestamps=joined.timestamps,
                    keys=joined.keys, producer_stamped=joined.producer_stamped)
