"""The real broker answers both Python clients the worker may use."""

from __future__ import annotations

import asyncio

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata


def test_kafka_python_round_trip_with_group_commit(kafka_bootstrap, new_topic, unique_name):
    topic = new_topic(partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = {f"user-{i}".encode(): f'{{"n": {i}}}'.encode() for i in range(30)}
    for key, value in sent.items():
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()

    group = f"{unique_name}-group"
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    received = {}
    for _ in range(60):
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                received[record.key] = record.value
        if len(received) == len(sent):
            break
    assert received == sent
    positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
    consumer.commit({tp: OffsetAndMetadata(pos, '{"closed_through_ms": 1}', -1) for tp, pos in positions.items()})
    consumer.close()

    # A new member of the same group resumes from the committed offsets, and the
    # commit metadata (where the worker keeps its window progress) round-trips.
    checker = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    committed = {tp: checker.committed(tp, metadata=True) for tp in positions}
    checker.close()
    assert sum(c.offset for c in committed.values()) == len(sent)
    assert all(c.metadata == '{"closed_through_ms": 1}' for c in committed.values())
    assert set(positions) == {TopicPartition(topic, p) for p in range(3)}


def test_aiokafka_round_trip_with_group_commit(kafka_bootstrap, new_topic, unique_name):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = new_topic(partitions=2)
    group = f"{unique_name}-group"

    async def scenario() -> tuple[list[bytes], int]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for i in range(20):
                await producer.send(topic, key=str(i).encode(), value=f"v{i}".encode())
            await producer.flush()
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            for _ in range(40):
                batches = await consumer.getmany(timeout_ms=500)
                values += [r.value for records in batches.values() for r in records]
                if len(values) == 20:
                    break
            await consumer.commit()
            committed = 0
            for tp in consumer.assignment():
                committed += await consumer.committed(tp) or 0
        finally:
            await consumer.stop()
        return values, committed

    values, committed = asyncio.run(scenario())
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(20))
    assert committed == 20
