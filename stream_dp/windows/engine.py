"""The window engine: raw message batches in, bounded closed-window partials out.

Pure logic: no Kafka, no Redis, no clock of its own (``clock_ms`` is passed
in). The caller feeds ``process`` with batches from the partitions it
assigned, calls ``tick`` periodically, commits ``committable_offsets()`` with
``closed_through_ms`` as commit metadata, and after a restart assigns the
partitions with the stored ``closed_through_ms`` and replays from the
committed offsets: events of windows closed before the restart are counted
as ``replayed`` and skipped, open windows are rebuilt exactly.

Every message of a batch is accounted for exactly once::

    accepted + sum(rejected.values()) + replayed + unlisted == input_count

(``rejected`` includes ``RejectReason.LATE``.) With ``public_groups``, the
events of other groups are ``unlisted``: valid, but never released by this
query, so they are set aside before bounding -- they take none of a unit's
``max_groups_per_unit`` slots and charge no unit that sent nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

import numpy as np

from stream_dp.windows.batch import BatchResult, RawBatch
from stream_dp.windows.bounding import ContributionRows
from stream_dp.windows.bulk_decoding import BulkEventDecoder
from stream_dp.windows.decoding import DecodedEvents
from stream_dp.windows.engine_state import EngineState
from stream_dp.windows.hashing import ContributionHasher
from stream_dp.windows.interning import GroupTable
from stream_dp.windows.open_window import OffsetStats, OpenWindow
from stream_dp.windows.partial import WindowPartial
from stream_dp.windows.partitioning import Partitioner, check_partitioner
from stream_dp.windows.placement import check_placement, rejection_of
from stream_dp.windows.record_clock import ClockRule
from stream_dp.windows.progress_arrays import (
    NEVER,
    closed_through_by_slot,
    closure_met,
    note_offsets,
    note_records,
    record_clock,
    slots_of,
)
from stream_dp.windows.rejections import Rejection, RejectReason
from stream_dp.windows.specs import BoundingSpec, EventSchema, WindowSpec
from stream_dp.windows.watermarks import PartitionProgress, combined_watermark_ms

_ALWAYS = np.iinfo(np.int64).max  # "every offset was processed before" when the replay point is unknown


class WindowEngine(EngineState):
    """Tumbling windows with watermarks and user-level contribution bounding, for one query.

    ``compact_min_rows`` is how many new rows an open window collects before
    compacting them into its pruned state (it also compacts whenever the new rows
    outnumber the pruned ones), trading a little memory for fewer sorts.
    """

    def __init__(
        self,
        schema: EventSchema,
        spec: WindowSpec,
        bounding: BoundingSpec,
        *,
        clock_ms: Callable[[], int],
        compact_min_rows: int = 262_144,
        partitioner: Partitioner | None = None,
        clock_rule: ClockRule | None = None,
        public_groups: Iterable[tuple[str | int, ...]] | None = None,
    ) -> None:
        if compact_min_rows < 1:
            raise ValueError(f"compact_min_rows must be positive, got {compact_min_rows}")
        if partitioner is not None:
            check_partitioner(partitioner)
        self.schema, self.spec, self.bounding = schema, spec, bounding
        self._clock_ms = clock_ms
        # Whose record timestamps close windows (``record_clock``): the broker's, and producers' only if trusted.
        self.clock_rule = clock_rule if clock_rule is not None else ClockRule()
        self._compact_min_rows = compact_min_rows
        self._decoder = BulkEventDecoder(schema)
        self._hasher = ContributionHasher(bounding.secret)
        self._windows: dict[int, OpenWindow] = {}
        self._progress: dict[int, PartitionProgress] = {}
        self._watermark_ms: int | None = None  # the latest computed; informational
        # Co-partitioning: with a partitioner, every event must be keyed by its unit and sit on the
        # partition that partitioner gives its key, so that each unit is bounded in one place.
        self._partitioner = partitioner
        self._partition_count: int | None = None
        # The groups a query with public groups releases, as decoded keys (a one-field key is its value), with
        # their positions in its list: partials name their groups' positions, so the release adds them up
        # without a lookup per group.
        self._public: frozenset[Hashable] | None = None
        positions: dict[Hashable, int] | None = None
        if public_groups is not None:
            if not schema.group_by:
                raise ValueError("public_groups need group_by fields to read each event's group from")
            keys = [tuple(key) for key in public_groups]
            if any(len(key) != len(schema.group_by) for key in keys):
                raise ValueError(f"each public group needs one value per group_by field {list(schema.group_by)}")
            positions = {key[0] if len(key) == 1 else key: i for i, key in enumerate(keys)}
            self._public = frozenset(positions)
        self._groups = GroupTable(self._hasher, public=positions)

    # -- partitions ---------------------------------------------------------------

    def assign(
        self,
        partitions: Iterable[int],
        closed_through_ms: Mapping[int, int] | None = None,
        replay_until_offset: Mapping[int, int] | None = None,
        record_clock_ms: Mapping[int, int] | None = None,
        closure_steps: Mapping[int, Iterable[tuple[int, int]]] | None = None,
    ) -> None:
        """Start owning ``partitions``; ``closed_through_ms`` restores what an earlier owner closed.

        ``replay_until_offset``: per partition, the first offset the earlier owner
        had not processed. Events of restored-closed windows below it are
        replays (skipped); at or after it they are late. Unknown: all replays.
        ``record_clock_ms``: per partition, the newest record timestamp the
        earlier owner had read, including records before the committed offset
        that a replay does not read again, so the replay closes windows when
        the first run did. ``closure_steps``: per partition, the earlier owner's
        (offset, boundary) closure raises above its restored closure, which the
        replay takes at the same offsets (see ``watermarks``).
        """
        partitions = [int(p) for p in partitions]
        already = sorted(set(partitions) & self._progress.keys())
        if already:
            raise ValueError(f"partition(s) {already} are already assigned; revoke them before assigning again")
        restored = dict(closed_through_ms or {})
        replay_until = dict(replay_until_offset or {})
        clocks = dict(record_clock_ms or {})
        steps = dict(closure_steps or {})
        now = self._clock_ms()
        for p in partitions:
            through = restored.get(p)
            until = replay_until.get(p)
            clock = clocks.get(p)
            self._progress[p] = PartitionProgress(
                None if through is None else int(through), now,
                max_record_ms=None if clock is None else int(clock),
                replay_until_offset=None if until is None else int(until),
                restored_steps=tuple(steps.get(p, ())) if until is not None else (),
            )

    def revoke(self, partitions: Iterable[int]) -> None:
        """Stop owning ``partitions`` and drop their part of the open windows.

        The next owner rebuilds those windows by replaying from the committed offsets.
        """
        gone = {int(p) for p in partitions} & self._progress.keys()
        if not gone:
            return
        for p in gone:
            del self._progress[p]
        lost = np.array(sorted(gone), dtype=np.int32)
        for start in list(self._windows):
            window = self._windows[start]
            window.drop_partitions(lost)
            if not window.offsets:
                del self._windows[start]

    def set_partition_count(self, count: int) -> bool:
        """The input topic's current partition count, which placement is checked against.

        Returns True when it changed: every window open now then holds events
        checked against two counts, so a unit may sit on two partitions of it;
        its partials say so, and the release stage withholds such windows.
        """
        if count < 1:
            raise ValueError(f"partition count must be at least 1, got {count}")
        if count == self._partition_count:
            return False
        changed = self._partition_count is not None
        if changed:
            for window in self._windows.values():
                window.partition_count_changed = True
        self._partition_count = count
        return changed

    # -- processing ---------------------------------------------------------------

    def hold_open(self, partitions: Iterable[int]) -> None:
        """Owned ``partitions`` known to have records waiting count as active (not idle) now.

        Idleness means a partition has nothing to deliver; one whose consumer lags
        behind its end (a slow fetch, a busy worker, a backlog) must not have its
        windows closed by the wall clock, which would make its waiting events late.
        """
        now = self._clock_ms()
        for partition in partitions:
            progress = self._progress.get(partition)
            if progress is not None:
                progress.last_active_wall_ms = now

    def note_read_position(self, partition: int, offset: int) -> None:
        """Reading ``partition`` starts at ``offset`` (nothing read yet): at or past the earlier
        owner's processed offset, there is nothing to replay and its windows may close."""
        progress = self._progress.get(partition)
        if progress is not None and progress.next_offset is None:
            progress.read_from_offset = offset

    def tick(self) -> list[WindowPartial]:
        """Advance the watermark by the idle rule and return newly closed partials."""
        return self._advance(self._clock_ms())

    def process(self, batch: RawBatch) -> BatchResult:
        """Decode, window and bound one batch; returns its accounting and any newly closed partials.

        Raises ``ValueError``, before changing anything, if the batch holds a
        partition that is not assigned; bad message contents never raise.
        """
        slot_partitions = np.array(sorted(self._progress), dtype=np.int32)
        slots = slots_of(batch.partitions, slot_partitions)
        now = self._clock_ms()
        record_ms = record_clock(batch.timestamps, now)
        decoded, problems = self._decoder.decode(batch.values, now, record_ms)
        if self._partitioner is not None:
            decoded = check_placement(batch, decoded, problems, partition_count=self._partition_count,
                                      partitioner=self._partitioner, unit_field=self.schema.unit_field)
        rejected: dict[RejectReason, int] = {}
        rejections: list[Rejection] = []
        for index, reason, detail in problems:
            rejected[reason] = rejected.get(reason, 0) + 1
            rejections.append(rejection_of(batch, index, reason, detail))

        progress = [self._progress[int(p)] for p in slot_partitions]
        note_offsets(progress, slots, batch.offsets)
        index = decoded.index
        event_slots = slots[index]
        starts = self.spec.start_of(decoded.ts_ms)
        ends = starts + self.spec.size_ms
        closed_through, restored_through = closed_through_by_slot(progress)
        closed = ends <= closure_met(progress, closed_through, event_slots, batch.offsets[index])
        replay_until = np.array(
            [_ALWAYS if p.replay_until_offset is None else p.replay_until_offset for p in progress], dtype=np.int64
        )
        replayed = (ends <= restored_through[event_slots]) & (batch.offsets[index] < replay_until[event_slots])
        listed = self._listed(decoded)
        if listed is not None:  # the other groups' events are neither counted, late nor replayed here
            closed &= listed
            replayed &= listed
        late = closed & ~replayed
        note_records(progress, slots, batch.timestamps, batch.producer_stamped, self._clock_units(batch, decoded), now,
                     self.clock_rule)
        if late.any():
            late_rows = np.flatnonzero(late)
            rejected[RejectReason.LATE] = len(late_rows)
            for i in late_rows.tolist():
                detail = f"window [{int(starts[i])}, {int(ends[i])}) ms had already closed"
                rejections.append(rejection_of(batch, int(index[i]), RejectReason.LATE, detail))
        accepted = np.flatnonzero(~closed if listed is None else ~closed & listed)
        self._ingest(decoded, accepted, batch, starts, event_slots)
        return BatchResult(
            input_count=len(batch),
            accepted=len(accepted),
            replayed=int(replayed.sum()),
            rejected=rejected,
            rejections=rejections,
            partials=self._advance(now),
            unlisted=0 if listed is None else int(len(listed) - np.count_nonzero(listed)),
        )

    def _clock_units(self, batch: RawBatch, decoded: DecodedEvents) -> list | None:
        """Per record, the unit its stamp counts for on a trusted producer clock (``record_clock``): the privacy
        unit of a record that decoded and was placed as its unit's, None for a record the worker rejects. So one
        unit's records under many keys count as one unit, and records of no unit (not JSON, wrong key) as none."""
        if not self.clock_rule.trust_producer_timestamps or batch.producer_stamped is None:
            return batch.keys  # broker stamps: no unit takes part
        units = np.full(len(batch), None, dtype=object)
        units[decoded.index] = decoded.units
        return units.tolist()

    def _listed(self, decoded: DecodedEvents) -> np.ndarray | None:
        """Which decoded events are of a public group; None when all are (or the query has no public list).

        Decided before bounding: an event of a group the query never releases must not take one of its
        unit's ``max_groups_per_unit`` slots from a group it does release, nor charge its unit."""
        public, keys = self._public, decoded.group_keys
        if public is None or keys is None:
            return None
        flags = {key: key in public for key in dict.fromkeys(keys)}  # each distinct key looked up once
        if all(flags.values()):
            return None
        return np.fromiter(map(flags.__getitem__, keys), dtype=bool, count=len(keys))

    def _ingest(
        self, decoded: DecodedEvents, accepted: np.ndarray, batch: RawBatch, starts: np.ndarray, slots: np.ndarray
    ) -> None:
        if not len(accepted):
            return
        everything = len(accepted) == len(decoded)
        unit_ids = decoded.units if everything else decoded.units[accepted]
        if decoded.group_keys is None:
            group_ids = np.full(len(accepted), self._groups.ids_for([()])[0], dtype=np.int64)
        else:
            keys = decoded.group_keys if everything else list(map(decoded.group_keys.__getitem__, accepted.tolist()))
            group_ids = self._groups.ids_for(keys)
        index = decoded.index[accepted]
        partitions, offsets = batch.partitions[index], batch.offsets[index]
        unit_hash = self._hasher.unit_hashes(unit_ids)
        group_hash = self._groups.hashes[group_ids]
        if decoded.values is None:
            values = np.zeros(len(accepted))
        elif decoded.values.ndim == 2:  # vectors (clipped in l2 per unit later, never per field) or reports
            values = decoded.values[accepted]
        else:
            values = np.clip(decoded.values[accepted], self.bounding.clip_lo, self.bounding.clip_hi)
        rows = ContributionRows(
            unit=unit_hash,
            group=group_ids.astype(np.uint32),
            pair_rank=(self._hasher.pair_hashes(unit_hash, group_hash) >> np.uint64(32)).astype(np.uint32),
            partition=partitions,
            event_hash=self._hasher.event_hashes(unit_hash, group_hash, partitions, offsets),
            value=values,
        )
        window_starts = starts[accepted]
        if window_starts.min() == window_starts.max():
            distinct, which = window_starts[:1], np.zeros(len(accepted), dtype=np.int64)
        else:
            distinct, which = np.unique(window_starts, return_inverse=True)
        n_slots = int(slots.max()) + 1
        cell = which * n_slots + slots[accepted]
        n_cells = len(distinct) * n_slots
        firsts = np.full(n_cells, np.iinfo(np.int64).max, dtype=np.int64)
        lasts = np.full(n_cells, NEVER, dtype=np.int64)
        np.minimum.at(firsts, cell, offsets)
        np.maximum.at(lasts, cell, offsets)
        counts = np.bincount(cell, minlength=n_cells)
        slot_partition = np.zeros(n_slots, dtype=np.int64)
        slot_partition[slots[accepted]] = partitions
        for k, start in enumerate(distinct.tolist()):
            base = k * n_slots
            stats = [
                (int(slot_partition[c - base]), int(firsts[c]), int(lasts[c]), int(counts[c]))
                for c in range(base, base + n_slots)
                if counts[c]
            ]
            if len(distinct) == 1:
                self._add(start, rows, unit_ids, stats)
            else:
                mask = which == k
                self._add(start, rows.take(mask), unit_ids[mask], stats)

    def _add(self, start: int, rows: ContributionRows, unit_ids: np.ndarray, stats: list[OffsetStats]) -> None:
        window = self._windows.get(start)
        if window is None:
            window = self._windows[start] = OpenWindow(
                start, start + self.spec.size_ms, partition_count=self._partition_count or 0
            )
        window.add(rows, unit_ids, stats)
        if window.due_for_compaction(self._compact_min_rows):
            window.compact(self.bounding, self._groups)

    def _advance(self, now: int) -> list[WindowPartial]:
        mark = combined_watermark_ms(self._progress.values(), now, self.spec)
        if mark is None:
            return []
        self._watermark_ms = mark
        boundary = self.spec.boundary_at_or_before(mark)
        for progress in self._progress.values():
            progress.take_restored_steps()
            if not progress.replaying:
                progress.close_through(boundary)
        partials: list[WindowPartial] = []
        # only a query with value fields can ask for histograms or vectors: the others' values are all zeros
        keep_values = self.schema.keeps_values
        for start in sorted(self._windows):
            window = self._windows[start]
            due = [
                p
                for p in window.offsets
                if (through := self._progress[p].closed_through_ms) is not None and window.end_ms <= through
            ]
            if due:
                partials.extend(window.close(due, self.bounding, self._groups, keep_values=keep_values))
                if not window.offsets:
                    del self._windows[start]
        if partials:
            self._forget_unused_keys()
        return partials

    def _forget_unused_keys(self) -> None:
        """Shrink the group table once it is mostly keys of closed windows."""
        if len(self._groups) <= 2 * self.open_rows + 65_536:
            return
        parts = [rows for w in self._windows.values() for rows in (w.compacted, *w.pending)]
        live = np.concatenate([r.group for r in parts]) if parts else np.zeros(0, np.uint32)
        remap = self._groups.retain(live.astype(np.int64))
        for rows in parts:
            rows.group = remap[rows.group].astype(np.uint32)

