"""One window's draw: its ledger entry built (every noise draw, once) and encoded, or the window withheld.

A window whose release cannot be built would fail the same way every time it is
tried: after a restart its partials are replayed and it is built again. Letting
the error end the release stage would stop every query of the worker on every
restart, so such a window is withheld instead: nothing is stored in the ledger
and nothing is published (the privacy of a window never released is not at
stake), ``stream_dp_internal_errors_total{kind="release_failed"}`` counts it
(an alert rule fires on it) and the error is logged with its traceback; its
partials are then committed like a released window's, unless the ledger already
holds the window's release (an earlier run drew it and stopped before
publishing): that one is published. Only errors the data or the plan make
(``ValueError``, ``ArithmeticError``, ...) withhold a window; others (an OS
error, memory) may pass, so they end the stage and the window is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.release_build import build_release
from stream_dp.worker.release_entry import encode_entry

log = logging.getLogger(__name__)

_ENCODE_IN_THREAD_ROWS = 50_000


async def draw_payload(query: Any, window: Any, noise: Any, metrics: WorkerMetrics, released_at_ms: int,
                       previous_state: Any = None) -> bytes | None:
    """The window's release as the ledger stores it (``release_entry``), or None if it was withheld."""
    timing = metrics.release_stage_seconds
    started = time.perf_counter()
    try:
        # In a thread: a million groups take seconds of noise, and the event loop
        # must keep both consumers' heartbeats going meanwhile.
        entry = await asyncio.to_thread(build_release, query, window, noise, released_at_ms, previous_state)
    except (ValueError, TypeError, ArithmeticError, IndexError, KeyError, AssertionError):
        # What the window's data or the query's plan make fail, every time. An OS error, a lack of memory or
        # a sandbox that cannot start may pass: those end the stage as before, and the window is retried.
        metrics.internal_errors.labels("release_failed").inc()
        log.exception("window %s of %s is withheld: its release could not be built, and would fail again on every "
                      "retry and restart; nothing of it is stored or published. Fix the cause above (a bug or a "
                      "query the worker cannot release) for later windows", window.window_start_ms, query.name)
        return None
    finally:
        if query.sandbox is not None:
            for reason, blocks in query.sandbox.take_failures().items():
                metrics.sample_aggregate_failures.labels(query.name, reason).inc(blocks)
                log.warning("window %s of %s: %d block(s) failed (%s) and count as the output range's midpoint",
                            window.window_start_ms, query.name, blocks, reason)  # at most once a window
    metrics.noise_seconds.labels(query.name).observe(time.perf_counter() - started)
    timing.labels(query.name, "noise").observe(time.perf_counter() - started)
    started = time.perf_counter()
    if entry.rows > _ENCODE_IN_THREAD_ROWS:
        payload = await asyncio.to_thread(encode_entry, entry)
    else:
        payload = encode_entry(entry)
    timing.labels(query.name, "encode").observe(time.perf_counter() - started)
    return payload
