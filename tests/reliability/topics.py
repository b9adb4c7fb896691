"""Reading whole topics back, and waiting for records, with kafka-python (blocking)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp: int = -1  # the record's Kafka timestamp, ms


def _kafka():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        import kafka
    return kafka


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 60.0, **options: Any) -> list[TopicRecord]:
    """Every record of ``topic`` up to the end offsets seen when reading starts (empty if it does not exist)."""
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                   auto_offset_reset="earliest", **options)
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return []
        tps = [kafka.TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        records: list[TopicRecord] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end offsets {ends} within {timeout_s:.0f}s")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                for r in batch:
                    if r.offset < ends[tp]:
                        records.append(TopicRecord(tp.partition, r.offset, r.key, r.value,
                                                   {k: v for k, v in (r.headers or [])}, r.timestamp))
        return records
    finally:
        consumer.close()


def kafka_partition(unit: str, partitions: int) -> int:
    """The partition kafka-python's default (murmur2) partitioner gives the key ``unit``."""
    return (_kafka().partitioner.default.murmur2(unit.encode()) & 0x7FFFFFFF) % partitions


def end_offsets(bootstrap: str, topic: str, **options: Any) -> dict[int, int]:
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **options)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [kafka.TopicPartition(topic, p) for p in sorted(partitions)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()} if tps else {}
    finally:
        consumer.close()


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict[str, str] | None = None,
                 replication: int = 1, **options: Any) -> None:
    kafka = _kafka()
    from kafka.admin import NewTopic

    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="stream-dp-reliability", **options)
    try:
        admin.create_topics([NewTopic(name, partitions, replication, topic_configs=configs or {})])
    finally:
        admin.close()


def delete_topics(bootstrap: str, names: list[str], **options: Any) -> None:
    """Housekeeping after a run; failures are ignored (they must not mask a result)."""
    kafka = _kafka()
    try:
        admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="stream-dp-reliability", **options)
    except Exception:
        return
    try:
        existing = set(admin.list_topics())
        doomed = [n for n in names if n in existing]
        if doomed:
            admin.delete_topics(doomed)
    except Exception:
        pass
    finally:
        admin.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
