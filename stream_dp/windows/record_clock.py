"""Which Kafka record timestamps move a partition's window clock, and how far. Pure numpy, no I/O.

Kafka tells, per record batch, who stamped its records:

* the broker (``message.timestamp.type=LogAppendTime``): its own clock when it appended the batch. No
  producer chooses it, so it is the window clock as it is: a partition's clock is the newest broker
  stamp read.
* the producer's client (``CreateTime``, Kafka's default): whatever the producer passed -- 0, or up to
  an hour ahead (the broker's default ``message.timestamp.after.max.ms``). Such a stamp carries no
  clock, unless the query trusts its producers' clocks (``trust_producer_timestamps``: a backfill
  whose records carry the times its events happened). Even then a stamp of 0 or less (none) carries
  none, and the clock reaches a time T only once records of ``quorum`` distinct units -- record keys --
  stamped at T or later were read: per key its newest stamp counts, and the partition's clock is the
  ``quorum``-th largest of those. A record without a key counts for nothing. One unit moves nothing,
  however many records it sends (valid or not); nor does any set of fewer than ``quorum`` units.

Keys are told apart by their hash (:func:`key_ids`, this process only): two keys with one hash count as one
unit, which can only hold the clock back.

Either clock is capped at the worker's wall clock and never goes back. A partition's clock is kept in
``PartitionProgress.max_record_ms`` (``watermarks``), its trusted stamps in ``PartitionProgress.unit_stamps``:
the ``quorum`` units with the newest stamps, which is all the rule needs -- a unit left out has a stamp no
newer than the ``quorum`` kept, so whatever it sends later either stays below them or is its newest stamp.
:func:`records_clock` is the rule for records read anywhere else (one partition's records, no state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Distinct units (record keys) stamped at T or later a trusted producer clock needs before a partition's clock
#: reaches T. Chosen by measurement (docs/privacy/clock.md, tests/perf/bench_clock_rule.py).
PRODUCER_QUORUM = 16
NO_CLOCK = np.iinfo(np.int64).min  # "these records carry no clock"


@dataclass(frozen=True)
class ClockRule:
    """Whose record timestamps a query's windows close by (see the module docstring)."""

    trust_producer_timestamps: bool = False
    quorum: int = PRODUCER_QUORUM

    def __post_init__(self) -> None:
        if not isinstance(self.quorum, int) or self.quorum < 1:
            raise ValueError(f"quorum must be a positive integer, got {self.quorum!r}")


@dataclass(frozen=True)
class UnitStamps:
    """One partition's trusted producer stamps kept between batches: per unit (key id), its newest stamp, for
    at most ``quorum`` units -- those with the newest stamps -- newest first."""

    keys: np.ndarray
    stamps: np.ndarray

    @classmethod
    def empty(cls) -> UnitStamps:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.keys)


_NO_UNITS = UnitStamps.empty()


