"""What a closed window hands to the release step: one ``WindowPartial`` per (window, partition).

A partial holds the bounded per-(unit, group) contributions in columns, in a
canonical order -- units and pairs by keyed hash, groups by their position in
the query's public list (a query with one) or else by their type-tagged
encoding, each pair's events summed in event-hash order -- so the same input
gives bit-identical partials however it arrived.

A partial of a query with a value field also keeps each kept event's clipped
value (``row_value``, the pairs' events one after the other in that order),
from which ``aggregate`` builds per-group value histograms for a quantiles
query; other queries never read it, and it is the array the engine had
already filled, not a copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from stream_dp.dp.histogram import HistogramSpec, SparseHistogram
from stream_dp.dp.local import UnaryReports
from stream_dp.dp.sample_aggregate import block_of
from stream_dp.dp.vectors import FeatureSpec, group_row_sums_in_blocks
from stream_dp.windows.bounding import ContributionRows, unit_starts
from stream_dp.windows.exact_sums import PairSumGrid, truncate_features
from stream_dp.windows.interning import GroupTable
from stream_dp.windows.names import UnitNames, to_str

GroupKey = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class GroupTotals:
    """Per-group totals of a partial, index-aligned with ``groups``."""

    groups: list[GroupKey]
    count: np.ndarray  # int64, bounded events
    sum: np.ndarray  # float64, clipped values
    distinct_units: np.ndarray  # int64
    #: Per-group value histogram, rows aligned with ``groups`` (None unless asked for).
    histogram: SparseHistogram | None = None
    #: Per-group sums of the pairs' feature vectors, (groups, width) (vector queries only).
    features: np.ndarray | None = None
    #: Sample-and-aggregate queries: every kept event's (group, block of its unit, value), in pair order.
    blocks: BlockValues | None = None
    #: Each group's position in the query's public list (int64, -1: not public); None without one.
    positions: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class BlockValues:
    """Events' values with their group (index into the totals' groups) and their unit's block."""

    group: np.ndarray  # int32
    block: np.ndarray  # int32
    value: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.value)


@dataclass(frozen=True, slots=True)
class UnitTotals:
    """Per-unit contribution of a partial, index-aligned with ``units``."""

    units: list[str]
    groups: np.ndarray  # int64, groups the unit contributes to (<= max_groups_per_unit)
    count: np.ndarray  # int64, events kept
    sum: np.ndarray  # float64, clipped values kept


