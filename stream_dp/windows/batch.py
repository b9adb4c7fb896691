"""A batch of raw messages in, and what became of it out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stream_dp.windows.partial import WindowPartial
from stream_dp.windows.rejections import Rejection, RejectReason


@dataclass(frozen=True)
class RawBatch:
    """Message values with their partition and offset, index-aligned."""

    values: Sequence[bytes | None]
    partitions: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        partitions = np.asarray(self.partitions, dtype=np.int32)
        offsets = np.asarray(self.offsets, dtype=np.int64)
        if partitions.ndim != 1 or offsets.ndim != 1 or not len(self.values) == len(partitions) == len(offsets):
            raise ValueError(
                f"values, partitions and offsets must be equally long 1-D sequences, got lengths "
                f"{len(self.values)}, {partitions.shape}, {offsets.shape}"
            )
        object.__setattr__(self, "partitions", partitions)
        object.__setattr__(self, "offsets", offsets)

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

    @property
    def late(self) -> int:
        return self.rejected.get(RejectReason.LATE, 0)

    @property
    def balanced(self) -> bool:
        return self.accepted + sum(self.rejected.values()) + self.replayed == self.input_count
