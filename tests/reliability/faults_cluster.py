"""Faults of a 3-broker cluster: the leader of a partition killed (``kill -9``) while the others serve.

The topics of a cluster run are replicated three times with
``min.insync.replicas=2`` and every producer uses ``acks=all`` with
idempotence, so losing one broker must lose nothing: its partitions elect a
new leader from the in-sync replicas and clients follow it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tests.reliability.faults_topics import _hold_claims, _release_claims
from tests.reliability.harness import RunContext
from tests.reliability.topics import wait_until

ROLES = ("partials", "output", "input")


@dataclass
class LeaderKilled:
    """``kill -9`` of the broker leading a partition, restarted some seconds later: of the partials or
    output topic while a worker holds a release-ledger claim (mid-release), or of an input partition
    mid-window."""

    role: str = "partials"
    name: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not self.name:
            when = "mid-window" if self.role == "input" else "mid-release"
            self.name = f"leader of an {self.role} partition killed {when} (3 brokers)"

    @property
    def kind(self) -> str:
        return f"leader of an {self.role} partition kill -9"

    def inject(self, ctx: RunContext) -> None:
        cluster = ctx.kafka
        if cluster is None or not hasattr(cluster, "kill_node"):
            raise RuntimeError("a leader kill needs the run on a broker cluster (FaultRun(kafka=PrivateKafkaCluster))")
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s / 2))
        if self.role == "input":
            topic, partition = ctx.input_topic, int(ctx.rng.integers(0, ctx.stream.partitions))
            killed = _kill_leader(ctx, cluster, topic, partition)
        else:
            topic, partition = ctx.partials_topic if self.role == "partials" else sorted(ctx.output_topics.values())[0], 0
            held = _hold_claims(ctx, 60)
            try:
                killed = _kill_leader(ctx, cluster, topic, partition) if held else None
            finally:
                _release_claims(ctx)
            if killed is None:
                ctx.note("no worker reached a ledger claim within 60s; no broker was killed")
                return
        # Expected: the partition elected another leader from its in-sync replicas while the broker was down.
        moved = wait_until(lambda: _leader_or_none(cluster, topic, partition) not in (None, killed), 30, 0.5)
        ctx.expect(self.kind, f"{topic}[{partition}] elected a new leader while broker {killed} was down", moved)
        seconds = ctx.uniform(4.0, 8.0)
        time.sleep(seconds)
        cluster.start_node(killed)
        ctx.note(f"broker {killed} back after {seconds:.1f}s")


def _leader_or_none(cluster, topic: str, partition: int) -> int | None:
    try:
        return cluster.leader_of(topic, partition)
    except Exception:  # metadata not answered while the cluster elects: ask again
        return None


def _kill_leader(ctx: RunContext, cluster, topic: str, partition: int) -> int:
    leader = cluster.leader_of(topic, partition)
    cluster.kill_node(leader)
    ctx.injected(f"broker {leader}, leader of {topic}[{partition}], killed (kill -9)")
    return leader
