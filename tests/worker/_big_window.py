"""Helpers of the big-window end-to-end tests: the workload, fast producing, workers, reading results.

The workload is one one-minute window of ``GROUPS`` groups: every
``POPULAR_EVERY``-th group has ``POPULAR_UNITS`` units, every other group one.
With ``max_groups_per_unit: 1`` each unit is one event in one group. The query
selects groups (epsilon 10: half for selection, scale 0.2, threshold 4), so a
popular group is kept unless its noise is <= -3 (probability 3.0e-7 each) and
a group of one unit is kept only if its noise is >= 3 (the same 3.0e-7 each,
0.3 expected among 960,000): the released set is about the popular groups.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml

from tests.redis_databases import delete_matching
from tests.worker._support import BACKFILL

GROUPS = 1_000_000
POPULAR_EVERY = 25
POPULAR_UNITS = 6
WINDOW_MS = 60_000
SECRET = "test-secret-0123456789abcdef"
LEDGER_PREFIX = "stream-dp:ledger"  # the worker's default
#: Run the workers from another source tree (e.g. an older version, to see this test fail there).
WORKER_PYTHONPATH = os.environ.get("STREAM_DP_TEST_WORKER_PYTHONPATH")


def popular(group: int) -> bool:
    return group % POPULAR_EVERY == 0


def group_name(group: int) -> str:
    """A page-like name that compresses as real ones do (sequential names would shrink to nothing)."""
    return "/p/" + hashlib.blake2b(group.to_bytes(4, "little"), digest_size=6).hexdigest()


def events(window_start_ms: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """(keys, values, record timestamps) of the workload: ``GROUPS`` groups in one window."""
    slots = [g for g in range(GROUPS)] + [g for g in range(0, GROUPS, POPULAR_EVERY) for _ in range(POPULAR_UNITS - 1)]
    span = WINDOW_MS - 1_000
    timestamps = [window_start_ms + (i * 7919) % span for i in range(len(slots))]
    keys = [f"u{i}".encode() for i in range(len(slots))]
    names = [group_name(g).encode() for g in range(GROUPS)]
    values = [b'{"user_id":"u%d","ts":%d,"g":"%s"}' % (i, ts, names[g]) for i, (g, ts) in enumerate(zip(slots, timestamps))]
    return keys, values, timestamps


def produce(bootstrap: str, topic: str, window_start_ms: int) -> int:
    """Publish the workload keyed by unit, with Kafka's murmur2 partitioner (librdkafka's
    ``murmur2_random``), each record stamped with its event time (a backfill). Returns the event count."""
    from confluent_kafka import Producer

    keys, values, timestamps = events(window_start_ms)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "partitioner": "murmur2_random",
                         "compression.type": "lz4", "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000})
    errors: list[str] = []

    def delivered(err: Any, _message: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value, ts in zip(keys, values, timestamps):
        while True:
            try:
                producer.produce(topic, key=key, value=value, timestamp=ts, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    assert not left and not errors, f"{left} events undelivered, errors: {errors[:3]}"
    return len(values)


def write_config(path: Path, name: str, input_topic: str, output_topic: str) -> Path:
    path.write_text(yaml.safe_dump({
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0, "delta": 1e-3}]}},
        "queries": [{
            "name": name, "input_topic": input_topic, "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "1m", "allowed_lateness": "1s", "idle_timeout": "2s"},
            "group_by": ["g"], "groups": {"select": {"delta": 1e-6}},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "epsilon": 10.0, "release_timeout": "150s",
            **BACKFILL,  # ``produce`` stamps the window's records with its events' times (on a CreateTime topic)
        }],
    }))
    return path


@dataclass
class Workers:
    processes: list[subprocess.Popen]
    ports: list[int]
    logs: list[Path]

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def peak_rss_mb(self) -> list[float]:
        peaks = []
        for process in self.processes:
            status = Path(f"/proc/{process.pid}/status").read_text()
            kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
            peaks.append(kb / 1024)
        return peaks

    def log_text(self, tail: int | None = 4000) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-(tail or 0):]}" for path in self.logs)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_workers(tmp_path: Path, config: Path, env: dict[str, str], ports: list[int]) -> Workers:
    if WORKER_PYTHONPATH:
        env = dict(env, PYTHONPATH=WORKER_PYTHONPATH)
    processes, logs = [], []
    for i, port in enumerate(ports):
        log = tmp_path / f"worker{i}.log"
        logs.append(log)
        with open(log, "wb") as out:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config)],
                env=dict(env, STREAM_DP_METRICS_PORT=str(port)), stdout=subprocess.DEVNULL, stderr=out,
                cwd=WORKER_PYTHONPATH,  # `python -m` puts the working directory first on the path
            ))
    return Workers(processes, ports, logs)


def wait_published(client: redis.Redis, query: str, window_start_ms: int, workers: Workers, timeout_s: float) -> None:
    """Until the window's ledger entry says published; fails at once when a worker exits."""
    key = f"{LEDGER_PREFIX}:{{{query}}}:{window_start_ms}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert workers.alive(), f"a worker exited:\n{workers.log_text()}"
        if client.hget(key, "state") == b"published":
            return
        time.sleep(0.5)
    raise AssertionError(f"window {window_start_ms} not published in {timeout_s} s:\n{workers.log_text()}")


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 120) -> list[Any]:
    """Every record of ``topic`` up to its end now (librdkafka consumer, no group commits)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in metadata.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        remaining = {p: end for p, end in ends.items() if end > 0}
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error():
                    continue
                records.append(message)
                if message.offset() + 1 >= remaining.get(message.partition(), 0):
                    remaining.pop(message.partition(), None)
        assert not remaining, f"{topic}: partitions {sorted(remaining)} not read to their end in {timeout_s} s"
        return records
    finally:
        consumer.close()


def released_groups(records: list[Any]) -> list[tuple[str, int, int]]:
    """(group, window start, count) of each release record."""
    out = []
    for message in records:
        record = orjson.loads(message.value())
        out.append((record["group"]["g"], record["window"]["start_ms"], record["count"]))
    return out


def delete_redis_keys(client: redis.Redis, *patterns: str) -> None:
    delete_matching(client, *patterns)
