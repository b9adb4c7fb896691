"""Something done at most once every ``interval_s`` seconds (offset commits, progress heartbeats), and
at once the first time.

The clock is monotonic, and a monotonic clock's zero is arbitrary: on Linux it is the boot, so on a
machine up for less than ``interval_s`` a "last done at 0.0" would hold the first run back. Never
done is kept as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Spacing:
    def __init__(self, interval_s: float, *, clock_s: Callable[[], float] | None = None) -> None:
        self.interval_s = interval_s
        self._clock_s = clock_s or time.monotonic  # looked up here, not at import: tests may set the clock
        self._last_s: float | None = None

    def now(self) -> float:
        return self._clock_s()

    def due(self, now_s: float) -> bool:
        """Never done yet, or done ``interval_s`` or more before ``now_s``."""
        return self._last_s is None or now_s - self._last_s >= self.interval_s

    def done(self, now_s: float) -> None:
        self._last_s = now_s
