"""A window's totals over its partitions' partials: ``CombinedWindow`` and the pure sum that builds it.

Pure logic, no I/O: ``combine.combiner`` decides which partials a window adds up and when.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stream_dp.dp.histogram import SparseHistogram, add_histograms
from stream_dp.windows.partial import BlockValues
from stream_dp.worker.partials.wire import GroupKey, PartialAggregate


@dataclass(frozen=True)
class CombinedWindow:
    """Totals of one window over all partitions that reported, ready for noise."""

    query: str
    window_start_ms: int
    window_end_ms: int
    home: int
    groups: list[GroupKey]
    count: np.ndarray
    sum: np.ndarray | None
    distinct_units: np.ndarray
    partitions_missing: list[int]
    units_charged: int
    units_excluded: int
    closed_at_ms: int | None  # earliest close time among partials (None for an empty window)
    source_offsets: list[tuple[int, int]] = field(default_factory=list)
    #: Why the partials' data was left out (the window is released as if empty), or None.
    withheld: str | None = None
    #: Quantiles queries: per-group value histogram, sparse, rows aligned with ``groups`` (a group
    #: without data has no cell); None for other queries (and windows without any histogram to add).
    histogram: SparseHistogram | None = None
    #: Vector queries: per-group sums of the units' feature vectors, (groups, width); None for others.
    features: np.ndarray | None = None
    #: Sample-and-aggregate queries: every kept event's (group, block, value), groups as in ``groups``,
    #: partitions in order; None for others.
    blocks: BlockValues | None = None


def merge_partials(
    partials: list[PartialAggregate],
    *,
    public_groups: list[GroupKey] | None,
    public_index: dict[GroupKey, int] | None,
    has_sum: bool,
    quantile_bins: int | None,
    feature_width: int | None,
    blocks: bool,
) -> tuple[list[GroupKey], np.ndarray, np.ndarray | None, np.ndarray, SparseHistogram | None, np.ndarray | None,
           BlockValues | None]:
    """A window's totals over ``partials``: groups (the public list, in order, or the union of the partials'
    groups), counts, sums, distinct units, histogram, feature sums and block values (see ``CombinedWindow``).
    ``public_index``: each public group's position."""
    if public_index is not None:
        index = public_index
        groups = list(public_groups)  # type: ignore[arg-type]
    else:
        index = {}
        for partial in partials:
            for group in partial.groups:
                index.setdefault(group, len(index))
        groups = list(index)
    n = len(groups)
    count = np.zeros(n, dtype=np.int64)
    distinct = np.zeros(n, dtype=np.int64)
    sums = np.zeros(n, dtype=np.float64) if has_sum else None
    histograms: list[SparseHistogram] = []
    features = None if feature_width is None else np.zeros((n, feature_width), dtype=np.float64)
    block_parts: list[BlockValues] = []
    for partial in partials:
        # Groups outside the public list are dropped here (-1): they are never released.
        positions = None if public_index is None else _public_positions(partial, groups)
        # Checked to name each group once, public positions are added with one fancy-indexed +=.
        add = _add_once if positions is not None else np.add.at
        if positions is None:
            positions = np.fromiter((index.get(g, -1) for g in partial.groups), dtype=np.int64,
                                    count=len(partial.groups))
        keep = positions >= 0
        add(count, positions[keep], partial.count[keep])
        add(distinct, positions[keep], partial.distinct_units[keep])
        if sums is not None and partial.sum is not None:
            add(sums, positions[keep], partial.sum[keep])
        if partial.histogram is not None:
            histograms.append(partial.histogram.take_groups(positions, n))
        if features is not None and partial.features is not None:
            np.add.at(features, positions[keep], partial.features[keep])
        if blocks and partial.blocks is not None and len(partial.blocks):
            where = positions[partial.blocks.group]
            inside = where >= 0
            block_parts.append(BlockValues(where[inside].astype(np.int32), partial.blocks.block[inside],
                                           partial.blocks.value[inside]))
    bins = quantile_bins if quantile_bins is not None else (histograms[0].bins if histograms else None)
    histogram = None if bins is None else add_histograms(histograms, n, bins)
    block_values = None
    if blocks:
        block_values = BlockValues(*(np.concatenate([getattr(b, name) for b in block_parts]) if block_parts
                                     else np.zeros(0, dtype) for name, dtype in
                                     (("group", np.int32), ("block", np.int32), ("value", np.float64))))
    return groups, count, sums, distinct, histogram, features, block_values


_CHECKED_KEYS = 64


def _add_once(total: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    total[at] += values  # ``at`` holds no position twice


def _public_positions(partial: PartialAggregate, public_groups: list[GroupKey]) -> np.ndarray | None:
    """The partial's own positions of its groups in the public list (``PartialAggregate.public_positions``),
    checked: in range, each at most once, and the keys of up to 64 rows spread over the partial are those of
    their positions; None when the partial has none. A partial is combined only under the settings it was
    charged under, which fix the public list and its order, so a failed check is a fault of the writer: it
    raises, and the window is released as if empty (``combine.combiner``)."""
    positions = partial.public_positions
    if positions is None:
        return None
    listed = positions[positions >= 0]
    n = len(public_groups)
    if len(positions) != len(partial.groups) or (len(listed) and (int(listed.max()) >= n or int(positions.min()) < -1)):
        raise ValueError(f"partial of partition {partial.partition} names public positions outside 0..{n - 1}")
    if len(listed) and int(np.bincount(listed, minlength=n).max()) > 1:
        raise ValueError(f"partial of partition {partial.partition} names a public position twice")
    rows = np.unique(np.linspace(0, len(positions) - 1, num=min(_CHECKED_KEYS, len(positions)), dtype=np.int64))
    for row in rows.tolist():
        position = int(positions[row])
        if position >= 0 and tuple(partial.groups[row]) != tuple(public_groups[position]):
            raise ValueError(f"partial of partition {partial.partition}: group {partial.groups[row]!r} is not public "
                             f"group {position} ({public_groups[position]!r})")
    return positions