@dataclass(frozen=True, eq=False)
class WindowPartial:
    """Bounded contributions of one partition to one closed window.

    ``pair_unit`` / ``pair_group`` index ``units`` / ``groups``; each pair
    appears once, with its kept event count (``<= max_events_per_group``) and
    the sum of their clipped values. ``first_offset`` and ``last_offset``
    bound the offsets of the accepted events; ``accepted_events`` counts
    them before bounding. ``row_value`` holds the clipped value of every kept
    event, pair by pair in pair order (``pair_count[k]`` values for pair ``k``),
    each pair's in event-hash order; None in partials built without it.
    """

    window_start_ms: int
    window_end_ms: int
    partition: int
    first_offset: int
    last_offset: int
    accepted_events: int
    units: list[str]
    groups: list[GroupKey]
    pair_unit: np.ndarray  # int32
    pair_group: np.ndarray  # int32
    pair_count: np.ndarray  # int64
    pair_sum: np.ndarray  # float64
    #: The input topic's partition count its events' placement was checked against (0: not checked);
    #: ``partition_count_changed``: the count changed while the window was open, so the check is void.
    partition_count: int = 0
    partition_count_changed: bool = False
    row_value: np.ndarray | None = None  # float64, one per kept event
    unit_hash: np.ndarray | None = None  # uint64, the keyed hash of each unit (sample-and-aggregate blocks)
    #: int64, each group's position in the query's public list (-1: not public); None without a public list.
    group_positions: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        """Field-by-field equality, arrays compared bit for bit (dtype included)."""
        if not isinstance(other, WindowPartial):
            return NotImplemented
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, np.ndarray) or isinstance(theirs, np.ndarray):
                if not (isinstance(mine, np.ndarray) and isinstance(theirs, np.ndarray)):
                    return False
                if mine.dtype != theirs.dtype or mine.shape != theirs.shape or mine.tobytes() != theirs.tobytes():
                    return False
            elif mine != theirs:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def unit_mask(self, unit_ids: Iterable[str]) -> np.ndarray:
        """Boolean mask over ``units``, true for the given ids (unknown ids are ignored)."""
        position = {u: i for i, u in enumerate(self.units)}
        mask = np.zeros(len(self.units), dtype=bool)
        hits = [position[u] for u in unit_ids if u in position]
        mask[np.array(hits, dtype=np.int64)] = True
        return mask

    def aggregate(
        self, excluded_units: np.ndarray | None = None, *, histogram: HistogramSpec | None = None,
        features: FeatureSpec | UnaryReports | None = None, blocks: int | None = None,
    ) -> GroupTotals:
        """Per-group count, sum and distinct units, leaving out ``excluded_units``.

        ``excluded_units`` is a boolean array over ``units`` (see ``unit_mask``),
        true for units to leave out, e.g. those without privacy budget. Groups
        whose only contributors are left out are left out too: their keys came
        from excluded units alone and must not reach partition selection.
        ``histogram``: also count the kept events' values per group in these
        bins (``GroupTotals.histogram``); only a quantiles query asks.
        ``features``: also sum, per group, each kept pair's feature vector (the
        clipped mean of its events' vectors, ``stream_dp.dp.vectors``); a vector query asks.
        ``blocks``: also keep each kept event's value with its group and its unit's block
        (``stream_dp.dp.sample_aggregate.block_of``); a sample-and-aggregate query asks.
        """
        keep = self._kept_pairs(excluded_units)
        n_groups = len(self.groups)
        group = self.pair_group if keep is None else self.pair_group[keep]
        count = self.pair_count if keep is None else self.pair_count[keep]
        total = self.pair_sum if keep is None else self.pair_sum[keep]
        totals = GroupTotals(
            groups=self.groups,
            count=np.bincount(group, weights=count, minlength=n_groups).astype(np.int64),
            sum=np.bincount(group, weights=total, minlength=n_groups),
            distinct_units=np.bincount(group, minlength=n_groups).astype(np.int64),
            histogram=None if histogram is None else self._histogram(keep, histogram),
            features=None if features is None else self._features(keep, features),
            blocks=None if blocks is None else self._block_values(keep, blocks),
            positions=self.group_positions,
        )
        if keep is None:
            return totals  # every group has at least one pair
        present = np.flatnonzero(totals.distinct_units > 0)
        if len(present) == n_groups:
            return totals
        position = position_of(present, n_groups)
        hist = None if totals.histogram is None else totals.histogram.take_groups(position, len(present))
        return GroupTotals(
            groups=[self.groups[i] for i in present.tolist()],
            count=totals.count[present],
            sum=totals.sum[present],
            distinct_units=totals.distinct_units[present],
            histogram=hist,
            features=None if totals.features is None else totals.features[present],
            blocks=None if totals.blocks is None else BlockValues(
                position[totals.blocks.group].astype(np.int32), totals.blocks.block, totals.blocks.value),
            positions=None if self.group_positions is None else self.group_positions[present],
        )

    def _histogram(self, keep: np.ndarray | None, spec: HistogramSpec) -> SparseHistogram:
        """Per-group histogram of the values of the kept pairs' events (groups as in ``self.groups``)."""
        if self.row_value is None:
            raise ValueError(
                "this partial was built without its events' values, so it has no histogram; build it with "
                "build_partial (the window engine does)"
            )
        kept_rows = None if keep is None else np.repeat(keep, self.pair_count)
        row_group = np.repeat(self.pair_group.astype(np.int64), self.pair_count)
        values = self.row_value
        if kept_rows is not None:
            row_group, values = row_group[kept_rows], values[kept_rows]
        return SparseHistogram.from_cells(len(self.groups), spec.bins, row_group, spec.bin_of(values))

    def _features(self, keep: np.ndarray | None, spec: FeatureSpec | UnaryReports) -> np.ndarray:
        """Per-group sums of the kept pairs' feature vectors (groups as in ``self.groups``)."""
        if isinstance(spec, UnaryReports):  # packed bits, counted without a float per value (see UnaryReports)
            if self.row_value is None:
                raise ValueError("this partial was built without its reports; build it with build_partial "
                                 "from an engine reading the query's report field")
            return spec.group_sums(self.row_value, self.pair_count, self.pair_group, len(self.groups), keep)
        if self.row_value is None or self.row_value.ndim != 2 or self.row_value.shape[1] != spec.dimensions:
            shape = None if self.row_value is None else self.row_value.shape
            raise ValueError(
                f"this partial holds values of shape {shape}, not the {spec.dimensions} fields of each event a "
                f"{spec.kind} needs; build it with build_partial from an engine reading the vector's fields"
            )
        starts = np.cumsum(self.pair_count) - self.pair_count
        if len(starts):
            # each pair's vectors are added in event-hash order, so every replay rounds the same way
            means = np.add.reduceat(self.row_value, starts, axis=0) / self.pair_count[:, None]
        else:
            means = np.zeros((0, spec.dimensions))
        group = self.pair_group.astype(np.int64)
        if keep is not None:
            means, group = means[keep], group[keep]
        augmented = spec.augmented(means)
        del means

        def features(positions: np.ndarray) -> np.ndarray:
            # on a grid, so that the group sums are exact (stream_dp.windows.exact_sums)
            return truncate_features(spec.of_augmented(augmented[positions]), spec.norm_bound)

        # a block of pairs' features at a time: a covariance's are ~d^2/2 per pair, too many to hold for all
        return group_row_sums_in_blocks(group, len(self.groups), spec.width, features)

    def _block_values(self, keep: np.ndarray | None, blocks: int) -> BlockValues:
        """The kept events' values, each with its group and its unit's block."""
        if self.row_value is None or self.row_value.ndim != 1 or self.unit_hash is None:
            raise ValueError(
                "this partial was built without its events' values or its units' hashes, so it has no blocks; "
                "build it with build_partial (the window engine does)"
            )
        unit_block = block_of(self.unit_hash, blocks)
        pair_block = unit_block[self.pair_unit]
        group, block = self.pair_group, pair_block
        if keep is not None:
            group, block = group[keep], block[keep]
            counts = self.pair_count[keep]
            values = self.row_value[np.repeat(keep, self.pair_count)]
        else:
            counts, values = self.pair_count, self.row_value
        return BlockValues(np.repeat(group, counts).astype(np.int32), np.repeat(block, counts).astype(np.int32),
                           values)

    def unit_totals(self) -> UnitTotals:
        """Each unit's contribution: groups, kept events and clipped sum."""
        n_units = len(self.units)
        return UnitTotals(
            units=self.units,
            groups=np.bincount(self.pair_unit, minlength=n_units).astype(np.int64),
            count=np.bincount(self.pair_unit, weights=self.pair_count, minlength=n_units).astype(np.int64),
            sum=np.bincount(self.pair_unit, weights=self.pair_sum, minlength=n_units),
        )

    def _kept_pairs(self, excluded_units: np.ndarray | None) -> np.ndarray | None:
        if excluded_units is None:
            return None
        excluded = np.asarray(excluded_units)
        if excluded.dtype != np.bool_ or excluded.shape != (len(self.units),):
            raise ValueError(
                f"excluded_units must be a boolean array of shape ({len(self.units)},), one flag per unit in "
                f"partial.units; got dtype {excluded.dtype} and shape {excluded.shape}; build it with unit_mask()"
            )
        return ~excluded[self.pair_unit]


