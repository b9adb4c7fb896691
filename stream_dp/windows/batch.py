"""A batch of raw messages in, and what became of it out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stream_dp.windows.partial import WindowPartial
from stream_dp.windows.rejections import Rejection, RejectReason


#: A record without a timestamp (message format v0) is stamped with the worker's clock when read.
NO_TIMESTAMP = -1


@dataclass(frozen=True)
class RawBatch:
    """Kafka records as columns, index-aligned: values, partitions, offsets, record timestamps, keys.

    ``timestamps`` are the records' Kafka timestamps in epoch ms (the
    producer's ``CreateTime`` or the broker's ``LogAppendTime``;
    ``NO_TIMESTAMP`` where a record has none). They, not the events' own
    times, drive the window clock (``record_clock``). ``producer_stamped`` is
    True where the producer stamped the record (``CreateTime``); None when the
    broker stamped every record (``LogAppendTime``). ``keys`` are the message
    keys: a trusted producer clock counts its stamps per key (``record_clock``), and co-partitioning is
    checked by them; ``None`` when the caller has none (then no producer stamp moves a clock).
    """

    values: Sequence[bytes | None]
    partitions: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    keys: Sequence[bytes | None] | None = None
    producer_stamped: np.ndarray | None = None

    def __post_init__(self) -> None:
        partitions = np.asarray(self.partitions, dtype=np.int32)
        offsets = np.asarray(self.offsets, dtype=np.int64)
        timestamps = np.asarray(self.timestamps, dtype=np.int64)
        n = len(self.values)
        if (
            partitions.ndim != 1 or offsets.ndim != 1 or timestamps.ndim != 1
            or not n == len(partitions) == len(offsets) == len(timestamps)
            or (self.keys is not None and len(self.keys) != n)
        ):
            raise ValueError(
                f"values, partitions, offsets, timestamps (and keys) must be equally long 1-D sequences, got lengths "
                f"{n}, {partitions.shape}, {offsets.shape}, {timestamps.shape}"
                + ("" if self.keys is None else f", {len(self.keys)}")
            )
        object.__setattr__(self, "partitions", partitions)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "timestamps", timestamps)
        if self.producer_stamped is not None:
            stamped = np.asarray(self.producer_stamped, dtype=bool)
            if stamped.shape != (n,):
                raise ValueError(f"producer_stamped must hold one flag per record ({n}), got shape {stamped.shape}")
            object.__setattr__(self, "producer_stamped", stamped)

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class BatchResult:
    """What became of one batch: counts, rejections for a dead-letter topic, closed partials."""

    input_count: int
    accepted: int
    replayed: int
    rejected: dict[RejectReason, int]
    rejections: list[Rejection]
    partials: list[WindowPartial]
    #: Valid events of groups the query does not release (outside its public list): set aside before bounding.
    unlisted: int = 0

    @property
    def late(self) -> int:
        return self.rejected.get(RejectReason.LATE, 0)

    @property
    def balanced(self) -> bool:
        return self.accepted + sum(self.rejected.values()) + self.replayed + self.unlisted == self.input_count
