"""Privacy-unit id strings kept beside the rows that refer to them by hash.

Rows identify a unit by its 64-bit keyed hash; the id string is only needed
when a window closes. ``UnitNames`` stores the strings of one open window as
one byte buffer with offsets (Arrow-style), sorted by hash, so building,
trimming and looking names up are all numpy operations rather than one dict
operation per event -- a dict of 100k unit ids costs several hundred
nanoseconds per look-up once it no longer fits in cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_dp.windows.hashing import byte_lengths


def _gather(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of the strings at ``rows``, in that order."""
    lengths = offsets[rows + 1] - offsets[rows]
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    positions = np.repeat(offsets[rows] - new_offsets[:-1], lengths) + np.arange(new_offsets[-1], dtype=np.int64)
    return new_offsets, data[positions]


@dataclass(slots=True)
class UnitNames:
    """Unit id strings (UTF-8, no NUL) keyed by unit hash; ``hashes`` sorted and unique."""

    hashes: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len(hashes) + 1
    data: np.ndarray  # uint8

    @classmethod
    def empty(cls) -> UnitNames:
        return cls(np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.uint8))

    @classmethod
    def from_sorted(cls, hashes: np.ndarray, padded: np.ndarray) -> UnitNames:
        """From sorted unique ``hashes`` and their ids as a fixed-width ``S`` array."""
        width = padded.dtype.itemsize
        lengths = byte_lengths(padded)
        offsets = np.zeros(len(padded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if width == 0 or not len(padded):
            return cls(hashes, offsets, np.zeros(0, np.uint8))
        matrix = padded.view(np.uint8).reshape(len(padded), width)
        return cls(hashes, offsets, matrix[np.arange(width) < lengths[:, None]])

    def padded(self, hashes: np.ndarray) -> np.ndarray:
        """The ids of ``hashes`` (all present) as a fixed-width ``S`` array."""
        rows = np.searchsorted(self.hashes, hashes)
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        width = int(lengths.max()) if len(rows) else 0
        if width == 0:
            return np.zeros(len(rows), dtype="S1")
        matrix = np.zeros((len(rows), width), dtype=np.uint8)
        _, data = _gather(self.offsets, self.data, rows)
        matrix[np.arange(width) < lengths[:, None]] = data
        return matrix.view(f"S{width}").reshape(len(rows))

    @property
    def nbytes(self) -> int:
        return self.hashes.nbytes + self.offsets.nbytes + self.data.nbytes


def to_str(padded: np.ndarray) -> list[str]:
    """Decode a fixed-width ``S`` array of UTF-8 ids to Python strings."""
    if not (padded.view(np.uint8) & 0x80).any():
        return padded.astype(np.str_).tolist()
    return [b.decode("utf-8") for b in padded.tolist()]
