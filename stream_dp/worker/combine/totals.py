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
        positions = np.fromiter((index.get(g, -1) for g in partial.groups), dtype=np.int64, count=len(partial.groups))
        keep = positions >= 0
        np.add.at(count, positions[keep], partial.count[keep])
        np.add.at(distinct, positions[keep], partial.distinct_units[keep])
        if sums is not None and partial.sum is not None:
            np.add.at(sums, positions[keep], partial.sum[keep])
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
