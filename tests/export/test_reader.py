"""OutputReader on the real broker: it starts a little before each partition's end, never creates a topic,
and picks up an output topic created after it started."""

from __future__ import annotations

import time

import orjson
import pytest

from stream_dp.export.reader import OutputReader

pytestmark = pytest.mark.services


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for value in values:
        producer.send(topic, value=value, partition=partition)
    producer.flush()
    producer.close()


def _topics(bootstrap: str) -> set[str]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="stream-dp-tests")
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _read(reader: OutputReader, wanted: int, timeout_s: float = 20) -> list:
    taken: list = []
    deadline = time.monotonic() + timeout_s
    while len(taken) < wanted and time.monotonic() < deadline:
        reader.poll(taken.extend, timeout_ms=200)
    return taken


def test_it_reads_the_last_records_of_each_partition_then_follows(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    _produce(kafka_bootstrap, topic, [orjson.dumps({"n": i}) for i in range(10)], partition=0)
    _produce(kafka_bootstrap, topic, [orjson.dumps({"n": 100 + i}) for i in range(2)] + [b"not json"], partition=1)
    reader = OutputReader({"bootstrap_servers": kafka_bootstrap}, [topic], lookback=3)
    try:
        first = _read(reader, 6)
        assert sorted(first, key=str) == sorted([{"n": 7}, {"n": 8}, {"n": 9}, {"n": 100}, {"n": 101}, None], key=str)
        _produce(kafka_bootstrap, topic, [orjson.dumps({"n": 10})], partition=0)
        assert _read(reader, 1) == [{"n": 10}]
    finally:
        reader.close()


def test_a_missing_topic_is_not_created_and_is_read_once_it_exists(kafka_bootstrap, new_topic, unique_name):
    missing = f"{unique_name}-later"
    reader = OutputReader({"bootstrap_servers": kafka_bootstrap}, [missing], lookback=10)
    try:
        assert _read(reader, 1, timeout_s=2) == []
        assert missing not in _topics(kafka_bootstrap)
        topic = new_topic("later")
        assert topic == missing
        _produce(kafka_bootstrap, topic, [orjson.dumps({"n": 1})])
        assert _read(reader, 1) == [{"n": 1}]  # looked for again every few seconds
    finally:
        reader.close()
