"""The columnar consumer returns what aiokafka's consumer returns, poll by poll, on the real broker."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from stream_dp.worker.ingest.decode import raw_batch
from stream_dp.worker.kafka.columnar_consumer import ColumnarConsumer, check_compatible
from stream_dp.worker.kafka.record_columns import RecordColumns

pytestmark = pytest.mark.services


def test_the_installed_aiokafka_has_what_the_reader_uses():
    check_compatible()


async def _produce(bootstrap: str, topic: str, *, compression: str | None = None, partitions: int = 2) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=compression, linger_ms=50)
    await producer.start()
    try:
        sends = []
        for i in range(300):
            key = None if i % 17 == 0 and i % 29 else b"key-%d" % i
            value = None if i % 29 == 0 else b'{"n": %d}' % i
            headers = [("h", b"x")] if i % 5 == 0 else []
            sends.append(await producer.send(topic, key=key, value=value, partition=i % partitions,
                                             timestamp_ms=1_700_000_000_000 + i, headers=headers))
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    return 300


async def _read(consumer_type, bootstrap: str, topic: str, *, expect: int, max_records: int, partitions: int = 2,
                start: dict[int, int] | None = None, isolation_level: str = "read_uncommitted"):
    """(partition, offset, timestamp, key, value) per record and the consumer's positions after every poll."""
    consumer = consumer_type(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level=isolation_level)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            if start and tp.partition in start:
                consumer.seek(tp, start[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)
        rows, positions, polls = [], [], 0
        while len(rows) < expect and polls < 200:
            polls += 1
            batches = await consumer.getmany(timeout_ms=500, max_records=max_records)
            for tp, records in sorted(batches.items()):
                if consumer_type is ColumnarConsumer:
                    assert isinstance(records, RecordColumns)
                rows += [(tp.partition, r.offset, r.timestamp, r.key, r.value) for r in records]
            if batches:
                positions.append(sorted([(tp.partition, await consumer.position(tp)) for tp in tps]))
        return rows, positions
    finally:
        await consumer.stop()


def per_partition(rows):
    """Each partition's records in the order read (how partitions interleave depends on fetch timing)."""
    out: dict[int, list] = {}
    for row in rows:
        out.setdefault(row[0], []).append(row)
    return out


@pytest.mark.parametrize("compression", [None, "gzip", "lz4", "zstd"])
@pytest.mark.parametrize("max_records", [7, 100_000])
def test_the_same_records_and_positions_as_aiokafka(kafka_bootstrap, new_topic, compression, max_records):
    topic = new_topic(partitions=2)
    expect = asyncio.run(_produce(kafka_bootstrap, topic, compression=compression))
    ours = asyncio.run(_read(ColumnarConsumer, kafka_bootstrap, topic, expect=expect, max_records=max_records))
    theirs = asyncio.run(_read(AIOKafkaConsumer, kafka_bootstrap, topic, expect=expect, max_records=max_records))
    assert len(ours[0]) == expect
    assert per_partition(ours[0]) == per_partition(theirs[0])
    assert ours[1][-1] == theirs[1][-1]  # where reading stands afterwards


def test_poll_by_poll_on_one_partition(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=1)
    expect = asyncio.run(_produce(kafka_bootstrap, topic, partitions=1))
    ours = asyncio.run(_read(ColumnarConsumer, kafka_bootstrap, topic, expect=expect, max_records=7, partitions=1))
    theirs = asyncio.run(_read(AIOKafkaConsumer, kafka_bootstrap, topic, expect=expect, max_records=7, partitions=1))
    assert ours == theirs  # the same polls, record for record, position for position


def test_reading_from_inside_a_record_batch_skips_what_lies_before(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    expect = asyncio.run(_produce(kafka_bootstrap, topic))
    start = {0: 33, 1: 101}  # inside batches: the broker returns them whole
    ours = asyncio.run(_read(ColumnarConsumer, kafka_bootstrap, topic, expect=expect - 134, max_records=50, start=start))
    theirs = asyncio.run(_read(AIOKafkaConsumer, kafka_bootstrap, topic, expect=expect - 134, max_records=50, start=start))
    assert per_partition(ours[0]) == per_partition(theirs[0]) and ours[1][-1] == theirs[1][-1]
    assert min(o for p, o, *_ in ours[0] if p == 0) == 33 and min(o for p, o, *_ in ours[0] if p == 1) == 101


async def _held_while_reading(bootstrap: str, topic: str, *, records: int, max_records: int) -> tuple[int, int]:
    """Read ``records`` records of partition 0, ``max_records`` per poll: (records read, most records of the
    current fetch held as columns after any poll)."""
    consumer = ColumnarConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        read, held, polls = 0, 0, 0
        while read < records and polls < 1_000:
            polls += 1
            read += sum(len(r) for r in (await consumer.getmany(timeout_ms=500, max_records=max_records)).values())
            result = consumer._fetcher._records.get(tp)
            partition_records = getattr(result, "_partition_records", None)
            parsed = getattr(partition_records, "_stream_dp_columns", None)
            if parsed is not None:
                held = max(held, len(parsed.columns))
                # no cycle back to the fetch: reference counting frees it once returned, without a collection
                assert not any(ref is partition_records for ref in gc.get_referents(parsed))
        return read, held
    finally:
        await consumer.stop()


def test_a_fetch_is_read_into_columns_only_as_far_as_a_poll_returns(kafka_bootstrap, new_topic):
    """A fetch of many records waits in its wire form: after each poll of ``max_records``, the columns held for
    the rest of it are at most ``max_records`` and one record batch, not the whole fetch (which as Python
    objects cost several times its bytes, for as long as the worker took to return it)."""
    topic = new_topic(partitions=1)
    records, max_records, per_batch = 5_000, 50, 40

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=50)
        await producer.start()
        try:
            for first in range(0, records, per_batch):  # record batches of ``per_batch`` records each
                batch = producer.create_batch()
                for i in range(first, min(records, first + per_batch)):
                    batch.append(key=b"k%d" % i, value=b'{"n": %d}' % i, timestamp=None)
                batch.close()
                await (await producer.send_batch(batch, topic, partition=0))
        finally:
            await producer.stop()

    asyncio.run(produce())
    read, held = asyncio.run(_held_while_reading(kafka_bootstrap, topic, records=records, max_records=max_records))
    assert read == records
    assert 0 < held <= max_records + per_batch, f"{held} records of a fetch held as columns after a poll of {max_records}"


@pytest.mark.parametrize("isolation_level", ["read_uncommitted", "read_committed"])
def test_transactions_and_their_markers(kafka_bootstrap, new_topic, unique_name, isolation_level):
    topic = new_topic(partitions=1)

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_name}-tx")
        await producer.start()
        try:
            for n, abort in enumerate((False, True, False)):
                await producer.begin_transaction()
                for i in range(5):
                    await producer.send(topic, value=b"%d-%d" % (n, i))
                if abort:
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
        finally:
            await producer.stop()

    asyncio.run(produce())
    expect = 10 if isolation_level == "read_committed" else 15
    ours = asyncio.run(_read(ColumnarConsumer, kafka_bootstrap, topic, expect=expect, max_records=4,
                             partitions=1, isolation_level=isolation_level))
    theirs = asyncio.run(_read(AIOKafkaConsumer, kafka_bootstrap, topic, expect=expect, max_records=4,
                               partitions=1, isolation_level=isolation_level))
    assert len(ours[0]) == expect
    assert ours == theirs


