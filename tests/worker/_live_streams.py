"""Live streams through real worker processes, for the tests of lagging and growing input partitions.

A ``Deployment`` is one stream's input topic (created as the README tells users to: the broker's
``LogAppendTime``), its worker processes (one consumer group, their own internal topics and
budget namespace) and its releases. Events are produced live, stamped by the broker, so the
window clock runs as it does in production.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from tests.reliability.topics import _kafka, create_topic, delete_topics, kafka_partition
from tests.reliability.workers import WorkerProcess, metric_total

SECRET = "live-secret-0123456789abcdef"
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def units_on(partition: int, partitions: int, count: int, prefix: str) -> list[str]:
    """``count`` unit ids that the default (murmur2) partitioner puts on ``partition`` of ``partitions``."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        unit = f"{prefix}{i}"
        if kafka_partition(unit, partitions) == partition:
            out.append(unit)
        i += 1
    return out


def event(unit: str, ts_ms: int, page: str = "a") -> bytes:
    return orjson.dumps({"user_id": unit, "ts": ts_ms, "page": page})


def count_query(name: str, topic: str, output: str, namespace: str, **settings) -> dict:
    """A count per page over public pages ["a"], one event per unit and window counted, epsilon 10."""
    query = {
        "name": name, "input_topic": topic, "output_topic": output,
        "privacy_unit": {"namespace": namespace, "field": "user_id"},
        "timestamp_field": "ts",
        "window": {"size": "10s", "allowed_lateness": "1s", "idle_timeout": "3s"},
        "group_by": ["page"], "groups": {"public": ["a"]},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}},
        "epsilon": 10.0, "release_timeout": "10s",
    }
    query.update(settings)
    return query


@dataclass
class Deployment:
    """One stream: an input topic, ``workers`` worker processes of one group, and the releases read back."""

    label: str
    work_dir: Path
    bootstrap: str
    redis_url: str
    partitions: int
    workers_count: int
    query_settings: dict = field(default_factory=dict)
    env_extra: dict = field(default_factory=dict)
    run: str = field(default_factory=lambda: f"lv{uuid.uuid4().hex[:8]}")
    workers: list[WorkerProcess] = field(default_factory=list)
    releases: dict[int, dict] = field(default_factory=dict)  # window start -> release record

    @property
    def topic(self) -> str:
        return f"{self.run}-in"

    @property
    def output(self) -> str:
        return f"{self.run}-out"

    @property
    def query(self) -> str:
        return f"{self.run}_count"

    @property
    def prefix(self) -> str:
        return f"{self.run}."

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        create_topic(self.bootstrap, self.topic, self.partitions, LOG_APPEND_TIME)
        namespace = f"{self.run}-users"
        config = {
            "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 4_000.0}]}},
            "queries": [count_query(self.query, self.topic, self.output, namespace, **self.query_settings)],
        }
        config_path = self.work_dir / "queries.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
        env.update(KAFKA_BOOTSTRAP_SERVERS=self.bootstrap, REDIS_URL=self.redis_url,
                   STREAM_DP_GROUP_ID=f"{self.run}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=self.prefix,
                   STREAM_DP_CONTRIBUTION_SECRET=SECRET, STREAM_DP_OUTPUT_PARTITIONS="1",
                   STREAM_DP_PARTIALS_PARTITIONS="1",
                   # workers share two busy cores here: a starved one must not be rebalanced out mid-test
                   STREAM_DP_CONSUMER_SESSION_TIMEOUT_MS="45000")
        env.update(self.env_extra)
        self.workers = [WorkerProcess(f"{self.label}-worker{i}", config_path, env, self.work_dir)
                        for i in range(self.workers_count)]
        for worker in self.workers:
            worker.start()

    def assignments(self) -> list[set[str]]:
        """Each worker's input partitions, from the last assignment it logged."""
        out = []
        for worker in self.workers:
            lines = [line for line in worker.log_text().splitlines() if "stream_dp.worker.ingest.stage: assigned" in line]
            out.append(set(re.findall(r"'([^']+)'", lines[-1])) if lines else set())
        return out

    def release_homes(self) -> list[str]:
        """Each worker's release homes, from the last assignment of the release group it logged."""
        out = []
        for worker in self.workers:
            lines = [line for line in worker.log_text().splitlines() if "release homes assigned" in line]
            out.append(lines[-1].split("assigned", 1)[1].strip() if lines else "")
        return out

    def release_home(self) -> WorkerProcess:
        """The worker that releases partials partition 0, as the release group last assigned it."""
        return next(w for w, homes in zip(self.workers, self.release_homes()) if homes == "[0]")

    def wait_assigned(self, partitions: int | None = None, timeout_s: float = 180.0, settled_s: float = 3.0) -> None:
        """Until the workers own all ``partitions`` (default: the topic's) together, each once, every worker
        joined both groups, exactly one of them owns the release home, and neither assignment changed for
        ``settled_s``. (A test that picks a worker by its role must not pick it mid-rebalance: the release
        group can move the home after the input group settled.)"""
        wanted = {f"{self.topic}[{p}]" for p in range(partitions or self.partitions)}
        deadline = time.monotonic() + timeout_s
        state, since = None, time.monotonic()
        while time.monotonic() < deadline:
            self.check_workers()
            owned = self.assignments()
            homes = self.release_homes()
            settled = (set().union(*owned) == wanted and sum(map(len, owned)) == len(wanted)
                       and all("ingest.stage: assigned" in w.log_text() for w in self.workers)
                       and all(homes) and homes.count("[0]") == 1)
            current = (tuple(map(frozenset, owned)), tuple(homes))
            if current != state:
                state, since = current, time.monotonic()
            elif settled and time.monotonic() - since >= settled_s:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{self.label}: the workers did not settle on {sorted(wanted)}:\n{self.log_tails()}")

    def owner_of(self, partition: int) -> WorkerProcess:
        name = f"{self.topic}[{partition}]"
        for worker, owned in zip(self.workers, self.assignments()):
            if name in owned:
                return worker
        raise RuntimeError(f"{self.label}: nobody owns {name}")

    def collect(self, windows: Iterable[int], timeout_s: float) -> None:
        """Read the output topic until each of ``windows`` (start times) has a release or ``timeout_s`` passes."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        wanted = set(windows)
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
                             "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(self.output, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + timeout_s
            while not wanted <= self.releases.keys() and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=10_000, timeout=0.5):
                    if message.error() is None:
                        record = orjson.loads(message.value())
                        self.releases.setdefault(record["window"]["start_ms"], record)
                self.check_workers()
        finally:
            consumer.close()

    def metric(self, name: str, **labels: str) -> float:
        return sum(metric_total(w.scrape() or "", name, **labels) for w in self.workers)

    def check_workers(self) -> None:
        for worker in self.workers:
            code = worker.reap()
            if code is not None:
                raise RuntimeError(f"{self.label}: {worker.name} exited with {code}:\n{worker.log_text()[-3000:]}")

    def log_tails(self, chars: int = 2500) -> str:
        return "\n".join(f"--- {w.name}\n{w.log_text()[-chars:]}" for w in self.workers)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop(timeout_s=20)
        delete_topics(self.bootstrap, [self.topic, self.output, *(f"{self.prefix}{t}" for t in
                                                                  ("partials", "dead-letter", "alerts"))])


def producer(bootstrap: str, **options):
    """A kafka-python producer: the murmur2 partitioner of Kafka's Java client, keyed sends only."""
    return _kafka().KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **options)


def sleep_until(epoch_ms: int) -> None:
    delay = epoch_ms / 1000 - time.time()
    if delay > 0:
        time.sleep(delay)
