"""Per-group histograms of bounded values: the input of the quantiles release.

A query with ``quantiles`` counts, per group, its bounded and budget-admitted
events in ``bins`` equal-width bins over ``[lo, hi]``: bin ``b`` holds the values
``v`` with ``c_b <= v < c_{b+1}`` and the last one ``hi`` too, ``c_j`` the edges
``lo + j (hi - lo) / bins`` exactly as :meth:`HistogramSpec.edges` computes them
in float64 -- the edges the quantiles release publishes, so a released edge
has exactly the values of the bins below it beneath it. Values were clipped
into ``[lo, hi]`` before bounding.

Histograms are kept sparse -- one (group, bin, count) cell per nonzero count,
sorted by group then bin -- because a window may hold a million groups and a
dense million-by-256 matrix would be two gigabytes of mostly zeros. That order
is canonical: the same counts give bit-identical columns however they were
added up.

The window engine builds them (``stream_dp.windows.partial``), the worker adds
up workers' partials, and the quantiles and sample-and-aggregate releases read
them; they live beside the releases so that ``dp`` imports nothing of the window
engine. Pure logic, no I/O.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

#: Bins are stored as uint16 on the wire.
MAX_BINS = 1 << 16
# Adding up cells: a dense bincount when the matrix is at most this many times the cells
# (plus a constant), else a sort. Both give the same sorted cells.
_DENSE_FACTOR = 4
_DENSE_SLACK = 1 << 16


@dataclass(frozen=True)
class HistogramSpec:
    """``bins`` equal-width bins over ``[lo, hi]``: which bin each value falls in."""

    bins: int
    lo: float
    hi: float

    def __post_init__(self) -> None:
        if isinstance(self.bins, bool) or not isinstance(self.bins, numbers.Integral) or not 1 <= self.bins <= MAX_BINS:
            raise ValueError(f"bins must be an integer in [1, {MAX_BINS}], got {self.bins!r}; 256 is typical")
        for name in ("lo", "hi"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"histogram {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "bins", int(self.bins))
        if not self.lo < self.hi:
            raise ValueError(
                f"histogram bounds need lo < hi, got [{self.lo}, {self.hi}]; use the query's quantile bounds"
            )

    def bin_of(self, values: np.ndarray) -> np.ndarray:
        """Each value's bin (int64): ``b`` with ``edges[b] <= v < edges[b + 1]``, ``hi`` in the last; values
        outside ``[lo, hi]`` go to the nearest end bin."""
        v = np.asarray(values, dtype=np.float64)
        scaled = (v - self.lo) / (self.hi - self.lo) * self.bins
        index = np.clip(np.floor(scaled), 0, self.bins - 1).astype(np.int64)
        # The division rounds apart from the edges' own products: a value on an edge that is not exact in
        # binary (0.3 of [0, 1] in 10 bins) can land a bin off. Those few are placed by the edges themselves.
        edges = self.edges()
        off = ((v < edges[index]) & (index > 0)) | ((v >= edges[index + 1]) & (index < self.bins - 1))
        if off.any():
            index[off] = np.clip(np.searchsorted(edges, v[off], side="right") - 1, 0, self.bins - 1)
        return index

    def edges(self) -> np.ndarray:
        """The ``bins + 1`` bin edges ``lo + j (hi - lo) / bins``, the last one exactly ``hi``."""
        out = self.lo + np.arange(self.bins + 1, dtype=np.float64) * ((self.hi - self.lo) / self.bins)
        out[-1] = self.hi
        return out


@dataclass(frozen=True, eq=False)
class SparseHistogram:
    """The nonzero cells of an ``(n_groups, bins)`` count matrix, sorted by (group, bin).

    ``group`` (int64) indexes the groups list it travels with, ``bin`` (uint16)
    is the bin, ``count`` (int64, positive) the number of values. Build it with
    :meth:`from_cells` (which adds up repeated cells and sorts) or :meth:`empty`.
    """

    n_groups: int
    bins: int
    group: np.ndarray
    bin: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.n_groups, numbers.Integral) or self.n_groups < 0:
            raise ValueError(f"n_groups must be a non-negative integer, got {self.n_groups!r}")
        if not isinstance(self.bins, numbers.Integral) or not 1 <= self.bins <= MAX_BINS:
            raise ValueError(f"bins must be an integer in [1, {MAX_BINS}], got {self.bins!r}")
        object.__setattr__(self, "n_groups", int(self.n_groups))
        object.__setattr__(self, "bins", int(self.bins))
        group = np.asarray(self.group, dtype=np.int64)
        count = np.asarray(self.count, dtype=np.int64)
        raw_bin = np.asarray(self.bin)
        if not (group.ndim == raw_bin.ndim == count.ndim == 1 and len(group) == len(raw_bin) == len(count)):
            raise ValueError(
                f"histogram columns must be 1-d and equally long, got {group.shape}, {raw_bin.shape}, {count.shape}"
            )
        if len(group):
            if group.min() < 0 or group.max() >= self.n_groups or raw_bin.min() < 0 or raw_bin.max() >= self.bins:
                raise ValueError(
                    f"histogram cells out of range: groups must be in [0, {self.n_groups}) and bins in "
                    f"[0, {self.bins}); build the histogram with SparseHistogram.from_cells"
                )
            if count.min() <= 0:
                raise ValueError("histogram cells hold positive counts only; leave empty cells out (from_cells does)")
            cell = group * self.bins + raw_bin.astype(np.int64)
            if len(cell) > 1 and not (cell[1:] > cell[:-1]).all():
                raise ValueError("histogram cells must be distinct and sorted by (group, bin); use from_cells")
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "bin", raw_bin.astype(np.uint16))
        object.__setattr__(self, "count", count)

    @classmethod
    def empty(cls, n_groups: int, bins: int) -> SparseHistogram:
        return cls(n_groups, bins, np.zeros(0, np.int64), np.zeros(0, np.uint16), np.zeros(0, np.int64))

    @classmethod
    def from_cells(
        cls, n_groups: int, bins: int, group: np.ndarray, bin: np.ndarray, count: np.ndarray | None = None
    ) -> SparseHistogram:
        """Cells added up (repeats summed, zero counts dropped) and sorted; ``count=None`` counts 1 per cell."""
        cell = np.asarray(group, dtype=np.int64) * int(bins) + np.asarray(bin, dtype=np.int64)
        weights = None if count is None else np.asarray(count, dtype=np.int64)
        if not len(cell):
            return cls.empty(n_groups, bins)
        size = int(n_groups) * int(bins)
        if size <= _DENSE_FACTOR * len(cell) + _DENSE_SLACK:
            # integer weights: bincount would sum them in float64, exact only below 2^53, so add them exactly
            if weights is None:
                dense = np.bincount(cell, minlength=size)
            else:
                dense = np.zeros(size, dtype=np.int64)
                np.add.at(dense, cell, weights)
            where = np.flatnonzero(dense)
            totals = dense[where].astype(np.int64)
        else:
            order = np.argsort(cell, kind="stable")
            sorted_cells = cell[order]
            starts = np.flatnonzero(np.r_[True, sorted_cells[1:] != sorted_cells[:-1]])
            where = sorted_cells[starts]
            if weights is None:
                totals = np.diff(np.r_[starts, len(cell)]).astype(np.int64)
            else:
                totals = np.add.reduceat(weights[order], starts)
            nonzero = totals != 0
            where, totals = where[nonzero], totals[nonzero]
        return cls(int(n_groups), int(bins), where // bins, (where % bins).astype(np.uint16), totals)

    def __eq__(self, other: object) -> bool:
        """Equal shapes and bit-identical columns."""
        if not isinstance(other, SparseHistogram):
            return NotImplemented
        return (self.n_groups, self.bins) == (other.n_groups, other.bins) and all(
            getattr(self, name).tobytes() == getattr(other, name).tobytes() for name in ("group", "bin", "count")
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_groups, self.bins

    def __len__(self) -> int:
        """Nonzero cells."""
        return len(self.count)

    def totals(self) -> np.ndarray:
        """Values per group (int64)."""
        out = np.zeros(self.n_groups, dtype=np.int64)
        np.add.at(out, self.group, self.count)
        return out

    def dense(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` as a dense int64 ``(rows, bins)`` matrix (read big histograms in slices)."""
        stop = self.n_groups if stop is None else min(stop, self.n_groups)
        start = max(0, min(start, stop))
        out = np.zeros((stop - start, self.bins), dtype=np.int64)
        first, last = np.searchsorted(self.group, [start, stop])
        out[self.group[first:last] - start, self.bin[first:last].astype(np.int64)] = self.count[first:last]
        return out

    def take_groups(self, positions: np.ndarray, n_groups: int) -> SparseHistogram:
        """Cells moved to group ``positions[g]`` of ``n_groups`` (cells of a group mapped to -1 are dropped)."""
        moved = np.asarray(positions, dtype=np.int64)[self.group]
        keep = moved >= 0
        return SparseHistogram.from_cells(n_groups, self.bins, moved[keep], self.bin[keep], self.count[keep])


def add_histograms(parts: list[SparseHistogram], n_groups: int, bins: int) -> SparseHistogram:
    """The cell-wise sum of histograms already aligned with one groups list of ``n_groups``."""
    for part in parts:
        if part.shape != (n_groups, bins):
            raise ValueError(f"cannot add a {part.shape} histogram to a ({n_groups}, {bins}) one")
    if not parts:
        return SparseHistogram.empty(n_groups, bins)
    if len(parts) == 1:
        return parts[0]
    return SparseHistogram.from_cells(
        n_groups, bins,
        np.concatenate([p.group for p in parts]),
        np.concatenate([p.bin for p in parts]),
        np.concatenate([p.count for p in parts]),
    )