def build_partial(
    rows: ContributionRows,
    *,
    window_start_ms: int,
    window_end_ms: int,
    partition: int,
    offsets: tuple[int, int, int],
    names: UnitNames,
    groups: GroupTable,
    partition_count: int = 0,
    partition_count_changed: bool = False,
    keep_values: bool = True,
    pair_sums: PairSumGrid | None = None,
) -> WindowPartial:
    """The partial of one partition's pruned rows of one window.

    ``rows`` must be in ``prune``'s canonical order (by unit hash, pair rank,
    event hash), which becomes the order of units and pairs: it depends only
    on the rows, never on how they arrived. Groups are listed in the order of
    the query's public list when they are all in it, else by their canonical
    encoding. ``offsets`` is (first offset, last offset, accepted events).
    ``keep_values=False`` (a query without a value field) leaves ``row_value`` out.
    ``pair_sums``: the grid of the query's pair sums (``BoundingSpec.pair_sums``); each pair's sum is
    put on it, within what its clipped values can add up to (:mod:`stream_dp.windows.exact_sums`), so
    that group sums add up exactly and stay in their range. None (no values): every pair sum is 0.
    """
    n = len(rows)
    new_unit = unit_starts(rows.unit)
    unit_of_row = np.cumsum(new_unit) - 1
    new_pair = new_unit.copy()
    new_pair[1:] |= rows.group[1:] != rows.group[:-1]
    starts = np.flatnonzero(new_pair)
    present = np.zeros(len(groups), dtype=bool)
    present[rows.group] = True
    group_ids = np.flatnonzero(present)
    positions = groups.public_positions(group_ids)
    if positions is not None and bool((positions >= 0).all()):
        # The public list orders groups as canonically as their encodings, without sorting a million strings.
        group_ids = group_ids[np.argsort(positions, kind="stable")]
    else:
        group_ids = group_ids[np.argsort(groups.canonical_ranks()[group_ids], kind="stable")]
    group_index = np.zeros(len(groups), dtype=np.int64)
    group_index[group_ids] = np.arange(len(group_ids))
    pair_count = np.diff(np.append(starts, n)).astype(np.int64)
    return WindowPartial(
        window_start_ms=window_start_ms,
        window_end_ms=window_end_ms,
        partition=partition,
        first_offset=offsets[0],
        last_offset=offsets[1],
        accepted_events=offsets[2],
        units=to_str(names.padded(rows.unit[new_unit])) if n else [],
        groups=groups.as_tuples(group_ids),
        pair_unit=unit_of_row[starts].astype(np.int32),
        pair_group=group_index[rows.group[starts]].astype(np.int32),
        pair_count=pair_count,
        # each pair's values are added in event-hash order, so every replay rounds the same way
        # (a vector query has no scalar sum: its vectors stay in row_value)
        pair_sum=(pair_sums.quantise(np.add.reduceat(rows.value, starts), pair_count)
                  if n and rows.value.ndim == 1 and pair_sums is not None else np.zeros(len(starts))),
        partition_count=partition_count,
        partition_count_changed=partition_count_changed,
        # rows are pair by pair already: the value column is kept as it is (no copy, no work)
        row_value=rows.value if keep_values else None,
        unit_hash=rows.unit[new_unit] if keep_values else None,
        group_positions=groups.public_positions(group_ids),  # in the order just chosen
    )


def position_of(present: np.ndarray, n: int) -> np.ndarray:
    """Map from old group index to its place among ``present`` (-1 for the others)."""
    position = np.full(n, -1, dtype=np.int64)
    position[present] = np.arange(len(present))
    return position
