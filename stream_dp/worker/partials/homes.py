"""Which partition of the partials topic is the home of a window: where its partials and progress meet.

Each window of a query has a **home**: one partition of the partials topic
(``window_home``). Every input partition's partial of the window is sent
there, and the release consumer that owns the home releases the window.
Progress markers ("input partition p has closed every window through t") go
to every partials partition, each after the partials they cover, so within
one home partition a marker is never read before the partials it vouches for.
Completeness is therefore judged only with the progress read from the
window's own home partition.

Pure logic, no I/O; the ingest stage sends to the home, the release stage reads from it.
"""

from __future__ import annotations

import hashlib


def window_home(query: str, window_start_ms: int, partials_partitions: int, period: tuple[int, int] | None = None) -> int:
    """The partials-topic partition of a (query, window): stable across processes and versions.

    ``period`` = (period_ms, offset_ms) of a continual query: all windows of one period share a
    home, so one release consumer continues the period's tree window after window, in order.
    """
    if period is not None:
        period_ms, offset_ms = period
        window_start_ms = offset_ms + (window_start_ms - offset_ms) // period_ms * period_ms
    digest = hashlib.blake2b(f"{query}|{window_start_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partials_partitions
