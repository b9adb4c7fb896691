"""What a worker commits with an input partition's offset, for the partition's next owner.

Kafka stores a string beside each committed offset (``offset.metadata.max.bytes``,
4 KiB by default). stream-dp keeps there, as JSON:

* ``closed_through_ms``: per query, the closure the commit makes durable
  (windows held for a budget charge are not closed for it);
* ``closure_steps``: per query, the closure raises above that, as
  ``[first offset read under it, boundary]``, so that a replay meets each
  offset with the closure this worker met it with (``windows.watermarks``);
* ``next_offset``: offsets from here on were never processed: their events in
  closed windows are late, not replays;
* ``record_clock_ms``: the partition's window clock, which records before the
  committed offset also moved;
* ``store``: the token of the Redis the progress was charged on
  (``stream_dp.worker.guard.store``), so a store that lost its data is caught.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

log = logging.getLogger(__name__)

#: Closure steps kept per query: raises happen once a window, and more are only needed while
#: windows stay held through that many closures.
MAX_COMMITTED_STEPS = 8


@dataclasses.dataclass(frozen=True)
class RestoredProgress:
    closed_through_ms: int | None = None
    next_offset: int | None = None
    record_clock_ms: int | None = None
    closure_steps: tuple[tuple[int, int], ...] = ()


def encode_commit_metadata(closed_through_ms: Mapping[str, int], closure_steps: Mapping[str, Iterable[tuple[int, int]]],
                           next_offset: int, record_clock_ms: int | None, store: str | None = None) -> str:
    steps = {}
    for query, query_steps in closure_steps.items():
        closed = closed_through_ms.get(query)
        kept = [[int(o), int(b)] for o, b in query_steps if closed is None or b > closed][-MAX_COMMITTED_STEPS:]
        if kept:
            steps[query] = kept
    fields: dict[str, Any] = {
        "closed_through_ms": dict(closed_through_ms),
        "closure_steps": steps,
        "next_offset": next_offset,
        "record_clock_ms": record_clock_ms,
    }
    if store is not None:
        fields["store"] = store
    return orjson.dumps(fields).decode()


def committed_store(metadata: str | None) -> str | None:
    """The store token a partition's commit metadata names; None when it names none (or is unreadable,
    which ``restored_progress`` reports)."""
    if not metadata:
        return None
    try:
        store = orjson.loads(metadata).get("store")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return store if isinstance(store, str) and store else None


def restored_progress(metadata: str | None, query: str) -> RestoredProgress:
    """What a partition's commit metadata says about ``query``; nothing when it is absent or unreadable."""
    if not metadata:
        return RestoredProgress()
    try:
        data = orjson.loads(metadata)
        steps = []
        for step in data.get("closure_steps", {}).get(query, ()):
            offset, boundary = _int(step[0]), _int(step[1])
            if offset is not None and boundary is not None:
                steps.append((offset, boundary))
        return RestoredProgress(_int(data.get("closed_through_ms", {}).get(query)), _int(data.get("next_offset")),
                                _int(data.get("record_clock_ms")), tuple(steps))
    except (orjson.JSONDecodeError, AttributeError, TypeError, IndexError, KeyError):
        log.warning("ignoring unreadable commit metadata %r", metadata[:100])
        return RestoredProgress()


@dataclasses.dataclass(frozen=True)
class RestoredPartitions:
    """``RestoredProgress`` of one query over several partitions, each field keyed by partition
    (partitions whose metadata says nothing of it are left out)."""

    closed_through_ms: dict[int, int]
    next_offset: dict[int, int]
    record_clock_ms: dict[int, int]
    closure_steps: dict[int, tuple[tuple[int, int], ...]]


def restored_partitions(query: str, metadata: Mapping[int, str | None]) -> RestoredPartitions:
    """What each partition's commit metadata says about ``query``."""
    out = RestoredPartitions({}, {}, {}, {})
    for partition, text in metadata.items():
        earlier = restored_progress(text, query)
        if earlier.closed_through_ms is not None:
            out.closed_through_ms[partition] = earlier.closed_through_ms
        if earlier.next_offset is not None:
            out.next_offset[partition] = earlier.next_offset
        if earlier.record_clock_ms is not None:
            out.record_clock_ms[partition] = earlier.record_clock_ms
        if earlier.closure_steps:
            out.closure_steps[partition] = earlier.closure_steps
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