def key_ids(keys: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """``(id per key, True where the record has a key)``: a key's id is its hash, the same for equal keys in this
    process. One hash per record: the only per-record Python work of the rule."""
    n = len(keys)
    if None in keys:
        has_key = np.fromiter((key is not None for key in keys), dtype=bool, count=n)
    else:  # the usual case, found by one C-level scan
        has_key = np.ones(n, dtype=bool)
    try:
        ids = np.fromiter(map(hash, keys), dtype=np.int64, count=n)
    except TypeError:  # a mutable buffer (bytearray, memoryview) for a key
        ids = np.fromiter((hash(None if key is None else bytes(key)) for key in keys), dtype=np.int64, count=n)
    return ids, has_key


def records_clock(timestamps: np.ndarray, producer_stamped: np.ndarray | None, keys: Sequence[bytes | None] | None,
                  rule: ClockRule, now_ms: int, kept: UnitStamps = _NO_UNITS) -> tuple[int | None, UnitStamps]:
    """The clock one partition's records carry: ``(clock or None, unit stamps to keep)``.

    ``timestamps``: the records' Kafka timestamps (ms); ``producer_stamped``: True where a producer stamped
    the record (``CreateTime``), None when the broker stamped them all; ``keys``: the records' keys (None:
    not known, so no producer stamp counts); ``kept``: what the partition's earlier records left, each
    stamp capped at the wall clock when it was read. Every stamp counts as at most ``now_ms`` (a stamp
    ahead of the wall clock as read now, not later); the caller keeps the largest clock it was given.
    """
    timestamps = np.asarray(timestamps, dtype=np.int64)
    clocks, new_kept = clocks_by_slot(np.zeros(len(timestamps), dtype=np.int64), 1, timestamps, producer_stamped,
                                      keys, rule, now_ms, [kept])
    clock = int(clocks[0])
    return (None if clock == NO_CLOCK else clock), new_kept[0]


def clocks_by_slot(slots: np.ndarray, n_slots: int, timestamps: np.ndarray, producer_stamped: np.ndarray | None,
                   keys: Sequence[bytes | None] | None, rule: ClockRule, now_ms: int, kept: Sequence[UnitStamps]
                   ) -> tuple[np.ndarray, list[UnitStamps]]:
    """:func:`records_clock` of a batch holding several partitions' records, each record's partition
    given as its ``slot`` (0 to ``n_slots - 1``); ``kept[slot]`` is what each slot kept.

    Returns the clock per slot (``NO_CLOCK`` where none) and what every slot keeps. Vectorised: broker
    stamps in one pass; trusted producer stamps by one sort of (slot, unit, stamp) for the batch's records
    and the kept units of the slots they are on.
    """
    timestamps = np.asarray(timestamps, dtype=np.int64)
    usable = timestamps > 0
    broker = usable if producer_stamped is None else usable & ~producer_stamped
    clocks = np.full(n_slots, NO_CLOCK, dtype=np.int64)
    np.maximum.at(clocks, slots[broker], timestamps[broker])
    new_kept = list(kept)
    if rule.trust_producer_timestamps and producer_stamped is not None and keys is not None:
        rows = np.flatnonzero(usable & producer_stamped)
        if len(rows):
            _trusted_clocks(rows, slots, timestamps, keys, rule.quorum, now_ms, clocks, new_kept)
    return np.minimum(clocks, now_ms), new_kept


def _trusted_clocks(rows: np.ndarray, slots: np.ndarray, timestamps: np.ndarray, keys: Sequence[bytes | None],
                    quorum: int, now_ms: int, clocks: np.ndarray, kept: list[UnitStamps]) -> None:
    """Fold the trusted records ``rows`` into ``kept`` and raise ``clocks`` where a quorum of units vouches."""
    ids, has_key = key_ids(keys if len(rows) == len(keys) else list(map(keys.__getitem__, rows.tolist())))
    rows = rows[has_key]
    if not len(rows):
        return
    touched = np.unique(slots[rows])
    old = [kept[slot] for slot in touched.tolist()]
    unit_slot = np.concatenate([slots[rows].astype(np.int64)] + [np.full(len(k), s, np.int64)
                                                                 for s, k in zip(touched.tolist(), old)])
    unit_key = np.concatenate([ids[has_key]] + [k.keys for k in old])
    unit_stamp = np.concatenate([np.minimum(timestamps[rows], now_ms)] + [k.stamps for k in old])
    # Rows newest first, slot by slot; a slot's units newest first are the first rows of each key.
    order = np.argsort(-unit_stamp, kind="stable")
    order = order[np.argsort(unit_slot[order], kind="stable")]
    by_slot = unit_slot[order]
    bounds, ends = np.searchsorted(by_slot, touched, side="left"), np.searchsorted(by_slot, touched, side="right")
    for slot, start, end in zip(touched.tolist(), bounds.tolist(), ends.tolist()):
        units = _newest_units(order[start:end], unit_key, quorum)
        kept[slot] = UnitStamps(unit_key[units], unit_stamp[units])
        if len(units) == quorum:
            clocks[slot] = max(int(clocks[slot]), int(unit_stamp[units[-1]]))


def _newest_units(rows: np.ndarray, unit_key: np.ndarray, quorum: int) -> np.ndarray:
    """Of ``rows`` (newest stamp first), the first row of each of the first ``quorum`` distinct keys. Looks at a
    head of the rows that grows until it holds that many keys: one unit's many records cost a few rounds."""
    head = 4 * quorum
    while True:
        firsts = np.sort(np.unique(unit_key[rows[:head]], return_index=True)[1])
        if len(firsts) >= quorum or head >= len(rows):
            return rows[firsts[:quorum]]
        head *= 4
