"""Per-partition progress of a batch, vectorised: which slot each record's partition has, the clock its records
advance, the offsets they cover, and the closure each event meets (``WindowEngine.process``). Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stream_dp.windows.record_clock import NO_CLOCK, ClockRule, clocks_by_slot
from stream_dp.windows.watermarks import PartitionProgress

NEVER = np.iinfo(np.int64).min  # "nothing closed" in per-partition closed-through arrays


def slots_of(partitions: np.ndarray, slot_partitions: np.ndarray) -> np.ndarray:
    """Each record's slot: the index of its partition in the sorted assigned ``slot_partitions``."""
    slots = np.searchsorted(slot_partitions, partitions)
    found = slots < len(slot_partitions)
    found[found] = slot_partitions[slots[found]] == partitions[found]
    if not found.all():
        missing = sorted(set(partitions[~found].tolist()))
        raise ValueError(f"partition(s) {missing} are not assigned to this engine; call assign({missing}) first")
    return slots


def closed_through_by_slot(progress: list[PartitionProgress]) -> tuple[np.ndarray, np.ndarray]:
    """Per slot, the window ends closed through now and those restored at assignment (``NEVER``: none)."""
    closed = [NEVER if p.closed_through_ms is None else p.closed_through_ms for p in progress]
    restored = [NEVER if p.restored_through_ms is None else p.restored_through_ms for p in progress]
    return np.array(closed, dtype=np.int64), np.array(restored, dtype=np.int64)


def closure_met(progress: list[PartitionProgress], closed_through: np.ndarray, event_slots: np.ndarray,
                 offsets: np.ndarray) -> np.ndarray:
    """Per event, the closure it meets: its partition's, or while replaying, the one the
    earlier owner had when it read that offset (its restored steps up to the offset)."""
    met = closed_through[event_slots]
    for slot, p in enumerate(progress):
        if not p.restored_steps:
            continue
        here = event_slots == slot
        for offset, boundary in p.restored_steps:
            rows = here & (offsets >= offset)
            met[rows] = np.maximum(met[rows], boundary)
    return met


def note_offsets(progress: list[PartitionProgress], slots: np.ndarray, offsets: np.ndarray) -> None:
    """Each partition's next offset to read moves past the batch's records on it."""
    if not len(slots):
        return
    next_offsets = np.full(len(progress), NEVER, dtype=np.int64)
    np.maximum.at(next_offsets, slots, offsets + 1)
    for slot in np.flatnonzero(next_offsets != NEVER).tolist():
        p = progress[slot]
        seen = int(next_offsets[slot])
        p.next_offset = seen if p.next_offset is None else max(p.next_offset, seen)


def record_clock(timestamps: np.ndarray, now: int) -> np.ndarray:
    """The time each record's event is checked against (``ahead_of_record``): its timestamp capped at the
    wall clock, the wall clock for a record without one. Not the window clock (``note_records``)."""
    return np.where(timestamps <= 0, now, np.minimum(timestamps, now))


def note_records(progress: list[PartitionProgress], slots: np.ndarray, timestamps: np.ndarray,
                 producer_stamped: np.ndarray | None, keys: Sequence[bytes | None] | None, now: int,
                 rule: ClockRule) -> None:
    """Every record, valid or not, keeps its partition active; its timestamp moves the partition's clock as
    far as ``rule`` lets it (``record_clock``: a trusted producer's stamp counts per unit, by its record key)."""
    if not len(slots):
        return
    clocks, kept = clocks_by_slot(slots, len(progress), timestamps, producer_stamped, keys, rule, now,
                                  [p.unit_stamps for p in progress])
    for slot in np.unique(slots).tolist():
        progress[slot].last_active_wall_ms = now
    for slot, p in enumerate(progress):
        p.unit_stamps = kept[slot]
        clock = int(clocks[slot])
        if clock != NO_CLOCK:
            p.max_record_ms = clock if p.max_record_ms is None else max(p.max_record_ms, clock)
