"""One round of work at a time in the background, its failure raised where the caller next looks.

The ingest stage charges the budget of closed windows and publishes their
partials in rounds. A round waits mostly on Redis (the charge script runs
there, on another core), so the ingest loop starts it and goes on reading,
decoding and windowing the next records instead of waiting: the Redis time
leaves the loop's critical path. What the stage's correctness needs from a
round stays as it was:

* rounds never overlap (``start`` does nothing while one runs), so windows are
  still charged oldest first, each once;
* a round's failure is not lost: the next ``start`` (or ``settle(raise_failure=True)``)
  raises it, in the ingest loop, as an awaited round would have;
* ``settle`` waits for the running round: a rebalance and the final commit
  call it before they touch what a round reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class BackgroundRounds:
    """Runs ``work()`` as an asyncio task, one at a time."""

    def __init__(self, work: Callable[[], Awaitable[None]], *, name: str = "round") -> None:
        self._work = work
        self._name = name
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> bool:
        """Start a round unless one runs; returns whether one started.

        Raises the exception of the last round if it failed (once).
        """
        task = self._task
        if task is not None:
            if not task.done():
                return False
            self._task = None
            task.result()  # a failed round fails the caller now
        self._task = asyncio.create_task(self._work(), name=self._name)
        return True

    async def settle(self, *, raise_failure: bool = False) -> None:
        """Wait for the running round, if any. Its failure is kept for the next ``start``,
        or raised here with ``raise_failure``."""
        task = self._task
        if task is None:
            return
        await asyncio.wait([task])
        if raise_failure:
            self._task = None
            task.result()
