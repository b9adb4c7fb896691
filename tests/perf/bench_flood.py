"""How fast a worker skips a flood of invalid 60 KiB messages, next to how fast the broker takes them in.

    .venv/bin/python tests/perf/bench_flood.py [--messages 6000] [--repeat 3] [--kinds invalid_json,oversize]
                                               [--ab DIR]

A flooding unit sends messages that are not events as fast as a client sends them; the worker
reading its partition must get through them, or the windows of that partition wait
(``docs/privacy/partitions.md``). Each round, per kind of flood:

* **broker ingest**: ``--messages`` messages of 60 KiB (ASCII that is not JSON), keyed by one
  unit, produced to a fresh topic of one partition (``LogAppendTime``) with confluent-kafka,
  ``acks=all``, as fast as the broker acknowledges them: MB/s from the first send to the last
  acknowledgement. This is the most a flood can put into one partition here.
* **worker skip**: one ``stream-dp run`` worker reading that topic from the beginning (a count
  query; ``invalid_json``: the default ``max_message_bytes`` of 64 KiB, so every message is
  decoded and refused; ``oversize``: ``max_message_bytes: 4096``, so every message is refused by
  its length): MB/s from the worker's input assignment (its log) to the scrape at which its
  ``stream_dp_events_total`` reached the flood's count (scraped every 50 ms).
* **dead-letter bytes**: the bytes of the records the worker wrote to its dead-letter topic
  (values and headers), per message and as a share of the flood.

A worker keeps up with a flood when its skip rate exceeds what the broker takes in; else the
windows of the flooded partition wait, by the flood's size over the difference of the rates.
With ``--ab DIR`` each round also runs the worker from the copy of ``stream_dp`` in DIR (e.g.
an older commit) on the same topic. Numbers only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit  # noqa: E402
import watch  # noqa: E402

MESSAGE_BYTES = 60 * 1024
KINDS = {"invalid_json": 65_536, "oversize": 4_096}  # the query's max_message_bytes
UNIT = "flooder"


def produce_flood(bootstrap: str, topic: str, messages: int) -> float:
    """Seconds the broker took to acknowledge ``messages`` flood messages, sent as fast as it takes them."""
    from confluent_kafka import Producer

    value = os.urandom(MESSAGE_BYTES // 2).hex().encode()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 3,
                         "partitioner": "murmur2_random"})
    started = time.perf_counter()
    for _ in range(messages):
        while True:
            try:
                producer.produce(topic, key=UNIT.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError(f"the flood to {topic} was not acknowledged within 300 s")
    return time.perf_counter() - started


def dead_letter_bytes(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records, bytes of values and headers) of a dead-letter topic."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": perfkit.unique_name("dlq"),
                         "enable.auto.commit": False, "log_level": 3})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        consumer.assign(parts)
        records = size = 0
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 120
        while len(done) < len(ends) and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error() is not None:
                    continue
                records += 1
                size += len(message.value() or b"") + sum(len(k) + len(v or b"") for k, v in message.headers() or [])
                if message.offset() + 1 >= ends[message.partition()]:
                    done.add(message.partition())
        return records, size
    finally:
        consumer.close()


def run_worker(services: perfkit.Services, topic: str, kind: str, messages: int, workdir: Path,
               pythonpath: Path | None) -> dict[str, Any]:
    name = perfkit.unique_name(kind[:4])
    config = perfkit.worker_config(name, topic, groups=1, idle_timeout="10s")
    query = config["queries"][0]
    query.update(max_message_bytes=KINDS[kind], timestamp_format="auto",
                 aggregations={"count": {}}, bounds={"max_groups_per_unit": 1, "max_events_per_group": 1})
    path = perfkit.write_config(workdir / f"{name}.yaml", config)
    port = perfkit.free_port()
    worker = perfkit.WorkerProcess(path, services=services, group_id=f"{name}-g", internal_prefix=f"{name}.",
                                   metrics_port=port, log_path=workdir / f"{name}.log", pythonpath=pythonpath)
    poller = watch.Poller([port], interval_s=0.05, pid=worker.pid).start()
    try:
        done = poller.wait_consumed(messages, timeout_s=900, quiet_s=1.0)
        if done is None:
            raise RuntimeError(f"the worker did not get through the flood in 900 s:\n{worker.log_tail()}")
        assigned = watch.first_assignment_wall(worker.log_text())
        if assigned is None:
            raise RuntimeError(f"the worker log does not say when its partition was assigned:\n{worker.log_tail()}")
        # the poller's samples are monotonic; the log's assignment is wall time: convert through now
        done_wall = time.time() - (time.monotonic() - done)
        seconds = done_wall - assigned
        cpu = poller.cpu_at(done_wall) - poller.cpu_at(assigned)
        text = watch.scrape(port)
        rejected = {reason: watch.metric_sum(text, "stream_dp_events_rejected_total", reason=reason)
                    for reason in ("invalid_json", "oversize")}
    finally:
        poller.stop()
        worker.stop()
    letters, letter_bytes = dead_letter_bytes(services.bootstrap, f"{name}.dead-letter")
    perfkit.delete_topics(services.bootstrap, f"{name}")
    perfkit.delete_groups(services.bootstrap, [f"{name}-g", f"{name}-g-release"])
    perfkit.cleanup_redis(services.redis_url, name, name)
    return {"seconds": seconds, "mb_per_s": messages * MESSAGE_BYTES / seconds / 1e6, "cpu_s": cpu,
            "rejected": rejected, "dead_letters": letters, "dead_letter_bytes": letter_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=6_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--ab", type=Path, default=None, help="also run the worker from the stream_dp in this directory")
    args = parser.parse_args(argv)
    services = perfkit.Services.from_env()
    services.check()
    kinds = [k for k in args.kinds.split(",") if k]
    flood_mb = args.messages * MESSAGE_BYTES / 1e6
    print(f"flood: {args.messages} messages of {MESSAGE_BYTES} bytes ({flood_mb:.0f} MB) per run; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        for round_ in range(args.repeat):
            for kind in kinds:
                topic = perfkit.unique_name("flood")
                from confluent_kafka.admin import NewTopic

                client = perfkit.admin(services.bootstrap)
                client.create_topics([NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})])[
                    topic].result(timeout=30)
                try:
                    ingest_s = produce_flood(services.bootstrap, topic, args.messages)
                    results.setdefault("broker ingest", []).append({"mb_per_s": flood_mb / ingest_s})
                    runs = [("worker", None)] + ([("worker (--ab)", args.ab)] if args.ab else [])
                    for label, path in runs:
                        run = run_worker(services, topic, kind, args.messages, Path(tmp), path)
                        results.setdefault(f"{label}, {kind}", []).append(run)
                        print(f"round {round_ + 1} {label:14} {kind:12} broker {flood_mb / ingest_s:7.1f} MB/s, "
                              f"worker {run['mb_per_s']:7.1f} MB/s ({run['seconds']:.1f} s, {run['cpu_s']:.1f} CPU-s), "
                              f"rejected {run['rejected']}, dead letters {run['dead_letters']} "
                              f"({run['dead_letter_bytes'] / run['dead_letters'] if run['dead_letters'] else 0:.0f} "
                              f"bytes each, {run['dead_letter_bytes'] / (args.messages * MESSAGE_BYTES):.3f} of the "
                              "flood)", flush=True)
                finally:
                    perfkit.delete_topics(services.bootstrap, topic)
    print("\nMB/s, min / median / max")
    for label, runs in results.items():
        summary = perfkit.summarize([r["mb_per_s"] for r in runs])
        print(f"  {label:32} {summary['min']:8.1f} / {summary['median']:8.1f} / {summary['max']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
