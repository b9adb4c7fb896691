"""Which Kafka record timestamps move a partition's window clock, and how far. Pure numpy, no I/O.

Kafka tells, per record batch, who stamped its records:

* the broker (``message.timestamp.type=LogAppendTime``): its own clock when it appended the batch. No
  producer chooses it, so it is the window clock as it is: a partition's clock is the newest broker
  stamp read.
* the producer's client (``CreateTime``, Kafka's default): whatever the producer passed -- 0, or up to
  an hour ahead (the broker's default ``message.timestamp.after.max.ms``). Such a stamp carries no
  clock, unless the query trusts its producers' clocks (``trust_producer_timestamps``: a backfill
  whose records carry the times its events happened). Even then a stamp of 0 or less (none) carries
  none, and the clock reaches a time T only once ``quorum`` records stamped at T or later were read:
  the partition's clock is the ``quorum``-th largest producer stamp read. Fewer records than that --
  one producer whose clock jumped, one unit's handful of records -- move nothing.

Either clock is capped at the worker's wall clock and never goes back. A partition's clock is kept in
``PartitionProgress.max_record_ms`` (``watermarks``), its trusted producer stamps in
``PartitionProgress.producer_stamps``; :func:`records_clock` is the rule for records read anywhere
else (one partition's records, no state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Records stamped at T or later a trusted producer clock needs before a partition's clock reaches T.
#: Chosen by measurement (docs/privacy/clock.md, tests/perf/bench_clock_rule.py).
PRODUCER_QUORUM = 16
NO_CLOCK = np.iinfo(np.int64).min  # "these records carry no clock"
_NO_STAMPS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class ClockRule:
    """Whose record timestamps a query's windows close by (see the module docstring)."""

    trust_producer_timestamps: bool = False
    quorum: int = PRODUCER_QUORUM

    def __post_init__(self) -> None:
        if not isinstance(self.quorum, int) or self.quorum < 1:
            raise ValueError(f"quorum must be a positive integer, got {self.quorum!r}")


def top_stamps(kept: np.ndarray, stamps: np.ndarray, quorum: int) -> np.ndarray:
    """The ``quorum`` largest of ``kept`` and ``stamps`` together, ascending (all of them when fewer)."""
    both = np.concatenate([kept, stamps]) if len(kept) else stamps
    if len(both) > quorum:
        both = np.partition(both, len(both) - quorum)[len(both) - quorum:]
    return np.sort(both)


def _quorum_clock(stamps: np.ndarray, quorum: int) -> int:
    """The clock kept producer stamps (ascending, at most ``quorum``) vouch for: the smallest, once there are
    ``quorum`` of them."""
    return int(stamps[0]) if len(stamps) >= quorum else int(NO_CLOCK)


def records_clock(timestamps: np.ndarray, producer_stamped: np.ndarray | None, rule: ClockRule, now_ms: int,
                  producer_stamps: np.ndarray = _NO_STAMPS) -> tuple[int | None, np.ndarray]:
    """The clock one partition's records carry: ``(clock or None, producer stamps to keep)``.

    ``timestamps``: the records' Kafka timestamps (ms); ``producer_stamped``: True where a producer stamped
    the record (``CreateTime``), None when the broker stamped them all; ``producer_stamps``: the stamps kept
    from the partition's earlier records (:func:`top_stamps`), each capped at the wall clock when it was
    read. Every stamp counts as at most ``now_ms`` (a stamp ahead of the wall clock as read now, not
    later); the caller keeps the largest clock it was given.
    """
    timestamps = np.asarray(timestamps, dtype=np.int64)
    clocks, kept = clocks_by_slot(np.zeros(len(timestamps), dtype=np.int64), 1, timestamps, producer_stamped, rule,
                                  now_ms, [producer_stamps])
    clock = int(clocks[0])
    return (None if clock == NO_CLOCK else clock), kept[0]


def clocks_by_slot(slots: np.ndarray, n_slots: int, timestamps: np.ndarray, producer_stamped: np.ndarray | None,
                   rule: ClockRule, now_ms: int, producer_stamps: Sequence[np.ndarray]
                   ) -> tuple[np.ndarray, list[np.ndarray]]:
    """:func:`records_clock` of a batch holding several partitions' records, each record's partition
    given as its ``slot`` (0 to ``n_slots - 1``); ``producer_stamps[slot]`` are each slot's kept stamps.

    Returns the clock per slot (``NO_CLOCK`` where none) and every slot's stamps to keep. Broker stamps
    are taken in one pass; only trusted producer stamps are sorted, slot by slot.
    """
    timestamps = np.asarray(timestamps, dtype=np.int64)
    usable = timestamps > 0
    broker = usable if producer_stamped is None else usable & ~producer_stamped
    clocks = np.full(n_slots, NO_CLOCK, dtype=np.int64)
    np.maximum.at(clocks, slots[broker], timestamps[broker])
    kept = list(producer_stamps)
    if rule.trust_producer_timestamps and producer_stamped is not None:
        trusted = usable & producer_stamped
        if trusted.any():
            by_slot = slots[trusted]
            stamps = np.minimum(timestamps[trusted], now_ms)
            order = np.argsort(by_slot, kind="stable")
            by_slot, stamps = by_slot[order], stamps[order]
            bounds = np.searchsorted(by_slot, np.arange(n_slots + 1))
            for slot in np.flatnonzero(np.diff(bounds)).tolist():
                kept[slot] = top_stamps(kept[slot], stamps[bounds[slot]:bounds[slot + 1]], rule.quorum)
                clocks[slot] = max(int(clocks[slot]), _quorum_clock(kept[slot], rule.quorum))
    return np.minimum(clocks, now_ms), kept
