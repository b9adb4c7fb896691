"""Publishing a window's release records: per output partition, batches as large as the topic takes.

Records are rendered from the release entry in slices (``release.entry``),
their partitions computed for a whole slice with the vectorised murmur2 of
``stream_dp.windows.partitioning`` (the same partition Kafka's default
partitioner gives the key). The worker's output producer
(``kafka.output_producer``, librdkafka) takes each record with its partition
and batches and compresses in its own threads; its queue holds a bounded
number of bytes, so a window of a million groups is never all in memory.
With an aiokafka producer (tools, tests) the records are appended to one open
batch per partition, sent whenever it is full, and at most
``max_pending_bytes`` of sent batches wait for acknowledgement before the
next slice is rendered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2 as murmur2_one

from stream_dp.windows.partitioning import expected_partitions
from stream_dp.worker.kafka.output_producer import OutputProducer
from stream_dp.worker.release.entry import Record, ReleaseEntry, StoredRecords, build_entry

log = logging.getLogger(__name__)

KeyedRecord = Record
SLICE_ROWS = 20_000
RECORD_OVERHEAD = 128  # a record batch's header (61 bytes) and one record's own framing, with room
_VECTOR_KEY_BYTES = 256  # longer keys are hashed one by one: a fixed-width array of them would waste memory


def encode_releases(query, window, noisy, released_at_ms: int) -> list[KeyedRecord]:
    """Every record of a window's release (``release.entry.build_entry``, rendered)."""
    return build_entry(query, window, noisy, released_at_ms).render()


def output_partitions(keys: list[bytes], partitions: int) -> np.ndarray:
    """Kafka's default partition (murmur2 of the key) of each key, vectorised for short keys."""
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    out = np.empty(len(keys), dtype=np.int64)
    short = lengths <= _VECTOR_KEY_BYTES
    # fixed-width arrays stop at NUL, and JSON keys hold none (orjson escapes it)
    if short.all():
        if keys:
            out[:] = expected_partitions(np.array(keys, dtype="S"), partitions)
        return out
    index = np.flatnonzero(short)
    if len(index):
        out[index] = expected_partitions(np.array([keys[i] for i in index.tolist()], dtype="S"), partitions)
    for i in np.flatnonzero(~short).tolist():
        out[i] = (murmur2_one(keys[i]) & 0x7FFFFFFF) % partitions
    return out


class RecordTooLarge(ValueError):
    """A release record that does not fit an empty batch."""


async def publish_release(
    producer: OutputProducer | AIOKafkaProducer,
    topic: str,
    release: ReleaseEntry | StoredRecords,
    *,
    max_batch_bytes: int,
    slice_rows: int = SLICE_ROWS,
    on_too_large: Callable[[int], None],
    max_record_bytes: int | None = None,
    max_pending_bytes: int = 64 * 1024 * 1024,
) -> tuple[int, float]:
    """Publish every record of ``release`` and wait for all of them; returns how many were published
    and the seconds spent rendering them (the rest is Kafka's).

    ``max_batch_bytes``: the producer's batch size, at most what the topic
    accepts in one record batch; ``max_record_bytes`` (default: the batch
    size): the largest record the topic takes, sent alone in a batch of its
    own when larger than a batch. A larger record (a group key near the size
    of an event) is left out and its size passed to ``on_too_large``, which
    must account for it: the broker would refuse it, and retrying the window
    forever would stop every release after it.
    """
    record_limit = max_batch_bytes if max_record_bytes is None else max_record_bytes
    partitions = sorted(await producer.partitions_for(topic))
    if isinstance(producer, OutputProducer):
        return await _publish_through(producer, topic, release, partitions, record_limit, on_too_large, slice_rows)
    open_batches: dict[int, object] = {}
    pending: list[tuple[asyncio.Future, int]] = []
    pending_bytes = 0
    published = 0
    rendering_s = 0.0

    async def send(partition: int) -> None:
        nonlocal pending_bytes
        batch = open_batches.pop(partition)
        size = batch.size()
        pending.append((await producer.send_batch(batch, topic, partition=partitions[partition]), size))
        pending_bytes += size

    for start in range(0, release.total, slice_rows):
        started = time.perf_counter()
        records = release.render(start, start + slice_rows)
        targets = output_partitions([key for key, _ in records], len(partitions))
        rendering_s += time.perf_counter() - started
        for (key, value), partition in zip(records, targets.tolist()):
            if len(key) + len(value) + RECORD_OVERHEAD > record_limit:
                on_too_large(len(key) + len(value))
                continue
            batch = open_batches.get(partition)
            if batch is None:
                batch = open_batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                await send(partition)
                batch = open_batches[partition] = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise RecordTooLarge(f"a release record of {len(value)} bytes does not fit an empty batch")
            published += 1
        while pending_bytes > max_pending_bytes and pending:
            future, size = pending.pop(0)
            await future
            pending_bytes -= size
    for partition in list(open_batches):
        await send(partition)
    await asyncio.gather(*(future for future, _ in pending))
    return published, rendering_s


async def _publish_through(producer: OutputProducer, topic: str, release: ReleaseEntry | StoredRecords,
                           partitions: list[int], record_limit: int, on_too_large: Callable[[int], None],
                           slice_rows: int) -> tuple[int, float]:
    """``publish_release`` through librdkafka: each slice's keys, values and partitions handed over in one loop
    of ``produce`` calls (``RecordSender.send_many``); batches are built and compressed in librdkafka's threads."""
    sender = producer.records_to(topic)
    rendering_s = 0.0
    identity = partitions == list(range(len(partitions)))
    for start in range(0, release.total, slice_rows):
        started = time.perf_counter()
        keys, values = release.render_columns(start, start + slice_rows)
        targets = output_partitions(keys, len(partitions)).tolist()
        if not identity:
            targets = [partitions[i] for i in targets]
        if keys and max(map(len, keys)) + max(map(len, values)) + RECORD_OVERHEAD > record_limit:
            keys, values, targets = _within_limit(keys, values, targets, record_limit, on_too_large)
        rendering_s += time.perf_counter() - started
        done = 0
        while done < len(keys):
            done = sender.send_many(keys, values, targets, done)
            if done < len(keys):
                await sender.make_room()  # the queue is full: waits for the broker
        sender.serve()
        await asyncio.sleep(0)  # heartbeats and fetches between slices
    await sender.wait()
    return sender.sent, rendering_s


def _within_limit(keys: list[bytes], values: list[bytes], targets: list[int], record_limit: int,
                  on_too_large: Callable[[int], None]) -> tuple[list[bytes], list[bytes], list[int]]:
    """The records that fit ``record_limit``; each other one's size goes to ``on_too_large``."""
    kept: tuple[list[bytes], list[bytes], list[int]] = ([], [], [])
    for key, value, target in zip(keys, values, targets):
        if len(key) + len(value) + RECORD_OVERHEAD > record_limit:
            on_too_large(len(key) + len(value))
        else:
            kept[0].append(key)
            kept[1].append(value)
            kept[2].append(target)
    return kept
