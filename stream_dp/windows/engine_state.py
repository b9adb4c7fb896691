"""What a window engine reports about its state: partition progress, open windows, memory held.

The worker reads these to commit offsets with their metadata, to restore a
partition's next owner, to export gauges and to bound memory. They change
nothing that :class:`~stream_dp.windows.engine.WindowEngine` will close or
release (``open_pairs`` only compacts pending rows first), so they live apart
from the logic that does.
"""

from __future__ import annotations

from stream_dp.windows.interning import GroupTable
from stream_dp.windows.open_window import OpenWindow
from stream_dp.windows.specs import BoundingSpec
from stream_dp.windows.watermarks import PartitionProgress


class EngineState:
    """The read-only views of a window engine (the base of ``WindowEngine``, which sets these attributes)."""

    bounding: BoundingSpec
    _groups: GroupTable
    _windows: dict[int, OpenWindow]
    _progress: dict[int, PartitionProgress]
    _watermark_ms: int | None
    _partition_count: int | None

    @property
    def partitions(self) -> list[int]:
        return sorted(self._progress)

    @property
    def partition_count(self) -> int | None:
        return self._partition_count

    @property
    def watermark_ms(self) -> int | None:
        """The engine watermark at the last ``process`` or ``tick`` (see ``watermarks`` for the rule)."""
        return self._watermark_ms

    @property
    def closed_through_ms(self) -> dict[int, int]:
        """Per owned partition: its part of every window ending at or before this is closed
        (omitted while none is). Never goes back."""
        return {p: pr.closed_through_ms for p, pr in self._progress.items() if pr.closed_through_ms is not None}

    @property
    def record_clock_ms(self) -> dict[int, int]:
        """Per owned partition, the newest record timestamp read (capped at the wall clock; omitted before any)."""
        return {p: pr.max_record_ms for p, pr in self._progress.items() if pr.max_record_ms is not None}

    def committable_offsets(self) -> dict[int, int]:
        """Per owned partition, the offset to commit: the first one an open window still needs,
        else the one after the last processed (omitted for a partition with nothing processed)."""
        out: dict[int, int] = {}
        for p, progress in self._progress.items():
            firsts = [w.offsets[p][0] for w in self._windows.values() if p in w.offsets]
            if firsts:
                out[p] = min(firsts)
            elif progress.next_offset is not None:
                out[p] = progress.next_offset
        return out

    @property
    def next_offsets(self) -> dict[int, int]:
        """Per owned partition, the offset after the last one processed (omitted before any)."""
        return {p: pr.next_offset for p, pr in self._progress.items() if pr.next_offset is not None}

    @property
    def closure_steps(self) -> dict[int, list[tuple[int, int]]]:
        """Per owned partition, its closure raises a next owner's replay must take at the same
        offsets: (first offset read under it, boundary), oldest first (omitted when none)."""
        return {p: steps for p, pr in self._progress.items() if (steps := pr.pending_steps())}

    @property
    def replay_until_offsets(self) -> dict[int, int]:
        """Per owned partition restored with one, the first offset its earlier owner had not processed."""
        return {p: pr.replay_until_offset for p, pr in self._progress.items() if pr.replay_until_offset is not None}

    @property
    def open_windows(self) -> list[tuple[int, int]]:
        return sorted((w.start_ms, w.end_ms) for w in self._windows.values())

    @property
    def open_rows(self) -> int:
        """Contribution rows held by open windows: a cheap upper bound of ``open_pairs * max_events_per_group``
        plus rows not yet compacted."""
        return sum(w.rows for w in self._windows.values())

    @property
    def open_pairs(self) -> int:
        """Distinct (unit, group) pairs held by open windows; compacts pending rows first."""
        for window in self._windows.values():
            window.compact(self.bounding, self._groups)
        return sum(w.pair_count() for w in self._windows.values())

    def state_nbytes(self) -> dict[str, int]:
        """Bytes held: open-window contribution ``rows``, ``unit_ids`` kept for them, ``group_table`` (approximate)."""
        held = [w.nbytes() for w in self._windows.values()]
        return {
            "rows": sum(r for r, _ in held),
            "unit_ids": sum(u for _, u in held),
            "group_table": self._groups.nbytes(),
        }
