"""Faults of the store and the network under running workers: Redis back without its data, the link to
Redis or to the broker black-holed, the broker's disk full.

Each records the effect its kind must have (``RunContext.expect``); a run
whose fault left no such evidence fails.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

from tests.reliability import effects
from tests.reliability.faults import expect_held_through
from tests.reliability.harness import RunContext
from tests.reliability.topics import wait_until

# What a worker says when the Redis answering lost what the group's progress was charged on
# (``stream_dp.worker.guard.store``).
STORE_LOST = "is not the store this consumer group's progress was made with"


@dataclass
class RedisWiped:
    """Redis killed and started again without its data (its append-only file gone), as a host replaced or
    a volume lost would bring it back. Every worker must stop and say why: charging on the empty store
    would give every unit its whole budget again, and a replayed window fresh noise. The run then judges
    only what must hold whatever happens next (nothing released twice, no noise drawn twice, nothing
    published on the empty store), not that every window was released."""

    name: str = "redis restarted without its data"
    kind: str = "redis restarted without its data"
    stops_workers: bool = True

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(3.0, ctx.stream.duration_s / 2))
        running = [w for w in ctx.workers if w.alive]
        ctx.restart_exited = False  # an operator must look at this: no process manager brings it back blindly
        ctx.redis.stop(crash=True)
        wiped_ms = effects.wall_ms()
        for path in ctx.redis.directory.iterdir():
            if path.name != "redis.log":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        ctx.redis.start()
        ctx.injected("redis restarted without its data")
        stopped = wait_until(lambda: not any(w.alive for w in running), 120, 0.5)
        ctx.expect(self.kind, "every worker stopped", stopped,
                   f"({sum(w.alive for w in running)} of {len(running)} still running)")
        said = [w.name for w in running if STORE_LOST in w.log_text()]
        ctx.expect(self.kind, "each worker said the store lost its data", len(said) == len(running),
                   f"(said by {said} of {[w.name for w in running]})")
        after = effects.published_between(effects.output_records(ctx), wiped_ms + effects.GRACE_MS, 2**62)
        ctx.expect(self.kind, "nothing published on the empty store", after == 0, f"({after} records)")


@dataclass
class RedisPartition:
    """Every worker's link to Redis black-holed (no reply, no reset) for longer than the Redis timeout,
    then healed. Expected: windows held or charges failed closed, nothing published meanwhile, no worker
    exit; afterwards everything released once."""

    name: str = "network partition between the workers and Redis"
    kind: str = "network partition worker-redis"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 8.0))
        proxies = list(ctx.proxies)
        seconds = ctx.uniform(6.0, 10.0)  # the workers' Redis timeout is 2 s (harness)
        for proxy in proxies:
            proxy.partition()
        cut_ms = effects.wall_ms()
        ctx.injected(f"workers cut off Redis for {seconds:.1f}s")
        # The counters say little here: a charge waits out its timeouts and retries inside the store, so a
        # partition of a few seconds may end before any attempt is counted as failed. The topics say it all.
        held, failures = _sample_while(ctx, seconds)
        ended_ms = effects.wall_ms() - ctx.stream.lateness_ms
        healed_ms = effects.wall_ms()
        for proxy in proxies:
            proxy.heal()
        ctx.note(f"partition healed ({held:.0f} window partials seen held, {failures:.0f} charges failed closed)")
        during = effects.published_between(effects.output_records(ctx), cut_ms + effects.GRACE_MS, healed_ms)
        ctx.expect(self.kind, "nothing published while Redis was unreachable", during == 0, f"({during} records)")
        expect_held_through(ctx, self.kind, "Redis", ended_ms, healed_ms)


@dataclass
class BrokerPartition:
    """The workers' link to the broker black-holed for longer than their group session timeout (10 s),
    while the producer still reaches it, then healed. Expected: the windows that closed meanwhile held
    and released after, and the workers back in the group (evicted while cut off, they join again)."""

    name: str = "network partition between the workers and the broker"
    kind: str = "network partition worker-broker"

    def inject(self, ctx: RunContext) -> None:
        proxy = getattr(ctx.kafka, "worker_proxy", None)
        if proxy is None:
            raise RuntimeError("a broker partition needs a private broker with a worker proxy "
                               "(PrivateKafka(worker_proxy=True))")
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 8.0))
        seconds = ctx.uniform(12.0, 16.0)
        offsets = {w.name: w.log_size() for w in ctx.workers}
        proxy.partition()
        ctx.injected(f"workers cut off the broker for {seconds:.1f}s")
        time.sleep(seconds)
        ended_ms = effects.wall_ms() - ctx.stream.lateness_ms
        proxy.heal()
        ctx.note("partition healed")
        expect_held_through(ctx, self.kind, "the broker", ended_ms, effects.wall_ms())
        ctx.expect(self.kind, "the workers joined the group again", all(
            ctx.rejoined(w, offsets[w.name], 60) for w in ctx.workers if w.alive))


@dataclass
class BrokerDiskFull:
    """The broker's log directory (a small filesystem of its own) filled up by another writer: the broker
    can no longer append and stops, as Kafka does when its only log directory fails. The space is then
    freed and the broker started again. Expected: the broker stopped by itself, the windows that closed
    meanwhile held and released after it came back."""

    name: str = "broker disk full"
    kind: str = "broker disk full"

    def inject(self, ctx: RunContext) -> None:
        kafka = ctx.kafka
        if kafka is None or not hasattr(kafka, "fill_disk"):
            raise RuntimeError("a full disk needs the run on a broker of its own on a small filesystem "
                               "(SmallDiskKafka)")
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 8.0))
        kafka.fill_disk()
        ctx.injected("the broker's log directory filled up")
        halted = wait_until(lambda: not kafka.running, 60, 0.5)
        ctx.expect(self.kind, "the broker stopped on its full log directory", halted)
        if not halted:
            kafka.stop(crash=True)
        time.sleep(ctx.uniform(2.0, 5.0))
        ended_ms = effects.wall_ms() - ctx.stream.lateness_ms
        kafka.free_disk()
        kafka.start()
        ctx.note("space freed, broker back")
        expect_held_through(ctx, self.kind, "the broker", ended_ms, effects.wall_ms())


@dataclass
class RedisClusterFailover:
    """A master of the workers' Redis Cluster killed (``kill -9``) while they charge; its replica is promoted,
    and the old master restarted rejoins as the new one's replica. Until it has, the promoted master has no
    replica to acknowledge (``WAIT``) its charges, which therefore fail closed (docs/operations/redis.md).
    Expected: the replica promoted, charges held or failed closed meanwhile; then everything released once,
    every unit charged once."""

    name: str = "redis cluster master killed and failed over"
    kind: str = "redis cluster master kill -9 (failover)"

    def inject(self, ctx: RunContext) -> None:
        cluster = getattr(ctx.redis, "cluster", None)
        if cluster is None:
            raise RuntimeError("a failover needs the run on a Redis Cluster (FaultRun(redis_cluster=True))")
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s / 2))
        masters = cluster.masters()
        victim = masters[int(ctx.rng.integers(0, len(masters)))]
        replica = cluster.replica_of(victim)
        baseline = effects.failed_closed(ctx)
        held = 0.0
        cluster.kill(victim)
        ctx.injected(f"redis cluster master {victim} killed; its replica {replica} should take over")
        promoted = True
        try:
            cluster.wait_promoted(replica, 60)
        except TimeoutError:
            promoted = False
        ctx.expect(self.kind, f"replica {replica} promoted to master", promoted)
        ends = time.monotonic() + ctx.uniform(2.0, 4.0)  # the promoted master charges without a replica
        failures = 0.0
        while time.monotonic() < ends:
            held = max(held, effects.pending_charges(ctx))
            failures = max(failures, effects.failed_closed(ctx) - baseline)
            time.sleep(0.5)
        cluster.restart(victim)
        try:
            cluster.wait_replicated(replica, 60)
            ctx.note(f"{victim} rejoined as the replica of {replica}")
        except TimeoutError:
            ctx.note(f"{victim} did not rejoin as a replica within 60 s")
        ctx.expect(self.kind, "windows held or charges failed closed while the promoted master had no replica",
                   held > 0 or failures > 0, f"({held:.0f} held, {failures:.0f} failed closed)")


def _sample_while(ctx: RunContext, seconds: float) -> tuple[float, float]:
    """The most window partials held, and charge attempts failed closed, seen over ``seconds``."""
    held = failures = 0.0
    baseline = effects.failed_closed(ctx)  # the counter holds earlier faults' failures too
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        held = max(held, effects.pending_charges(ctx))
        failures = max(failures, effects.failed_closed(ctx) - baseline)
        time.sleep(0.5)
    return held, failures

