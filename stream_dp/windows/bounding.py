"""User-level contribution bounding on columns of contribution rows.

One row is one event that may still count: its unit hash, group id, the top
32 bits of the (unit, group) pair hash, partition, event hash and clipped
value -- 36 bytes. ``prune`` keeps, per unit, the ``max_groups`` groups with
the smallest pair hashes and, per (unit, group), the ``max_events`` events
with the smallest event hashes (Wilson et al., "Differentially private SQL
with bounded user contribution", PoPETs 2020, bound contributions the same
way, by uniform sampling per user).

``prune`` is idempotent and commutes with concatenation --
``prune(a + b) == prune(prune(a) + prune(b))`` as sets of rows -- because each
choice depends only on hashes, never on arrival order. That is what lets an
open window keep a pruned state and fold later batches in; rows with the same
unit, group and event hash are the same message delivered twice and are kept once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

_U64 = np.uint64


@dataclass(slots=True)
class ContributionRows:
    """Columns of contribution rows (all the same length)."""

    unit: np.ndarray  # uint64, keyed hash of the unit id
    group: np.ndarray  # uint32, GroupTable id
    pair_rank: np.ndarray  # uint32, pair hash >> 32
    partition: np.ndarray  # int32
    event_hash: np.ndarray  # uint64
    value: np.ndarray  # float64, clipped; (rows, d) for a vector query; packed uint8 bits for unary reports

    def __len__(self) -> int:
        return len(self.unit)

    @classmethod
    def empty(cls) -> ContributionRows:
        return cls(
            np.zeros(0, np.uint64),
            np.zeros(0, np.uint32),
            np.zeros(0, np.uint32),
            np.zeros(0, np.int32),
            np.zeros(0, np.uint64),
            np.zeros(0, np.float64),
        )

    @classmethod
    def concat(cls, parts: list[ContributionRows]) -> ContributionRows:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        # empty parts add nothing, and an empty state's 1-d value column must not meet (rows, d) vectors
        parts = [p for p in parts if len(p)] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    def take(self, index: np.ndarray) -> ContributionRows:
        """Rows at ``index`` (integer positions or a boolean mask), as copies."""
        return ContributionRows(*(getattr(self, f.name)[index] for f in fields(self)))

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f.name).nbytes for f in fields(self))


def _segment_starts(same_as_previous: np.ndarray) -> np.ndarray:
    """Boolean "starts a new segment" flags from "equal to the previous row" flags."""
    starts = np.ones(len(same_as_previous) + 1, dtype=bool)
    np.logical_not(same_as_previous, out=starts[1:])
    return starts


def _canonical_order(rows: ContributionRows, group_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row order by (unit, pair rank, group hash, event hash) and "same pair as previous" flags.

    One argsort of a 64-bit key -- the unit hash's top 32 bits, then the pair
    rank -- does almost all the work. Where that key is ambiguous (two units
    share their top 32 bits, or two groups of a unit share a rank; a few
    times per 100k units) the rows of the affected units are re-sorted with
    the full key. Finally the rows of each multi-row pair are put in
    event-hash order.
    """
    unit = rows.unit
    key = (unit & _U64(0xFFFFFFFF00000000)) | rows.pair_rank.astype(_U64)
    order = np.argsort(key)
    unit_sorted, group_sorted = unit[order], rows.group[order]
    same_unit = unit_sorted[1:] == unit_sorted[:-1]
    same_top = (unit_sorted[1:] >> _U64(32)) == (unit_sorted[:-1] >> _U64(32))
    key_sorted = key[order]
    same_key = key_sorted[1:] == key_sorted[:-1]
    ambiguous = (same_top & ~same_unit) | (same_key & (group_sorted[1:] != group_sorted[:-1]))
    if ambiguous.any():
        block = np.cumsum(_segment_starts(same_top)) - 1  # rows sharing the top 32 bits
        affected = np.flatnonzero(np.isin(block, block[1:][ambiguous]))
        sub = order[affected]
        order[affected] = sub[
            np.lexsort(
                (rows.event_hash[sub], rows.group[sub], group_hashes[rows.group[sub]], rows.pair_rank[sub], unit[sub])
            )
        ]
        unit_sorted, group_sorted = unit[order], rows.group[order]
        same_unit = unit_sorted[1:] == unit_sorted[:-1]
    same_pair = same_unit & (group_sorted[1:] == group_sorted[:-1])
    if same_pair.any():
        segment = np.cumsum(_segment_starts(same_pair)) - 1
        in_multi = np.zeros(len(order), dtype=bool)
        in_multi[1:] |= same_pair
        in_multi[:-1] |= same_pair
        idx = np.flatnonzero(in_multi)
        sub = order[idx]
        order[idx] = sub[np.lexsort((rows.event_hash[sub], segment[idx]))]
    return order, same_pair


def prune_order(rows: ContributionRows, max_groups: int, max_events: int, group_hashes: np.ndarray) -> np.ndarray:
    """Positions of the rows to keep, in canonical order (see ``prune``)."""
    n = len(rows)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order, same_pair = _canonical_order(rows, group_hashes)
    event_hash = rows.event_hash[order]
    duplicate = np.zeros(n, dtype=bool)
    duplicate[1:] = same_pair & (event_hash[1:] == event_hash[:-1])
    pair_start = _segment_starts(same_pair)
    if duplicate.any():
        survivors = ~duplicate
        order, pair_start = order[survivors], pair_start[survivors]
    pair_id = np.cumsum(pair_start) - 1
    starts = np.flatnonzero(pair_start)
    rank_in_pair = np.arange(len(order)) - starts[pair_id]
    pair_unit = rows.unit[order[starts]]
    unit_start = _segment_starts(pair_unit[1:] == pair_unit[:-1])
    unit_first_pair = np.flatnonzero(unit_start)
    rank_in_unit = np.arange(len(starts)) - unit_first_pair[np.cumsum(unit_start) - 1]
    keep = (rank_in_pair < max_events) & (rank_in_unit < max_groups)[pair_id]
    return order if keep.all() else order[keep]


def prune(rows: ContributionRows, max_groups: int, max_events: int, group_hashes: np.ndarray) -> ContributionRows:
    """Keep each unit's ``max_groups`` lowest-hash groups and each pair's ``max_events`` lowest-hash events.

    ``group_hashes`` maps group ids to their keyed hashes (tie-breaks only).
    The result is sorted by unit hash, then pair rank, then event hash: a
    canonical order that depends only on the set of rows.
    """
    return rows.take(prune_order(rows, max_groups, max_events, group_hashes))


def unit_starts(units: np.ndarray) -> np.ndarray:
    """Flags of the first row of each unit in rows sorted by unit hash."""
    return _segment_starts(units[1:] == units[:-1]) if len(units) else np.zeros(0, dtype=bool)
