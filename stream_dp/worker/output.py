"""Release records for the output topics: built as bytes in one pass, published in batches.

A window with 100k groups must be encoded, stored and published in well under
a second, so per-group work is one dict and one ``orjson.dumps``; values are
taken from the noisy arrays with one ``tolist`` each, and records go to Kafka
in per-partition batches rather than one ``send`` per record.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from stream_dp.worker.combiner import CombinedWindow
from stream_dp.worker.records import iso_utc, release_id
from stream_dp.worker.runtime import QueryRuntime

KeyedRecord = tuple[bytes, bytes]  # (Kafka key: the group values as a JSON array, record JSON)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _column(values, index: np.ndarray, requested: bool) -> list:
    """Per released group, a requested column's values (None where not requested or not finite)."""
    if not requested or values is None:
        return [None] * len(index)
    array = np.asarray(values)
    if array.ndim == 0:
        return [_finite(array.item())] * len(index)
    picked = array[index]
    if picked.dtype.kind == "f":
        picked = np.where(np.isfinite(picked), picked, np.nan)
        return [None if v != v else v for v in picked.tolist()]  # NaN -> None
    return picked.tolist()


def encode_releases(query: QueryRuntime, window: CombinedWindow, noisy, released_at_ms: int) -> list[KeyedRecord]:
    """One record per released group (``noisy.keep``); only noisy or post-processed values about users."""
    aggregations = query.config.aggregations
    want_count, want_sum, want_mean = (aggregations.count is not None, aggregations.sum is not None,
                                       aggregations.mean is not None)
    index = np.flatnonzero(np.asarray(noisy.keep, dtype=bool))
    counts = _column(noisy.count, index, want_count)
    sums = _column(noisy.sum, index, want_sum)
    means = _column(noisy.mean, index, want_mean)
    mean_ci = _column(noisy.mean_ci95, index, want_mean)
    ci_count = _finite(noisy.count_ci95) if want_count else None
    ci_sum = _finite(noisy.sum_ci95) if want_sum else None
    std = {"count": _finite(noisy.count_std) if want_count else None,
           "sum": _finite(noisy.sum_std) if want_sum else None}
    window_block = {
        "start": iso_utc(window.window_start_ms),
        "end": iso_utc(window.window_end_ms),
        "start_ms": window.window_start_ms,
        "end_ms": window.window_end_ms,
    }
    names = query.config.group_by
    # The fields every record of the window shares are serialised once; each
    # record splices its own values in front of them, in schema order.
    prefix = b'{"query":' + orjson.dumps(query.name) + b',"window":' + orjson.dumps(window_block)
    shared_tail = orjson.dumps({
        "std": std,
        "privacy": query.privacy,
        "released_at_ms": released_at_ms,
        "released_at": iso_utc(released_at_ms),
    })[1:]
    ci_count_json, ci_sum_json = orjson.dumps(ci_count), orjson.dumps(ci_sum)
    dumps = orjson.dumps
    out: list[KeyedRecord] = []
    for j, i in enumerate(index.tolist()):
        group = window.groups[i]
        values = dumps(list(group))
        record = b"".join((
            prefix,
            b',"release_id":', dumps(release_id(query.name, window.window_start_ms, group)),
            b',"group":', dumps(dict(zip(names, group))),
            b',"count":', dumps(counts[j]),
            b',"sum":', dumps(sums[j]),
            b',"mean":', dumps(means[j]),
            b',"ci95":{"count":', ci_count_json, b',"sum":', ci_sum_json, b',"mean":', dumps(mean_ci[j]), b"},",
            shared_tail,
        ))
        out.append((values, record))
    return out


async def publish_batched(producer: AIOKafkaProducer, topic: str, records: list[KeyedRecord]) -> None:
    """Publish and wait for every record; same key -> same partition as Kafka's default partitioner."""
    partitions = sorted(await producer.partitions_for(topic))
    batches = {}
    pending = []
    for key, value in records:
        partition = partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
        batch = batches.get(partition)
        if batch is None:
            batch = batches[partition] = producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            pending.append(await producer.send_batch(batch, topic, partition=partition))
            batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                raise ValueError(f"a release record of {len(value)} bytes does not fit one Kafka batch")
    for partition, batch in batches.items():
        if batch.record_count():
            pending.append(await producer.send_batch(batch, topic, partition=partition))
    await asyncio.gather(*pending)
