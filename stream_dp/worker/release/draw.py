"""One window's draw: its ledger entry built (every noise draw, once), encoded and read back.

A window whose release cannot be built from its data is released as if empty
(noise only: every public group at zero, or no group selected), never left
out: whether, when and what a window publishes must not depend on its data,
and a build error is whatever its data made of the code. So any exception
while building, encoding or reading back the entry -- a bug the data hits, a
plan that cannot take the window, a lack of memory, an OS error, a sandbox
that cannot start -- is logged with its traceback, counted in
``stream_dp_internal_errors_total{kind="release_failed"}`` (an alert rule fires
on it) and, once the fallback is published, in
``stream_dp_windows_withheld_total{reason="release_failed"}``; the window's
records say ``"as_if_empty": "release_failed"``. The fallback is drawn at once:
retrying an error that may pass would let the error (and whatever caused it)
decide when the window is published. Only if the empty window cannot be built
either -- a fault of the query's plan or of this worker, which no data
decides -- is nothing published (``kind="empty_release_failed"``).

Like any draw, the fallback is claimed in the ledger before it is published: if
an earlier run stored the window's release, that one is published instead, so a
window is never drawn twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from stream_dp.config.query_options import PublicGroups
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.release.build import build_release
from stream_dp.worker.release.entry import ReleaseEntry, StoredRecords, decode_entry, encode_entry

log = logging.getLogger(__name__)

_ENCODE_IN_THREAD_ROWS = 50_000
RELEASE_FAILED = "release_failed"


@dataclass(frozen=True)
class Drawn:
    """A window's release as the ledger stores it (``payload``), as it renders (``release``: the payload read
    back), and the window it was drawn from (the fallback's, without data, if the build failed)."""

    payload: bytes
    release: ReleaseEntry | StoredRecords
    window: Any
    #: (noise source, query, vectors): the query's next window's noise, to draw once this one is published
    ahead: tuple[Any, str, list] | None = None


async def draw_payload(query: Any, window: Any, noise: Any, metrics: WorkerMetrics, released_at_ms: int,
                       previous_state: Any = None) -> Drawn | None:
    """The window's release (see the module docstring), or None if not even its empty fallback could be built."""
    try:
        return await _draw(query, window, noise, metrics, released_at_ms, previous_state)
    except Exception:
        metrics.internal_errors.labels(RELEASE_FAILED).inc()
        log.exception("window %s of %s could not be built from its data; it is released as if empty (noise only, "
                      "its records flagged as_if_empty) and its units stay charged. Fix the cause above (a bug, or "
                      "a query the worker cannot release) for later windows", window.window_start_ms, query.name)
    empty = query.combiner.as_if_empty(window, RELEASE_FAILED)
    try:
        return await _draw(query, empty, noise, metrics, released_at_ms, previous_state)
    except Exception:
        metrics.internal_errors.labels("empty_release_failed").inc()
        log.exception("window %s of %s cannot be released even as if empty: the query's plan or this worker is at "
                      "fault, whatever the data; nothing of it is published", window.window_start_ms, query.name)
        return None


async def _draw(query: Any, window: Any, noise: Any, metrics: WorkerMetrics, released_at_ms: int,
                previous_state: Any) -> Drawn:
    timing = metrics.release_stage_seconds
    started = time.perf_counter()
    try:
        # In a thread: a million groups take seconds of noise, and the event loop
        # must keep both consumers' heartbeats going meanwhile.
        owner = query.name if _stashes_noise(query, noise) else None
        entry, drawn = await asyncio.to_thread(_build, query, window, noise, released_at_ms, previous_state, owner)
    finally:
        if query.sandbox is not None:
            for reason, blocks in query.sandbox.take_failures().items():
                metrics.sample_aggregate_failures.labels(query.name, reason).inc(blocks)
                log.warning("window %s of %s: %d block(s) failed (%s) and count as the output range's midpoint",
                            window.window_start_ms, query.name, blocks, reason)  # at most once a window
    metrics.noise_seconds.labels(query.name).observe(time.perf_counter() - started)
    timing.labels(query.name, "noise").observe(time.perf_counter() - started)
    started = time.perf_counter()
    # Read back here, where a failure still falls back: a stored entry no worker can read would never be published.
    if entry.rows > _ENCODE_IN_THREAD_ROWS:
        payload = await asyncio.to_thread(encode_entry, entry)
        release = await asyncio.to_thread(decode_entry, payload)
    else:
        payload = encode_entry(entry)
        release = decode_entry(payload)
    timing.labels(query.name, "encode").observe(time.perf_counter() - started)
    return Drawn(payload, release, window, (noise, owner, drawn) if drawn else None)


def draw_ahead(ahead: tuple[Any, str, list] | None) -> None:
    """Start drawing a query's next window's noise in a thread (``Drawn.ahead``; stream_dp.dp.noise_stash); None.
    Called once the window is published: drawn beside the publish, it slowed the publish on two cores."""
    if ahead is None:
        return None
    noise, owner, keys = ahead
    asyncio.get_running_loop().run_in_executor(None, noise.predraw, owner, keys).add_done_callback(
        lambda done: _report_predraw(done, owner))
    return None


def _report_predraw(done: asyncio.Future, owner: str) -> None:
    """A failed draw ahead costs nothing but time: the window draws its own noise. A cancelled one (the loop
    stopping) is not an error; ``exception()`` of a cancelled future would raise in the callback."""
    if not done.cancelled() and done.exception() is not None:
        log.error("noise for the next window of %s was not drawn ahead: %r", owner, done.exception())


def _stashes_noise(query: Any, noise: Any) -> bool:
    """Whether ``query``'s draws are stashed ahead: public groups only, whose every vector's length comes from
    the configuration (``stream_dp.dp.noise_stash`` says why), and a noise source that stashes."""
    return hasattr(noise, "drawing_for") and isinstance(query.config.groups, PublicGroups)


def _build(query: Any, window: Any, noise: Any, released_at_ms: int, previous_state: Any,
           owner: str | None) -> tuple[ReleaseEntry, list]:
    """``build_release``, and the discrete Laplace vectors it drew when drawing for ``owner``."""
    if owner is None:
        return build_release(query, window, noise, released_at_ms, previous_state), []
    with noise.drawing_for(owner) as drawn:
        entry = build_release(query, window, noise, released_at_ms, previous_state)
    return entry, list(drawn)
