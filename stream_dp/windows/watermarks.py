"""Per-partition progress and the watermark that closes windows.

The rule:

* a partition's watermark is the newest event time it has delivered minus
  ``allowed_lateness_ms`` -- raised to its restored ``closed_through_ms`` when
  it was assigned with one; a partition that has delivered nothing and has
  nothing restored has no watermark;
* a partition is *idle* once it has delivered no valid event for
  ``idle_timeout_ms`` of wall-clock time (counted from its assignment if it
  never delivered one);
* the engine's watermark is the minimum over the partitions that are not
  idle -- and if any of them has no watermark yet, nothing advances;
* if every owned partition is idle, the watermark follows the wall clock:
  ``now - allowed_lateness_ms``, as if events kept arriving with current
  times; windows then close ``allowed_lateness_ms`` after their end, as they
  would on a live stream;
* each owned partition keeps a ``closed_through_ms`` that never goes back:
  the latest window boundary at or below any engine watermark seen while it
  was owned (or its restored value); the partition's part of a window
  ``[start, end)`` closes once ``end <= closed_through_ms``. The engine's
  watermark itself can drop when a lagging partition is assigned, which
  keeps that partition's windows open until it catches up rather than
  calling its replayed events late.

Event times are capped at ``max_future_skew_ms`` ahead of the wall clock by
the decoder, so one bad producer cannot push the watermark far ahead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stream_dp.windows.specs import WindowSpec


@dataclass(slots=True)
class PartitionProgress:
    """What the engine knows about one owned partition."""

    restored_through_ms: int | None
    last_active_wall_ms: int
    max_event_ms: int | None = None
    next_offset: int | None = None
    closed_through_ms: int | None = None
    #: Offsets below this were processed by an earlier owner: their events in
    #: restored-closed windows are replays. At or above it they are new, and late.
    replay_until_offset: int | None = None

    def __post_init__(self) -> None:
        if self.closed_through_ms is None:
            self.closed_through_ms = self.restored_through_ms

    def close_through(self, boundary_ms: int) -> None:
        """Raise ``closed_through_ms`` to ``boundary_ms`` (never lowers it)."""
        if self.closed_through_ms is None or boundary_ms > self.closed_through_ms:
            self.closed_through_ms = boundary_ms

    def watermark_ms(self, allowed_lateness_ms: int) -> int | None:
        from_events = None if self.max_event_ms is None else self.max_event_ms - allowed_lateness_ms
        if from_events is None:
            return self.restored_through_ms
        if self.restored_through_ms is None:
            return from_events
        return max(from_events, self.restored_through_ms)

    def is_idle(self, now_ms: int, idle_timeout_ms: int) -> bool:
        return now_ms - self.last_active_wall_ms >= idle_timeout_ms


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
        mark = progress.watermark_ms(spec.allowed_lateness_ms)
        if mark is None:
            return None
        lowest = mark if lowest is None else min(lowest, mark)
    return lowest
