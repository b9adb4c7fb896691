"""Liveness and readiness of one worker process, for ``/healthz`` and ``/readyz``.

The HTTP server answers from another thread, so it never touches the Kafka
clients or Redis itself: a watcher task on the worker's event loop samples
them once a second into a :class:`Health`, and the answers are read from it.

* **Live** while the event loop keeps running the watcher: a loop blocked
  for ``stall_after_s`` (a stuck synchronous call, a deadlock) is not live,
  and an orchestrator should restart the process. A Redis or Kafka outage
  does not make a worker dead: it holds its windows and retries by design,
  and a restart would not help.
* **Ready** once the ingest consumer has joined its group (an assignment,
  possibly empty when there are more workers than partitions) and Redis
  answered the last ping (and its user may run what the worker runs): a
  worker that cannot charge budgets releases nothing, which an operator
  should see as not ready.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str


class Health:
    """What the watcher last saw; safe to read from any thread."""

    def __init__(self, *, stall_after_s: float = 60.0, clock_s: Callable[[], float] = time.monotonic) -> None:
        if not stall_after_s > 0:
            raise ValueError(f"stall_after_s must be positive, got {stall_after_s!r}; 60 s suits most deployments")
        self.stall_after_s = stall_after_s
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._last_beat_s: float | None = None
        self._assigned: int | None = None  # input partitions owned; None before the first assignment
        self._redis_error: str | None = "not checked yet"

    def beat(self, *, assigned: int | None, redis_error: str | None) -> None:
        with self._lock:
            self._last_beat_s = self._clock_s()
            self._assigned = assigned
            self._redis_error = redis_error

    def liveness(self) -> Verdict:
        with self._lock:
            last = self._last_beat_s
        if last is None:
            return Verdict(True, "starting")
        idle = self._clock_s() - last
        if idle > self.stall_after_s:
            return Verdict(False, f"the event loop has not run for {idle:.0f} s (limit {self.stall_after_s:.0f} s)")
        return Verdict(True, "ok")

    def readiness(self) -> Verdict:
        live = self.liveness()
        if not live.ok:
            return live
        with self._lock:
            assigned, redis_error, started = self._assigned, self._redis_error, self._last_beat_s is not None
        if not started or assigned is None:
            return Verdict(False, "the ingest consumer has not joined its group yet")
        if redis_error is not None:
            return Verdict(False, f"Redis cannot be used: {redis_error}")
        return Verdict(True, f"ok: {assigned} input partitions assigned")


async def watch(
    health: Health,
    stop: asyncio.Event,
    *,
    assigned: Callable[[], int | None],
    ping_redis: Callable[[], object],
    interval_s: float = 1.0,
    ping_timeout_s: float = 2.0,
) -> None:
    """Sample the worker into ``health`` every ``interval_s`` until ``stop`` is set."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(asyncio.to_thread(ping_redis), ping_timeout_s)
            redis_error = None
        except Exception as exc:  # any failure to answer is "not ready", never a crash
            redis_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        health.beat(assigned=assigned(), redis_error=redis_error)
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass
