"""Per-partition progress and the watermark that closes windows.

Which window an event belongs to is decided by its own event time; *when*
windows close is decided by a clock no privacy unit controls: the partition's
record clock (``record_clock``: the Kafka record timestamps the broker set
with ``LogAppendTime``, or, where the query trusts its producers' clocks, a
quorum of distinct units' ``CreateTime`` stamps), never ahead of the worker's wall clock, and
the wall clock for idle partitions. An event dated in the future therefore
moves nobody's windows: it lands in its own (future) window, or is rejected
when its event time is further than ``max_future_skew_ms`` ahead of its
record timestamp. A backlog read after an outage closes its windows as its
record timestamps advance, so its on-time events are on time.

The rule:

* a partition's watermark is its record clock (capped at the wall clock)
  ``- allowed_lateness_ms`` -- raised to its restored
  ``closed_through_ms`` when it was assigned with one; a partition whose
  records carried no clock yet and that has nothing restored has no watermark;
* a partition is *idle* once it has delivered no record for
  ``idle_timeout_ms`` of wall-clock time (counted from its assignment if it
  never delivered one);
* the engine's watermark is the minimum over the partitions that are not
  idle -- and if any of them has no watermark yet, nothing advances;
* if every owned partition is idle, the watermark follows the wall clock:
  ``now - allowed_lateness_ms``, as if records kept arriving with current
  timestamps; windows then close ``allowed_lateness_ms`` after their end, as
  they would on a live stream;
* each owned partition keeps a ``closed_through_ms`` that never goes back:
  the latest window boundary at or below any engine watermark seen while it
  was owned (or its restored value); the partition's part of a window
  ``[start, end)`` closes once ``end <= closed_through_ms``. Each raise is
  remembered as a *closure step* (the first offset read under it, the new
  boundary), so that a replay can meet every offset with the closure the
  first run met it with;
* a partition assigned with a restored closure *replays* until it has read
  up to the first offset its earlier owner had not processed. Meanwhile its
  closure moves only by the earlier owner's steps above the restored closure
  (windows it closed but had not made durable, e.g. held for a budget
  charge), each taken once the replay reads past its offset: events are
  then late or counted exactly as they were the first time, and windows
  close after the same events. Closing them by the restored record clock or
  other partitions' clocks instead would make replayed events late, or
  count events the first run called late. The engine's
  watermark itself can drop when a lagging partition is assigned, which
  keeps that partition's windows open until it catches up rather than
  calling its replayed events late.

Every record counts for activity, valid or not, and moves the clock as its
timestamp allows (``record_clock``), never by its contents.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from stream_dp.windows.record_clock import UnitStamps
from stream_dp.windows.specs import WindowSpec

#: Closure steps kept per partition: raises happen once a window, and only those above the
#: committed closure (windows closed but not yet durable) matter to a next owner.
MAX_CLOSURE_STEPS = 16


@dataclass(slots=True)
class PartitionProgress:
    """What the engine knows about one owned partition."""

    restored_through_ms: int | None
    last_active_wall_ms: int
    max_record_ms: int | None = None  # the partition's record clock (``record_clock``)
    next_offset: int | None = None
    closed_through_ms: int | None = None
    #: Offsets below this were processed by an earlier owner: their events in
    #: restored-closed windows are replays. At or above it they are new, and late.
    replay_until_offset: int | None = None
    #: Where reading starts, when known before any record was read (the committed offset).
    read_from_offset: int | None = None
    #: Closure raised while owned, oldest first: (first offset read under it, boundary).
    closure_steps: list[tuple[int, int]] = field(default_factory=list)
    #: The earlier owner's steps above the restored closure, not taken yet (see the module docstring).
    restored_steps: tuple[tuple[int, int], ...] = ()
    #: Trusted producer stamps read since assignment: the newest per unit (record key), for the ``ClockRule.quorum``
    #: units with the newest ones (``record_clock``).
    unit_stamps: UnitStamps = field(default_factory=UnitStamps.empty)

    def __post_init__(self) -> None:
        if self.closed_through_ms is None:
            self.closed_through_ms = self.restored_through_ms
        self.restored_steps = tuple(sorted((int(o), int(b)) for o, b in self.restored_steps
                                           if self.restored_through_ms is None or b > self.restored_through_ms))

    def read_position(self) -> int:
        """The next offset to be read here (-1 when unknown: any offset read later is past it)."""
        return max(-1 if self.next_offset is None else self.next_offset,
                   -1 if self.read_from_offset is None else self.read_from_offset)

    @property
    def replaying(self) -> bool:
        """Still short of the offset the earlier owner had processed to (see the module docstring)."""
        if self.replay_until_offset is None:
            return False
        return self.read_position() < self.replay_until_offset

    def close_through(self, boundary_ms: int, at_offset: int | None = None) -> None:
        """Raise ``closed_through_ms`` to ``boundary_ms`` (never lowers it), for offsets read from
        ``at_offset`` on (default: the read position)."""
        if self.closed_through_ms is None or boundary_ms > self.closed_through_ms:
            self.closed_through_ms = boundary_ms
            self.closure_steps.append((self.read_position() if at_offset is None else at_offset, boundary_ms))
            del self.closure_steps[:-MAX_CLOSURE_STEPS]

    def take_restored_steps(self) -> None:
        """Take the earlier owner's steps the replay has read past; drop the rest once it is through."""
        if not self.restored_steps:
            return
        read = self.read_position()
        for offset, boundary in self.restored_steps:
            if offset <= read:
                self.close_through(boundary, offset)
        if not self.replaying:
            self.restored_steps = ()

    def pending_steps(self) -> list[tuple[int, int]]:
        """The steps a next owner needs: those taken here and the restored ones not taken yet."""
        closed = self.closed_through_ms
        return self.closure_steps + [s for s in self.restored_steps if closed is None or s[1] > closed]

    def watermark_ms(self, allowed_lateness_ms: int, now_ms: int) -> int | None:
        if self.max_record_ms is None:
            return self.restored_through_ms
        # A producer clock ahead of ours does not close windows early.
        from_records = min(self.max_record_ms, now_ms) - allowed_lateness_ms
        if self.restored_through_ms is None:
            return from_records
        return max(from_records, self.restored_through_ms)

    def is_idle(self, now_ms: int, idle_timeout_ms: int) -> bool:
        return now_ms - self.last_active_wall_ms >= idle_timeout_ms


def window_close_ms(window_end_ms: int, allowed_lateness_ms: int) -> int:
    """The earliest record timestamp that closes a window ending at ``window_end_ms`` on a partition.

    The watermark rule above read backwards: a partition's watermark passes the end once it has
    delivered a record stamped ``allowed_lateness_ms`` after it. The release stage asks the broker
    for the first such record of a partition that has not reported a window closed
    (``stream_dp.worker.release.partition_lag``): records before it may still hold the window's events.
    """
    return window_end_ms + allowed_lateness_ms


def combined_watermark_ms(partitions: Iterable[PartitionProgress], now_ms: int, spec: WindowSpec) -> int | None:
    """The watermark the owned partitions allow right now."""
    owned = list(partitions)
    if not owned:
        return None
    active = [p for p in owned if not p.is_idle(now_ms, spec.idle_timeout_ms)]
    if not active:
        return now_ms - spec.allowed_lateness_ms
    lowest: int | None = None
    for progress in active:
        mark = progress.watermark_ms(spec.allowed_lateness_ms, now_ms)
        if mark is None:
            return None
        lowest = mark if lowest is None else min(lowest, mark)
    return lowest