async def _stamps(consumer_type, bootstrap: str, topic: str, *, expect: int, isolation_level: str):
    """(timestamp, stamped by its producer) per record, as the ingest stage's batch holds them."""
    consumer = consumer_type(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level=isolation_level)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(2)])
        out: list[tuple[int, bool]] = []
        for _ in range(200):
            batches = await consumer.getmany(timeout_ms=500, max_records=100)
            if batches:
                batch = raw_batch(list(batches.items()))
                out += list(zip(batch.timestamps.tolist(), batch.producer_stamped.tolist()))
            if len(out) >= expect:
                return out
        raise AssertionError(f"read {len(out)} of {expect} records")
    finally:
        await consumer.stop()


@pytest.mark.parametrize("consumer_type", [ColumnarConsumer, AIOKafkaConsumer])
@pytest.mark.parametrize("isolation_level", ["read_uncommitted", "read_committed"])  # batches, or aiokafka's records
@pytest.mark.parametrize("stamps", ["CreateTime", "LogAppendTime"])
def test_who_stamped_each_record_comes_from_the_broker(kafka_bootstrap, new_topic, consumer_type, isolation_level,
                                                       stamps):
    """A record the broker stamped (LogAppendTime) is the only kind whose timestamp closes windows untrusted:
    each batch says which kind it holds, whichever way its records are read."""
    topic = new_topic(partitions=2, configs={"message.timestamp.type": stamps})
    started_ms = int(time.time() * 1000)
    expect = asyncio.run(_produce(kafka_bootstrap, topic))
    read = asyncio.run(_stamps(consumer_type, kafka_bootstrap, topic, expect=expect, isolation_level=isolation_level))
    if stamps == "CreateTime":
        assert all(by_producer for _, by_producer in read)
        assert sorted(t for t, _ in read) == [1_700_000_000_000 + i for i in range(expect)]  # as the producer set them
    else:
        assert not any(by_producer for _, by_producer in read)
        assert all(t >= started_ms - 5_000 for t, _ in read)  # the broker's clock, not the producer's
