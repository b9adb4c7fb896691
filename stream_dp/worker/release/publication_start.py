"""Where a public-groups query starts publishing, and how far each of its homes has: read from the release
ledger for the release stage (``docs/privacy/publication-rule.md``).

A query over public groups publishes every window, data or not, from its first window on: the window holding
its publication start. That start is the ledger's clock (Redis's, one for every worker, as the budget
store's) when a worker first ran the query, less its ``allowed_lateness`` (the earliest event time whose
window could still take an event on time then), kept in the ledger by the first worker that asks; the
query file's ``window.publish_from`` replaces it. No data takes part, so neighbouring streams publish the
same windows. Each home continues from its released mark; a window before where its home releases from is
never released, data or not (``WindowCombiner.unreleasable``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.query.runtime import QueryRuntime
from stream_dp.worker.store.ledger import LedgerUnavailable, ReleaseLedger, StoredRelease

log = logging.getLogger(__name__)
ASK_EVERY_S = 2.0  # how often a start or a mark not read yet is asked for again


def first_window_start(instant_ms: int, window_size_ms: int, window_offset_ms: int) -> int:
    """Start of the window holding ``instant_ms``: the first window that ends after it."""
    return window_offset_ms + (instant_ms - window_offset_ms) // window_size_ms * window_size_ms


class PublicationStarts:
    """Sets each public-groups query's ``combine.combiner.query_start_ms`` and its homes' released marks from the ledger."""

    def __init__(self, ledger: ReleaseLedger, metrics: WorkerMetrics, store_ready: Callable[[], bool]) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.store_ready = store_ready
        self._next_ask_s = -math.inf

    async def read_mark(self, query: QueryRuntime, home: int) -> None:
        """A home whose mark cannot be read releases nothing of a public-groups query until it is (``learn`` asks
        again): from the query's first window it would draw windows released long ago again."""
        try:
            through = await asyncio.to_thread(self.ledger.released_through, query.name, home)
        except LedgerUnavailable as exc:
            self.metrics.internal_errors.labels("ledger_unavailable").inc()
            if home not in query.combiner.unknown_homes:
                log.warning("cannot read release progress of %s/%d (%s); its public windows wait until it is read",
                            query.name, home, exc)
            query.combiner.unknown_homes.add(home)
            return
        query.combiner.unknown_homes.discard(home)
        if through is not None:
            query.combiner.restore_released_through(home, through)

    async def learn(self, queries: list[QueryRuntime]) -> None:
        """Until known, asked every few seconds: each public-groups query's start, and the marks of homes that
        could not be read at assignment. Not before the store is verified (``guard.store``): a Redis that lost
        its data gets no start written."""
        now_s = time.monotonic()
        if now_s < self._next_ask_s or not self.store_ready():
            return
        self._next_ask_s = now_s + ASK_EVERY_S
        for query in queries:
            if query.public_groups is None:
                continue
            for home in sorted(query.combiner.unknown_homes):
                await self.read_mark(query, home)
            if query.combiner.query_start_ms is None:
                await self._learn_start(query)

    async def _learn_start(self, query: QueryRuntime) -> None:
        window = query.config.window
        try:
            kept = await asyncio.to_thread(self.ledger.publication_start, query.name, window.allowed_lateness_ms)
        except LedgerUnavailable as exc:
            self.metrics.internal_errors.labels("ledger_unavailable").inc()
            log.warning("cannot read where %s publishes from (%s); its windows wait until it is read", query.name, exc)
            return
        start = kept if window.publish_from_ms is None else window.publish_from_ms
        query.combiner.query_start_ms = first_window_start(start, window.size_ms, window.offset_ms)
        log.info("%s publishes every window from %d on (its publication start %d: %s)", query.name,
                 query.combiner.query_start_ms, start,
                 "window.publish_from" if window.publish_from_ms is not None else "its first run less allowed_lateness")

    async def unreleasable(self, query: QueryRuntime, start: int, end: int, partials: int) -> StoredRelease | None:
        """Counts ``partials`` of a public-groups window its home never releases; returns its stored release if
        one was stored and never published (then it is published, as any stored release is)."""
        if not query.combiner.is_released(start, end):  # a home that released nothing: before the query's start
            self.metrics.partials_unreleasable.labels(query.name, "before_start").inc(partials)
            return None
        try:
            stored = await asyncio.to_thread(self.ledger.get, query.name, start)
        except LedgerUnavailable:
            self.metrics.internal_errors.labels("ledger_unavailable").inc()
            stored = None  # a window behind the mark is published, or never is: only its stored release could go
        if stored is None:
            self.metrics.partials_unreleasable.labels(query.name, "behind_mark").inc(partials)
            return None
        if stored.published:
            self.metrics.late_partials.labels(query.name).inc(partials)
            return None
        return stored
