"""Whether an input partition that has not reported a window closed may still hold its events.

Pure logic over what the broker says (``stream_dp.worker.release.partition_check`` asks it). A window
is released once every input partition has sent its partial or reported the window closed
(``combine.combiner``). A partition that has done neither after ``release_timeout`` is either **behind**
-- its worker has not yet read the records that close the window: a backlog, a flood of large
messages, a worker that is down or paused, a budget store that holds its charges -- or it has
**nothing more** for the window. Only the second may be left out of the release: leaving out a
partition because it is behind would let the volume of one unit's messages decide which units
a release counts.

The broker's records decide, never the data in them: the window's **close offset** on the
partition is the first offset whose record timestamp is at or after the window's close time
(``watermarks.window_close_ms``: the record that moves the partition's clock past the window).
Records before it may hold the window's events; records from it on are late by the broker's
clock. The ingest group's **committed offset** has passed every record whose window is open or
unpublished (``ingest.commit_plan``), and the partials of what it passed were flushed before the
commit. So a partition whose committed offset has reached the close offset (its log end, when
no record is that recent yet: the wall clock is past the close time, so any later record is
stamped after it) holds nothing more for the window. A partition the group never committed
counts from its log start. Where the producers' stamps are the clock (``trust_producer_timestamps``),
one record stamped at the close time does not close the window, so no close offset is read and
only the log end counts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionEvidence:
    """The broker's offsets of one input partition, read once the wall clock passed a window's close time.

    ``committed``: the ingest group's committed offset (None: never committed); ``log_start`` and
    ``log_end``: the partition's first and next offsets; ``close_offset``: the first offset whose
    record timestamp is at or after the close time (None: no such record yet, or not read).
    """

    committed: int | None
    log_start: int
    log_end: int
    close_offset: int | None

    @property
    def processed_through(self) -> int:
        """Offsets below this are processed, and what they held for a window is in its partial (or late)."""
        return self.log_start if self.committed is None else max(self.committed, self.log_start)

    @property
    def window_bound(self) -> int:
        """Offsets below this may hold events of the window."""
        return self.log_end if self.close_offset is None else min(self.close_offset, self.log_end)

    @property
    def nothing_more(self) -> bool:
        """The partition holds nothing more for the window: it may be left out of its release."""
        return self.processed_through >= self.window_bound

    @property
    def records_behind(self) -> int:
        """Records not processed yet that may hold events of the window (0 when ``nothing_more``)."""
        return max(0, self.window_bound - self.processed_through)

    def describe(self) -> str:
        close = "none yet" if self.close_offset is None else str(self.close_offset)
        committed = "none" if self.committed is None else str(self.committed)
        return (f"committed offset {committed}, close offset {close}, log {self.log_start}..{self.log_end}: "
                f"{self.records_behind} records to read before the window closes")
