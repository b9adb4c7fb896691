"""The seeded runs of the full suite (``run_faults.py``) and of the CI subset (``test_faults.py``).

A run is a fault, a seed and what it runs on: how many workers, input
partitions and how long a stream, the Redis fsync policy, extra worker
environment. Every fault kind appears in both; the full suite repeats each
kind under several seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tests.reliability.faults import (
    AddWorker,
    BrokerOutage,
    EveryStage,
    KillAll,
    KillAtStep,
    KillDuringIngest,
    KillWhileHeld,
    RedisOutage,
    RemoveWorker,
    Sequence,
    Together,
)
from tests.reliability.faults_cluster import LeaderKilled
from tests.reliability.faults_network import (
    BrokerDiskFull,
    BrokerPartition,
    RedisClusterFailover,
    RedisPartition,
    RedisWiped,
)
from tests.reliability.faults_hosts import ClockSkew, RedisAndWorkerKilled, faked_clock_env
from tests.reliability.faults_topics import BrokerStopAtClaim, OutputTopicDeleted, PoisonPartials
from tests.reliability.workload import StreamSpec


@dataclass(frozen=True)
class PlannedRun:
    kind: str  # the row of the README's table of runs per kind
    fault: object
    seed: int
    workers: int = 2
    partitions: int = 3
    redis_fsync: str = "always"
    skewed_worker: bool = False
    duration_s: float = 14.0
    redis_cluster: bool = False  # on a Redis Cluster of its own (3 masters, 3 replicas; no fault proxies)
    gaussian: bool = False  # more queries: Gaussian on two horizons, selected groups, top_k, continual (``workload``)

    def options(self) -> dict:
        # After a broker comes back (or a leader moves) producers take a few seconds to deliver what they
        # buffered; the worker's idle rule must wait longer than that (README), on a loaded machine too.
        idle_ms = 8_000 if self.needs_private_broker or self.needs_cluster or self.needs_small_disk \
            else StreamSpec.idle_ms
        stream = StreamSpec(seed=self.seed, partitions=self.partitions, duration_s=self.duration_s, idle_ms=idle_ms,
                            gaussian=self.gaussian, selected=self.gaussian, top_k=self.gaussian,
                            continual=self.gaussian)
        return dict(workers=self.workers, stream=stream, redis_fsync=self.redis_fsync, redis_cluster=self.redis_cluster,
                    worker_env={1: faked_clock_env()} if self.skewed_worker else {})

    @property
    def needs_private_broker(self) -> bool:
        return not self.needs_small_disk and any(
            isinstance(p, (BrokerOutage, BrokerStopAtClaim, BrokerPartition)) for p in self._parts)

    @property
    def needs_small_disk(self) -> bool:
        """Runs on a broker of its own whose log directory is a small filesystem (``SmallDiskKafka``)."""
        return any(isinstance(p, BrokerDiskFull) for p in self._parts)

    @property
    def needs_cluster(self) -> bool:
        """Runs on a 3-broker cluster of its own (``PrivateKafkaCluster``)."""
        return any(isinstance(p, LeaderKilled) for p in self._parts)

    @property
    def _parts(self) -> list:
        from tests.reliability.harness import leaf_faults

        return leaf_faults(self.fault)

    @property
    def kinds(self) -> set[str]:
        """The kinds of fault this run injects (``Fault.kind`` of every part)."""
        return {part.kind for part in self._parts}


def _stages() -> list[tuple[str, object]]:
    return [
        ("kill during ingestion", KillDuringIngest()),
        ("kill before charge", KillAtStep("charge", forward=False)),
        ("kill after charge", KillAtStep("charge", forward=True)),
        ("kill in combine", KillAtStep("claim", forward=False, name="kill -9 in combine (noise drawn, ledger not written)")),
        ("kill between ledger and publish", KillAtStep("claim", forward=True, name="kill -9 between ledger write and publish")),
        ("kill between publish and mark", KillAtStep("mark", forward=False, name="kill -9 between publish and mark-published")),
    ]


def _kinds() -> list[PlannedRun]:
    """One run of every kind, seeds 1xx; ``full_catalogue`` repeats them with other seeds."""
    runs = [PlannedRun(kind, fault, 100 + i) for i, (kind, fault) in enumerate(_stages())]
    runs += [
        PlannedRun("redis down", RedisOutage(crash=True), 110),
        PlannedRun("redis down", RedisOutage(crash=False), 111),
        PlannedRun("broker down", BrokerOutage(crash=False), 120),
        PlannedRun("broker down", BrokerOutage(crash=True), 121),
        PlannedRun("broker down between claim and publish", BrokerStopAtClaim(), 122),
        PlannedRun("rebalance", AddWorker(), 130),
        PlannedRun("rebalance", RemoveWorker(), 131),
        PlannedRun("rebalance", RemoveWorker(rejoin=True), 132),
        PlannedRun("rebalance, 12 partitions", Together((KillDuringIngest(), AddWorker())), 133, workers=3, partitions=12),
        PlannedRun("kill all", KillAll(), 140),
        PlannedRun("combined", Together((RedisOutage(crash=True), KillAtStep("claim", forward=True))), 150),
        PlannedRun("combined", KillWhileHeld(), 151),
        PlannedRun("combined", KillWhileHeld(leave=True), 152),
        PlannedRun("poison partials", PoisonPartials(), 160),
        PlannedRun("output topic deleted", OutputTopicDeleted(), 170),
        PlannedRun("clock skew", ClockSkew(), 180, skewed_worker=True),
        PlannedRun("redis everysec + worker killed", RedisAndWorkerKilled(), 190, redis_fsync="everysec"),
        PlannedRun("3 brokers, leader killed", LeaderKilled("partials"), 195),
        PlannedRun("3 brokers, leader killed", LeaderKilled("output"), 196),
        PlannedRun("3 brokers, leader killed", LeaderKilled("input"), 197),
        PlannedRun("redis restarted without its data", RedisWiped(), 200),
        PlannedRun("network partition worker-redis", RedisPartition(), 210),
        PlannedRun("network partition worker-broker", BrokerPartition(), 220, duration_s=20.0),
        PlannedRun("broker disk full", BrokerDiskFull(), 230),
        PlannedRun("redis cluster failover", RedisClusterFailover(), 240, redis_cluster=True),
        PlannedRun("gaussian, two horizons, selected groups, top-k: kill at every stage", EveryStage(), 250,
                   duration_s=40.0, gaussian=True),
    ]
    return runs


def full_catalogue() -> list[PlannedRun]:
    """Every run of ``_kinds`` under four seeds (1xx to 4xx)."""
    base = _kinds()
    return [replace(r, seed=r.seed + offset) for offset in (0, 100, 200, 300) for r in base]


def ci_catalogue() -> list[PlannedRun]:
    """Runs that together inject every kind of fault of ``_kinds`` (``Fault.kind``, not its class: a Redis
    shutdown is not a Redis ``kill -9``): the worker stages in one run, one after the other; other kinds two
    or three at a time, at once (``Together``) or in turn in a longer stream (``Sequence``).
    ``test_ci_subset_covers_every_kind`` keeps it so."""
    return [
        PlannedRun("worker kill at every stage (laplace, gaussian on two horizons, selected groups, top-k, continual)",
                   EveryStage(), 11,
                   duration_s=40.0, gaussian=True),
        PlannedRun("redis down (kill -9, then shutdown), then cut off",
                   Sequence((RedisOutage(crash=True), RedisOutage(crash=False), RedisPartition())), 15,
                   duration_s=42.0),
        PlannedRun("redis restarted without its data", RedisWiped(), 21),
        PlannedRun("redis cluster failover", RedisClusterFailover(), 23, redis_cluster=True),
        PlannedRun("broker disk full, then the workers cut off the broker",
                   Sequence((BrokerDiskFull(), BrokerPartition())), 22, duration_s=40.0),
        PlannedRun("broker down between claim and publish", BrokerStopAtClaim(), 12),
        PlannedRun("rebalance, 12 partitions (added, removed) + poison partials",
                   Together((KillDuringIngest(), AddWorker(), RemoveWorker(), PoisonPartials())), 13, workers=3,
                   partitions=12),
        PlannedRun("clock skew", ClockSkew(), 14, skewed_worker=True),
        PlannedRun("broker down (kill -9, then stop)",
                   Sequence((BrokerOutage(crash=True), BrokerOutage(crash=False))), 16, duration_s=30.0),
        PlannedRun("kill all + output topic deleted", Together((KillAll(), OutputTopicDeleted())), 17),
        PlannedRun("rebalance (removed, rejoined) + combined (kill while held, then removed while held)",
                   Sequence((Together((RemoveWorker(rejoin=True), KillWhileHeld())), KillWhileHeld(leave=True))), 18,
                   workers=3, duration_s=36.0),
        PlannedRun("redis everysec + worker killed", RedisAndWorkerKilled(), 19, redis_fsync="everysec"),
        PlannedRun("3 brokers, leader of a partials, an output and an input partition killed",
                   Sequence((LeaderKilled("partials"), LeaderKilled("output"), LeaderKilled("input"))), 20,
                   duration_s=45.0),
    ]


