"""Raw consume limit: how fast each Python Kafka client reads a topic, decoding every event's JSON and nothing else.

    .venv/bin/python tests/perf/bench_consume.py [--events 200000] [--repeat 3] [--clients aiokafka,confluent,kafka-python]

Produces a fresh topic (4 partitions, ~70-byte JSON events keyed by unit),
then reads it from the start with each client in a fresh process, ``--repeat``
times, and prints the median events/s, the spread of the repetitions and the
ratio to the fastest client. The rate counts from the first poll, once the
client is connected and assigned every partition (no consumer group), to the
last event: prefetching clients get no head start. (The rate from the first
batch received, as the worker benchmark counts, is kept in the JSON as
``rate_from_first_batch``.) Every client gets the same fetch sizes as the worker's ingest consumer
(8 MB per partition, 64 MB per fetch). The topic is deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit  # noqa: E402

CLIENTS = ("aiokafka", "confluent", "kafka-python")
PARTITION_FETCH_BYTES = 8 * 1024 * 1024
FETCH_BYTES = 64 * 1024 * 1024


class Clock:
    """First-poll, first-batch and completion times of one read; create it just before the first poll."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.first_count = 0
        self.count = 0
        self.done_at: float | None = None

    def add(self, n: int) -> bool:
        if n and self.first_at is None:
            self.first_at, self.first_count = time.perf_counter(), n
        self.count += n
        if self.count >= self.expect and self.done_at is None:
            self.done_at = time.perf_counter()
        return self.done_at is not None

    def result(self, client: str) -> dict[str, Any]:
        assert self.first_at is not None and self.done_at is not None
        return {
            "client": client,
            "events": self.count,
            "rate": self.count / (self.done_at - self.started),
            "rate_from_first_batch": (self.count - self.first_count) / (self.done_at - self.first_at),
            "seconds": self.done_at - self.started,
        }


def read_aiokafka(bootstrap: str, topic: str, expect: int, timeout_s: float) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer

    async def main() -> dict[str, Any]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            max_partition_fetch_bytes=PARTITION_FETCH_BYTES, fetch_max_bytes=FETCH_BYTES,
        )
        await consumer.start()
        clock = Clock(expect)
        loads = orjson.loads
        deadline = time.perf_counter() + timeout_s
        try:
            while time.perf_counter() < deadline:
                batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
                n = 0
                for records in batches.values():
                    for record in records:
                        loads(record.value)
                    n += len(records)
                if clock.add(n):
                    break
        finally:
            await consumer.stop()
        return clock.result("aiokafka")

    return asyncio.run(main())


def read_confluent(bootstrap: str, topic: str, expect: int, timeout_s: float) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": perfkit.unique_name("raw"), "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
        "fetch.max.bytes": FETCH_BYTES, "queued.max.messages.kbytes": 512 * 1024,
    })
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    clock = Clock(expect)
    loads = orjson.loads
    deadline = time.perf_counter() + timeout_s
    try:
        while time.perf_counter() < deadline:
            messages = consumer.consume(num_messages=20_000, timeout=0.2)
            n = 0
            for message in messages:
                if message.error() is None:
                    loads(message.value())
                    n += 1
            if clock.add(n):
                break
    finally:
        consumer.close()
    return clock.result("confluent")


def read_kafka_python(bootstrap: str, topic: str, expect: int, timeout_s: float) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        max_partition_fetch_bytes=PARTITION_FETCH_BYTES, fetch_max_bytes=FETCH_BYTES,
    )
    consumer.partitions_for_topic(topic)  # connect and load metadata before the clock starts
    clock = Clock(expect)
    loads = orjson.loads
    deadline = time.perf_counter() + timeout_s
    try:
        while time.perf_counter() < deadline:
            batches = consumer.poll(timeout_ms=200, max_records=20_000)
            n = 0
            for records in batches.values():
                for record in records:
                    loads(record.value)
                n += len(records)
            if clock.add(n):
                break
    finally:
        consumer.close()
    return clock.result("kafka-python")


READERS = {"aiokafka": read_aiokafka, "confluent": read_confluent, "kafka-python": read_kafka_python}


def run_client(client: str, services: perfkit.Services, topic: str, expect: int, timeout_s: float = 600) -> dict[str, Any]:
    """One read of ``topic`` by ``client`` in a fresh interpreter."""
    completed = subprocess.run(
        [sys.executable, __file__, "--child", client, "--topic", topic, "--expect", str(expect),
         "--bootstrap", services.bootstrap, "--timeout", str(timeout_s)],
        capture_output=True, text=True, timeout=timeout_s + 60,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"{client} read failed (exit {completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(lines[-1])


def measure(services: perfkit.Services, topic: str, expect: int, repeat: int, clients: list[str]) -> dict[str, Any]:
    """``repeat`` rounds, clients interleaved within each round so that load drifts hit all alike."""
    runs: dict[str, list[float]] = {c: [] for c in clients}
    for round_ in range(repeat):
        for client in clients:
            result = run_client(client, services, topic, expect)
            runs[client].append(result["rate"])
            print(f"  raw {client:<13} round {round_ + 1}: {result['rate']:>10,.0f} events/s", flush=True)
    summaries = {c: perfkit.summarize(r) for c, r in runs.items()}
    fastest = max(summaries, key=lambda c: summaries[c]["median"])
    return {"clients": summaries, "fastest": fastest}


def print_table(result: dict[str, Any]) -> None:
    best = result["clients"][result["fastest"]]["median"]
    print(f"{'client':<14} {'events/s (median)':>18} {'spread':>8} {'x fastest':>10}")
    for client, s in sorted(result["clients"].items(), key=lambda kv: -kv[1]["median"]):
        print(f"{client:<14} {s['median']:>18,.0f} {s['spread'] * 100:>7.1f}% {s['median'] / best:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--child", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(READERS[args.child](args.bootstrap, args.topic, args.expect, args.timeout)))
        return

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        parser.error(f"unknown client(s) {unknown}; choose from {', '.join(CLIENTS)}")
    services = perfkit.Services.from_env()
    services.check()
    name = perfkit.unique_name("consume")
    events = perfkit.synthetic_events(args.events, units=args.units, groups=args.groups, windows=10,
                                      partitions=args.partitions, seed=1)
    try:
        perfkit.create_topic(services.bootstrap, name, args.partitions)
        seconds = perfkit.produce(services.bootstrap, name, events)
        print(f"produced {len(events):,} events to {name} in {seconds:.1f} s")
        print_table(measure(services, name, len(events), args.repeat, clients))
    finally:
        perfkit.delete_topics(services.bootstrap, name)


if __name__ == "__main__":
    main()
