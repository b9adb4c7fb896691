"""What the ingest stage reads and sends beside partials, as plain data: consumer records to arrays,
budget alerts to JSON. Pure functions, no I/O (commit metadata: ``kafka.commit_metadata``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import orjson
from aiokafka.structs import TopicPartition

from stream_dp.windows import RawBatch
from stream_dp.windows.batch import NO_TIMESTAMP
from stream_dp.worker.kafka.record_columns import LOG_APPEND_TIME, RecordColumns
from stream_dp.worker.kafka.record_columns import raw_batch as columns_raw_batch


def raw_batch(items: list[tuple[TopicPartition, list]]) -> RawBatch:
    if all(isinstance(records, RecordColumns) for _, records in items):
        return columns_raw_batch(items)  # the ColumnarConsumer's records: no object per record
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    partitions = []
    offsets = []
    timestamps = []
    producer_stamped = []
    for tp, records in items:
        values.extend(r.value for r in records)
        keys.extend(r.key for r in records)
        partitions.append(np.full(len(records), tp.partition, dtype=np.int32))
        offsets.append(np.fromiter((r.offset for r in records), dtype=np.int64, count=len(records)))
        # A record of the old message format has no timestamp (None or -1): NO_TIMESTAMP either way.
        timestamps.append(np.fromiter((r.timestamp or NO_TIMESTAMP for r in records), dtype=np.int64, count=len(records)))
        # Only a broker's stamp is the broker's: a record that does not say who stamped it counts as its producer's.
        producer_stamped.append(np.fromiter((getattr(r, "timestamp_type", None) != LOG_APPEND_TIME for r in records),
                                            dtype=bool, count=len(records)))
    return RawBatch(
        values=values, partitions=np.concatenate(partitions), offsets=np.concatenate(offsets),
        timestamps=np.concatenate(timestamps), keys=keys, producer_stamped=np.concatenate(producer_stamped),
    )


def alert_json(alert: Any) -> bytes:
    return orjson.dumps({"type": "budget_alert", **dataclasses.asdict(alert)})
