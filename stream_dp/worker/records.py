"""Wire formats of the worker's topics, as pure encode/decode functions.

* partials topic (internal): one ``PartialAggregate`` per (query, window, input
  partition) and ``Progress`` markers saying an input partition has closed all
  windows through a time. Keyed by ``query|window_start_ms`` so that every
  partial of a window reaches the same combine-and-release consumer.
* output topics: one ``release`` record per group per window (schema:
  ``deploy/schemas/release.schema.json``); only noisy values.
* dead-letter topic: the original bytes of a rejected event, with the reason in
  headers.

Partials hold exact per-partition aggregates of already bounded contributions:
they are internal data like the input events themselves and must be protected
(ACLs) like them. Nothing in them goes to an output topic without noise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import orjson

WIRE_VERSION = 1

GroupKey = tuple[str | int, ...]


@dataclass(frozen=True)
class PartialAggregate:
    """Exact, bounded, budget-filtered totals of one input partition for one window."""

    query: str
    window_start_ms: int
    window_end_ms: int
    partition: int
    input_partitions: int
    groups: list[GroupKey]
    count: np.ndarray  # int64 per group
    sum: np.ndarray | None  # float64 per group (clipped values)
    distinct_units: np.ndarray  # int64 per group
    units_charged: int
    units_excluded: int
    closed_at_ms: int  # wall clock when the window closed in the ingest stage
    #: The partition count its events' placement was checked against (0: unchecked), and whether
    #: that count changed while the window was open (then a unit may sit on two partitions).
    placement_partitions: int = 0
    placement_changed: bool = False


@dataclass(frozen=True)
class Progress:
    """Input ``partition`` of ``query`` has closed every window ending at or before ``closed_through_ms``."""

    query: str
    partition: int
    input_partitions: int
    closed_through_ms: int


def partial_key(query: str, window_start_ms: int) -> bytes:
    return f"{query}|{window_start_ms}".encode()


def encode_partial(partial: PartialAggregate) -> bytes:
    return orjson.dumps(
        {
            "v": WIRE_VERSION,
            "type": "partial",
            "query": partial.query,
            "window_start_ms": partial.window_start_ms,
            "window_end_ms": partial.window_end_ms,
            "partition": partial.partition,
            "input_partitions": partial.input_partitions,
            "groups": [list(g) for g in partial.groups],
            "count": partial.count.astype(np.int64),
            "sum": None if partial.sum is None else partial.sum.astype(np.float64),
            "distinct_units": partial.distinct_units.astype(np.int64),
            "units_charged": partial.units_charged,
            "units_excluded": partial.units_excluded,
            "closed_at_ms": partial.closed_at_ms,
            "placement_partitions": partial.placement_partitions,
            "placement_changed": partial.placement_changed,
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def encode_progress(progress: Progress) -> bytes:
    return orjson.dumps(
        {
            "v": WIRE_VERSION,
            "type": "progress",
            "query": progress.query,
            "partition": progress.partition,
            "input_partitions": progress.input_partitions,
            "closed_through_ms": progress.closed_through_ms,
        }
    )


class WireFormatError(ValueError):
    """An internal record could not be decoded (wrong version or corrupt)."""


def decode_internal(value: bytes) -> PartialAggregate | Progress:
    """Decode a partials-topic record; raises ``WireFormatError`` on anything unexpected."""
    try:
        data = orjson.loads(value)
        if data.get("v") != WIRE_VERSION:
            raise WireFormatError(f"internal record version {data.get('v')!r}; this worker reads version {WIRE_VERSION}")
        if data["type"] == "progress":
            return Progress(data["query"], int(data["partition"]), int(data["input_partitions"]), int(data["closed_through_ms"]))
        if data["type"] != "partial":
            raise WireFormatError(f"unknown internal record type {data['type']!r}")
        sums = data["sum"]
        return PartialAggregate(
            query=data["query"],
            window_start_ms=int(data["window_start_ms"]),
            window_end_ms=int(data["window_end_ms"]),
            partition=int(data["partition"]),
            input_partitions=int(data["input_partitions"]),
            groups=[tuple(g) for g in data["groups"]],
            count=np.asarray(data["count"], dtype=np.int64),
            sum=None if sums is None else np.asarray(sums, dtype=np.float64),
            distinct_units=np.asarray(data["distinct_units"], dtype=np.int64),
            units_charged=int(data["units_charged"]),
            units_excluded=int(data["units_excluded"]),
            closed_at_ms=int(data["closed_at_ms"]),
            # absent in partials of workers that did not check placement
            placement_partitions=int(data.get("placement_partitions", 0)),
            placement_changed=bool(data.get("placement_changed", False)),
        )
    except WireFormatError:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireFormatError(f"corrupt internal record: {exc}") from None


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def release_id(query: str, window_start_ms: int, group: GroupKey) -> str:
    """Stable id of one (query, window, group) release: consumers dedupe on it."""
    digest = hashlib.blake2b(orjson.dumps([query, window_start_ms, list(group)]), digest_size=12).hexdigest()
    return f"{query}:{window_start_ms}:{digest}"
