"""The broker's answers about an input partition around a window's close time, read from the real broker.

A topic stamped by the broker (LogAppendTime) gets records before and after a close time; a
consumer group commits offsets as the ingest stage would. ``BrokerPartitions`` must find the
close offset, the log ends and the committed offsets, and ``release.partition_lag`` judge from them
which partitions may be left out of a window's release.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from stream_dp.worker.release.partition_check import BrokerPartitions, PartitionCheckFailed, committed_by
from tests.worker._support import PRODUCER_STAMPED

pytestmark = pytest.mark.services


async def _produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, value=b"x%d" % i, partition=partition)
    finally:
        await producer.stop()


def test_the_broker_says_which_partitions_hold_nothing_more_for_a_window(kafka_bootstrap, new_topic, unique_name):
    topic = new_topic(partitions=4, configs={"message.timestamp.type": "LogAppendTime"})
    group = f"{unique_name}-g"

    async def scenario():
        # Partition 0: 5 records before the close time, 3 after; partition 1: 4 before, none after;
        # partition 2: never written; partition 3: 2 before, never committed.
        await _produce(kafka_bootstrap, topic, 0, 5)
        await _produce(kafka_bootstrap, topic, 1, 4)
        await _produce(kafka_bootstrap, topic, 3, 2)
        await asyncio.sleep(0.05)
        close_ms = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        await _produce(kafka_bootstrap, topic, 0, 3)
        ingest = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
        offsets = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        await ingest.start()
        await offsets.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(4)]
            ingest.assign(tps[:2])
            check = BrokerPartitions(offsets, committed_by(ingest), timeout_s=20)
            # Committed short of the close offset on 0 (an open window holds offset 3), at the end on 1.
            await ingest.commit({tps[0]: OffsetAndMetadata(3, ""), tps[1]: OffsetAndMetadata(4, "")})
            first = await check.evidence(tps, close_ms)
            await ingest.commit({tps[0]: OffsetAndMetadata(5, "")})  # the open window closed and was published
            second = await check.evidence(tps[:1], close_ms)
            ends = await check.end_offsets(tps)
            return first, second, ends
        finally:
            await ingest.stop()
            await offsets.stop()

    first, second, ends = asyncio.run(scenario())
    by_partition = {tp.partition: e for tp, e in first.items()}
    assert [by_partition[p].close_offset for p in range(4)] == [5, None, None, None]
    assert [by_partition[p].committed for p in range(4)] == [3, 4, None, None]
    assert [(by_partition[p].log_start, by_partition[p].log_end) for p in range(4)] == [(0, 8), (0, 4), (0, 0), (0, 2)]
    assert [by_partition[p].nothing_more for p in range(4)] == [False, True, True, False]
    assert [by_partition[p].records_behind for p in range(4)] == [2, 0, 0, 2]
    (evidence,) = second.values()
    assert evidence.nothing_more and evidence.committed == 5  # the records after the close offset are late
    assert [ends[TopicPartition(topic, p)] for p in range(4)] == [8, 4, 0, 2]


def test_a_broker_that_does_not_answer_fails_the_check(kafka_bootstrap):
    async def scenario():
        offsets = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        await offsets.start()

        async def never(partitions):
            await asyncio.sleep(3600)

        try:
            check = BrokerPartitions(offsets, never, timeout_s=0.2)
            with pytest.raises(PartitionCheckFailed, match="did not answer"):
                await check.evidence([TopicPartition("no-such-topic-anywhere", 0)], 0)
        finally:
            await offsets.stop()

    asyncio.run(scenario())


def test_where_producers_stamp_the_clock_no_close_offset_is_read(kafka_bootstrap, new_topic, unique_name):
    """With trust_producer_timestamps one record stamped at the close time closes nothing, so it shows nothing:
    only a partition read and committed to its end holds nothing more."""
    topic = new_topic(partitions=1, configs=PRODUCER_STAMPED)  # its producers stamp its records
    now_ms = int(time.time() * 1000)

    async def scenario():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            # the broker takes stamps up to an hour ahead of its clock
            await producer.send_and_wait(topic, value=b"ahead", partition=0, timestamp_ms=now_ms + 1_800_000)
            await producer.send_and_wait(topic, value=b"after", partition=0, timestamp_ms=now_ms - 3_600_000)
        finally:
            await producer.stop()
        ingest = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"{unique_name}-g",
                                  enable_auto_commit=False)
        offsets = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        await ingest.start()
        await offsets.start()
        try:
            tp = TopicPartition(topic, 0)
            ingest.assign([tp])
            await ingest.commit({tp: OffsetAndMetadata(1, "")})
            check = BrokerPartitions(offsets, committed_by(ingest), timeout_s=20)
            trusted = (await check.evidence([tp], now_ms + 600_000, broker_stamps=False))[tp]
            broker = (await check.evidence([tp], now_ms + 600_000))[tp]
            return trusted, broker
        finally:
            await ingest.stop()
            await offsets.stop()

    trusted, broker = asyncio.run(scenario())
    assert broker.close_offset == 0 and broker.nothing_more  # taken at its word, the stamp 'closes' at offset 0
    assert trusted.close_offset is None and not trusted.nothing_more and trusted.records_behind == 1


def test_the_home_position_is_where_the_release_consumer_reads_next(kafka_bootstrap, new_topic):
    """Left-out partitions wait until the window's home partition is read up to where it ended after the
    broker's answer: the position is the release consumer's next offset, none for a partition it does not own."""
    from stream_dp.worker.release.waits import home_position

    topic = new_topic(partitions=2)

    async def scenario():
        await _produce(kafka_bootstrap, topic, 0, 3)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            position = home_position(consumer, topic)
            before = await position(0)
            read = 0
            while read < 3:
                read += sum(len(r) for r in (await consumer.getmany(timeout_ms=1_000)).values())
            return before, await position(0), await position(1)
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == (0, 3, None)
