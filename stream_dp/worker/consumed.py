"""What the ingest stage reads and commits, as plain data: consumer records to arrays, and the
window progress kept in the metadata of committed offsets. Pure functions, no I/O."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import orjson
from aiokafka.structs import TopicPartition

from stream_dp.windows import RawBatch
from stream_dp.windows.batch import NO_TIMESTAMP

log = logging.getLogger(__name__)


def raw_batch(items: list[tuple[TopicPartition, list]]) -> RawBatch:
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    partitions = []
    offsets = []
    timestamps = []
    for tp, records in items:
        values.extend(r.value for r in records)
        keys.extend(r.key for r in records)
        partitions.append(np.full(len(records), tp.partition, dtype=np.int32))
        offsets.append(np.fromiter((r.offset for r in records), dtype=np.int64, count=len(records)))
        # A record of the old message format has no timestamp (None or -1): NO_TIMESTAMP either way.
        timestamps.append(np.fromiter((r.timestamp or NO_TIMESTAMP for r in records), dtype=np.int64, count=len(records)))
    return RawBatch(
        values=values, partitions=np.concatenate(partitions), offsets=np.concatenate(offsets),
        timestamps=np.concatenate(timestamps), keys=keys,
    )


def restored_progress(metadata: str | None, query: str) -> tuple[int | None, int | None, int | None]:
    """(closed_through_ms of ``query``, next unprocessed offset, record clock) from a partition's commit metadata."""
    if not metadata:
        return None, None, None
    try:
        data = orjson.loads(metadata)
        closed = data.get("closed_through_ms", {}).get(query)
        next_offset = data.get("next_offset")
        clock = data.get("record_clock_ms")
    except (orjson.JSONDecodeError, AttributeError):
        log.warning("ignoring unreadable commit metadata %r", metadata[:100])
        return None, None, None
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) else None for v in (closed, next_offset, clock))  # type: ignore[return-value]


def alert_json(alert: Any) -> bytes:
    return orjson.dumps({"type": "budget_alert", **dataclasses.asdict(alert)})


def commit_metadata(closed: dict[str, int], next_offset: int, record_clock_ms: int | None) -> str:
    """The metadata committed with a partition's offset, read back by ``restored_progress``."""
    return orjson.dumps({
        "closed_through_ms": closed,
        # Offsets from here on were never processed: their events in
        # closed windows are late, not replays, for the next owner.
        "next_offset": next_offset,
        # The partition's window clock, which records before the offset also moved.
        "record_clock_ms": record_clock_ms,
    }).decode()
