"""The state of one open window: pruned contribution rows, rows not yet compacted, unit ids, offsets."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stream_dp.windows.bounding import ContributionRows, prune_order, unit_starts
from stream_dp.windows.interning import GroupTable
from stream_dp.windows.names import UnitNames
from stream_dp.windows.partial import WindowPartial, build_partial
from stream_dp.windows.specs import BoundingSpec

#: (partition, first offset, last offset, accepted events) of one batch's events in one window
OffsetStats = tuple[int, int, int, int]


@dataclass(slots=True)
class OpenWindow:
    """Rows of ``[start_ms, end_ms)`` from every owned partition that delivered events for it.

    ``compacted`` is pruned; ``pending`` rows are pruned into it once they
    outnumber it (and reach ``compact_min_rows``), so each row is sorted about twice.
    """

    start_ms: int
    end_ms: int
    compacted: ContributionRows = field(default_factory=ContributionRows.empty)
    names: UnitNames = field(default_factory=UnitNames.empty)
    pending: list[ContributionRows] = field(default_factory=list)
    pending_ids: list[np.ndarray] = field(default_factory=list)  # unit id of each pending row (S arrays)
    pending_rows: int = 0
    offsets: dict[int, list[int]] = field(default_factory=dict)  # partition -> [first, last, accepted]
    partition_count: int = 0  # the input topic's partition count when the window opened (0: placement unchecked)
    partition_count_changed: bool = False  # it changed while the window was open

    @property
    def rows(self) -> int:
        return len(self.compacted) + self.pending_rows

    def add(self, rows: ContributionRows, unit_ids: np.ndarray, stats: list[OffsetStats]) -> None:
        for p, first, last, count in stats:
            seen = self.offsets.get(p)
            if seen is None:
                self.offsets[p] = [first, last, count]
            else:
                seen[0], seen[1], seen[2] = min(seen[0], first), max(seen[1], last), seen[2] + count
        self.pending.append(rows)
        self.pending_ids.append(unit_ids)
        self.pending_rows += len(rows)

    def due_for_compaction(self, compact_min_rows: int) -> bool:
        return self.pending_rows >= max(compact_min_rows, len(self.compacted))

    def compact(self, bounding: BoundingSpec, groups: GroupTable) -> None:
        """Prune pending rows into the compacted state, keeping ids only of units still present."""
        if not self.pending:
            return
        combined = ContributionRows.concat([self.compacted, *self.pending])
        kept = prune_order(combined, bounding.max_groups_per_unit, bounding.max_events_per_group, groups.hashes)
        rows = combined.take(kept)
        firsts = np.flatnonzero(unit_starts(rows.unit))
        live = rows.unit[firsts]
        source = kept[firsts] - len(self.compacted)  # >= 0: the unit's first kept row is a pending one
        fresh = source >= 0
        pending_ids = np.concatenate(self.pending_ids)
        known_width = int(np.diff(self.names.offsets).max()) if len(self.names.hashes) else 0
        padded = np.zeros(len(live), dtype=f"S{max(1, pending_ids.dtype.itemsize, known_width)}")
        padded[fresh] = pending_ids[source[fresh]]
        if not fresh.all():
            padded[~fresh] = self.names.padded(live[~fresh])
        self.compacted = rows
        self.names = UnitNames.from_sorted(live, padded)
        self.pending, self.pending_ids, self.pending_rows = [], [], 0

    def drop_partitions(self, lost: np.ndarray) -> None:
        """Forget the rows and offsets of partitions ``lost`` (ids of units left without rows go at the next compaction)."""
        for p in lost.tolist():
            self.offsets.pop(p, None)
        self.compacted = self.compacted.take(~np.isin(self.compacted.partition, lost))
        masks = [~np.isin(rows.partition, lost) for rows in self.pending]
        self.pending = [rows.take(m) for rows, m in zip(self.pending, masks)]
        self.pending_ids = [ids[m] for ids, m in zip(self.pending_ids, masks)]
        self.pending_rows = sum(map(len, self.pending))

    def close(
        self, partitions: list[int], bounding: BoundingSpec, groups: GroupTable, *, keep_values: bool = True
    ) -> list[WindowPartial]:
        """Emit and drop the parts of ``partitions`` (each must have delivered events), in partition order.

        ``keep_values``: the partials keep their events' values (for histograms; see ``partial``).

        The parts of one window normally close together; they close apart only
        after a partition was assigned with an older restored state. Bounding
        then stays exact within each part, and across parts only for what
        was still open when the earlier part closed.
        """
        self.compact(bounding, groups)
        rows = self.compacted
        partials = []
        for p in sorted(partitions):
            first, last, accepted = self.offsets[p]
            partials.append(
                build_partial(
                    rows.take(rows.partition == p),
                    window_start_ms=self.start_ms,
                    window_end_ms=self.end_ms,
                    partition=p,
                    offsets=(first, last, accepted),
                    names=self.names,
                    groups=groups,
                    partition_count=self.partition_count,
                    partition_count_changed=self.partition_count_changed,
                    keep_values=keep_values,
                    pair_sums=bounding.pair_sums,
                )
            )
        if len(partitions) == len(self.offsets):
            self.offsets.clear()
        else:
            self.drop_partitions(np.array(partitions, dtype=np.int32))
        return partials

    def pair_count(self) -> int:
        """Distinct (unit, group) pairs of the compacted rows (sorted by unit, a unit's rows by pair)."""
        rows = self.compacted
        if not len(rows):
            return 0
        return 1 + int(((rows.unit[1:] != rows.unit[:-1]) | (rows.group[1:] != rows.group[:-1])).sum())

    def nbytes(self) -> tuple[int, int]:
        """(bytes of contribution rows, bytes of unit ids)."""
        rows = self.compacted.nbytes + sum(r.nbytes for r in self.pending)
        return rows, self.names.nbytes + sum(ids.nbytes for ids in self.pending_ids)
