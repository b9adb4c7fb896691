"""Faults of the hosts around the workers: a worker clock ten minutes off, and Redis without
``appendfsync always`` killed together with a worker."""

from __future__ import annotations

import glob
import time
from dataclasses import dataclass

from tests.reliability.checks import CheckReport
from tests.reliability.harness import RunContext
from tests.reliability.topics import read_topic, wait_until

SKEW_S = 600


def faked_clock_env(offset_s: int = SKEW_S) -> dict[str, str]:
    """Environment that runs a process on Debian's libfaketime with its wall clock ``offset_s`` off.

    The wall clock is ``offset_s`` off from the start; the monotonic clock runs at its true rate (timeouts
    and retries last what they should, as on a host whose NTP is wrong), from another origin: libfaketime
    moves it with the wall clock. Leaving it alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``) breaks
    ``time.sleep``, which then fails with EINVAL (libfaketime 0.9.10 translates its absolute monotonic
    deadline as a faked one), so any blocking retry loop of the worker crashed it."""
    libraries = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libraries:
        raise RuntimeError("libfaketime is missing: install Debian's faketime package (deploy/install.sh does)")
    return {"LD_PRELOAD": libraries[0], "FAKETIME": f"{offset_s:+d}s", "FAKETIME_NO_CACHE": "1"}


@dataclass
class ClockSkew:
    """One worker's wall clock is ``SKEW_S`` ahead (its slot started with ``faked_clock_env``), the other's
    right. Injected once a partial closed on the skewed clock is seen on the partials topic.

    The skewed worker must own a partition with data for that: the workload warms every partition up
    before the stream (``LiveProducer.warm_up``). Before it did, the skewed worker's partitions were idle
    until the stream began, so its wall clock closed their windows ten minutes ahead: every event of
    them was late and no partial of its ever carried data."""

    name: str = "worker clock 10 minutes ahead"
    kind: str = "worker clock 10 minutes ahead"

    def inject(self, ctx: RunContext) -> None:
        from stream_dp.worker.partials.wire import PartialAggregate, WireFormatError
        from stream_dp.worker.release.intake import PartialsReader

        def skewed_partial() -> bool:
            now_ms = time.time() * 1000
            reader = PartialsReader()
            for record in read_topic(ctx.bootstrap, ctx.partials_topic):
                try:
                    message = reader.read(record.partition, record.offset, record.value)
                except WireFormatError:
                    continue
                if isinstance(message, PartialAggregate) and message.closed_at_ms > now_ms + SKEW_S * 500:
                    return True
            return False

        seen = wait_until(skewed_partial, ctx.stream.duration_s + 60, 2.0)
        if seen:
            ctx.injected(f"a worker closed windows on a clock {SKEW_S}s ahead")
        ctx.expect(self.kind, "a partial closed on the skewed clock reached the partials topic", seen)


@dataclass
class RedisAndWorkerKilled:
    """``kill -9`` of Redis (running ``appendfsync everysec``) and of a worker at the same moment; Redis
    restarts on its data, then the worker. The workers must have warned that Redis may forget acknowledged
    charges, and (the common checks) nothing may be released twice nor anybody be over a limit."""

    name: str = "redis (appendfsync everysec) and a worker killed together"
    kind: str = "redis (appendfsync everysec) and a worker kill -9 together"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(3.0, ctx.stream.duration_s - 5.0))
        worker = ctx.pick_worker()
        was_running = ctx.redis.running
        ctx.redis.stop(crash=True)
        if ctx.kill(worker, "together with Redis") and was_running:
            ctx.injected(f"kill -9 of Redis and {worker.name}")
        time.sleep(ctx.uniform(2.0, 5.0))
        ctx.redis.start()
        ctx.note("redis back")
        time.sleep(ctx.uniform(0.5, 2.0))
        before = ctx.restart(worker)
        ctx.expect(self.kind, f"{worker.name} restarted and rejoined the group", ctx.rejoined(worker, before))

    def verify(self, ctx: RunContext, pages: list[str], report: CheckReport) -> None:
        ctx.expect(self.kind, "the workers warned that Redis may forget acknowledged charges (everysec)",
                   any("appendfsync is everysec" in w.log_text() for w in ctx.workers))
