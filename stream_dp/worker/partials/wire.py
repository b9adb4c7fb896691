"""Wire format of the partials topic (internal), as pure encode/decode functions.

One ``PartialAggregate`` per (query, window, input
partition) and ``Progress`` markers saying an input partition has closed all
windows through a time. Keyed by ``query|window_start_ms`` so that every
partial of a window reaches the same combine-and-release consumer.

Wire version 2 (binary): a partial is a frame of numpy columns (group keys,
counts, sums, distinct units; ``stream_dp.wire``), sent as one or more chunk
records that each fit the topic's record limit. A quantiles query's partial
also holds its per-group value histogram, sparse: the nonzero cells as
columns ``hist.group`` (int64, index into the groups), ``hist.bin`` (uint16)
and ``hist.count`` (int64), sorted by group then bin, with the bin count in
the header; partials without them (all earlier ones) read with no
histogram. The header's ``settings`` names the fingerprint of the
settings the partial's units were charged under
(``query.runtime.settings_fingerprint``); partials of earlier versions have
none and read with ``settings`` None, which the release stage does not
combine (``combine.checks.settings_conflict``). Workers of earlier
versions ignore the field, so they read these partials -- and combine
them unchecked: roll out a version that writes it before changing a
query's settings. A partial of a query with public groups also names each
group's position in that list (section ``public.position``, int64, -1 for a
group not in it): the release adds the partial up by them
(``combine.totals``), which is sound because the settings fingerprint it is
combined under covers the list and its order; without them (earlier
versions) groups are matched by key. Progress markers stay JSON
(wire version 1, a few dozen bytes). Partials of version 1 (one JSON
record each) are still read.

The output topics' records: ``release.ids`` and ``release.entry``; the dead-letter topic's:
``ingest.dead_letters``.

Partials hold exact per-partition aggregates of already bounded contributions:
they are internal data like the input events themselves and must be protected
(ACLs) like them. Nothing in them goes to an output topic without noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from stream_dp.dp.histogram import SparseHistogram
from stream_dp.windows.partial import BlockValues
from stream_dp.wire.chunks import (
    CHUNK_HEADER_ROOM,
    Chunk,
    chunk_records,
    decode_chunk,
    payload_digest,
)
from stream_dp.wire.frame import (
    BINARY_VERSION,
    KIND_CHUNK,
    UnknownWireVersion,
    WireFormatError,
    decode_frame,
    encode_frame,
    is_binary,
    read_prefix,
)
from stream_dp.wire.groups import (
    KeyRows,
    decode_columns,
    encode_columns,
    key_columns,
)

WIRE_VERSION = 1  # JSON records: progress markers, and the partials of earlier versions
READABLE = f"versions {WIRE_VERSION} (JSON) and {BINARY_VERSION} (binary partials)"
MIN_CHUNK_PAYLOAD = 4_096  # below this a partial of a million groups would take thousands of records


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
    #: Per-group histogram of the bounded values, rows aligned with ``groups`` (quantiles queries only).
    histogram: SparseHistogram | None = None
    #: Per-group sums of the units' feature vectors, (groups, width) (mean_vector / covariance queries only).
    features: np.ndarray | None = None
    #: Every kept event's (group, block, value) (sample_aggregate queries only).
    blocks: BlockValues | None = None
    #: ``settings_fingerprint`` of the ingest worker's query: the settings its units were charged under
    #: (None: written by a version that did not say).
    settings: str | None = None
    #: Each group's position in the public list of the query under ``settings`` (int64, -1: not public);
    #: None for queries without one and partials of earlier versions.
    public_positions: np.ndarray | None = None


@dataclass(frozen=True)
class Progress:
    """Input ``partition`` of ``query`` has closed every window ending at or before ``closed_through_ms``."""

    query: str
    partition: int
    input_partitions: int
    closed_through_ms: int


def partial_key(query: str, window_start_ms: int) -> bytes:
    return f"{query}|{window_start_ms}".encode()


def _partial_stream(partial: PartialAggregate) -> dict[str, Any]:
    """The fields every chunk of a partial repeats: enough to route, age-check or drop it alone."""
    return {
        "type": "partial",
        "query": partial.query,
        "window_start_ms": partial.window_start_ms,
        "window_end_ms": partial.window_end_ms,
        "partition": partial.partition,
    }


def encode_partial_payload(partial: PartialAggregate) -> bytes:
    """A partial as one binary frame (wire version 2), before chunking."""
    width = len(partial.groups[0]) if partial.groups else 0
    described, sections = encode_columns(key_columns(partial.groups, width))
    sections["count"] = np.asarray(partial.count, dtype=np.int64)
    sections["distinct_units"] = np.asarray(partial.distinct_units, dtype=np.int64)
    if partial.sum is not None:
        sections["sum"] = np.asarray(partial.sum, dtype=np.float64)
    extra: dict[str, Any] = {}
    if partial.settings is not None:
        extra["settings"] = partial.settings
    if partial.public_positions is not None:
        if len(partial.public_positions) != len(partial.groups):
            raise ValueError(f"a partial has {len(partial.public_positions)} public positions for "
                             f"{len(partial.groups)} groups; build them from the same group totals")
        extra["public_positions"] = True
        sections["public.position"] = np.asarray(partial.public_positions, dtype=np.int64)
    if partial.histogram is not None:
        if partial.histogram.n_groups != len(partial.groups):
            raise ValueError(
                f"a partial's histogram has {partial.histogram.n_groups} rows for {len(partial.groups)} groups; "
                "build it from the same group totals"
            )
        extra["histogram"] = {"bins": partial.histogram.bins, "cells": len(partial.histogram)}
        sections["hist.group"] = partial.histogram.group
        sections["hist.bin"] = partial.histogram.bin
        sections["hist.count"] = partial.histogram.count
    if partial.features is not None:
        features = np.asarray(partial.features, dtype=np.float64)
        if features.ndim != 2 or len(features) != len(partial.groups):
            raise ValueError(
                f"a partial's features have shape {features.shape} for {len(partial.groups)} groups; build them "
                "from the same group totals"
            )
        extra["features"] = {"width": int(features.shape[1])}
        sections["features"] = np.ascontiguousarray(features).reshape(-1)
    if partial.blocks is not None:
        blocks = partial.blocks
        if len(blocks) and int(blocks.group.max()) >= len(partial.groups):
            raise ValueError("a partial's block values name a group it does not hold; build them from the same totals")
        extra["blocks"] = {"rows": len(blocks)}
        sections["blk.group"] = np.asarray(blocks.group, dtype=np.int32)
        sections["blk.block"] = np.asarray(blocks.block, dtype=np.int32)
        sections["blk.value"] = np.asarray(blocks.value, dtype=np.float64)
    return encode_frame(
        {
            **_partial_stream(partial),
            "rows": len(partial.groups),
            "groups": described,
            "input_partitions": partial.input_partitions,
            "units_charged": partial.units_charged,
            "units_excluded": partial.units_excluded,
            "closed_at_ms": partial.closed_at_ms,
            "placement_partitions": partial.placement_partitions,
            "placement_changed": partial.placement_changed,
            **extra,
        },
        sections,
    )


def partial_records(partial: PartialAggregate, max_record_bytes: int) -> list[bytes]:
    """The chunk records of a partial, each at most ``max_record_bytes`` (value only: leave room for
    the record's key and Kafka's own framing when choosing it)."""
    room = max_record_bytes - CHUNK_HEADER_ROOM
    if room < MIN_CHUNK_PAYLOAD:
        raise ValueError(
            f"records of at most {max_record_bytes} bytes leave no room for partial chunks; "
            f"the partials topic must accept records of at least {MIN_CHUNK_PAYLOAD + CHUNK_HEADER_ROOM} bytes"
        )
    return chunk_records(_partial_stream(partial), encode_partial_payload(partial), room)


def encode_partial(partial: PartialAggregate) -> bytes:
    """A partial as a single record (one chunk, however large)."""
    payload = encode_partial_payload(partial)
    (record,) = chunk_records(_partial_stream(partial), payload, max(1, len(payload)))
    return record


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


def decode_partial_payload(payload: bytes) -> PartialAggregate:
    """A partial from its reassembled frame; raises ``WireFormatError``."""
    frame = decode_frame(payload, READABLE)
    data, sections = frame.fields, frame.sections
    try:
        if data.get("type") != "partial":
            raise WireFormatError(f"expected a partial frame, got type {data.get('type')!r}")
        rows = int(data["rows"])
        groups = KeyRows(decode_columns(data["groups"], sections, rows), rows)  # tuples built when read
        arrays = [sections["count"], sections["distinct_units"], sections.get("sum")]
        if any(a is not None and len(a) != rows for a in arrays):
            raise WireFormatError(f"a partial's columns are not all {rows} long")
        return PartialAggregate(
            query=str(data["query"]),
            window_start_ms=int(data["window_start_ms"]),
            window_end_ms=int(data["window_end_ms"]),
            partition=int(data["partition"]),
            input_partitions=int(data["input_partitions"]),
            groups=groups,
            count=arrays[0],
            sum=arrays[2],
            distinct_units=arrays[1],
            units_charged=int(data["units_charged"]),
            units_excluded=int(data["units_excluded"]),
            closed_at_ms=int(data["closed_at_ms"]),
            placement_partitions=int(data["placement_partitions"]),
            placement_changed=bool(data["placement_changed"]),
            histogram=_decode_histogram(data.get("histogram"), sections, rows),
            features=_decode_features(data.get("features"), sections, rows),
            blocks=_decode_blocks(data.get("blocks"), sections, rows),
            settings=_decode_settings(data.get("settings")),
            public_positions=_decode_positions(data.get("public_positions"), sections, rows),
        )
    except WireFormatError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise WireFormatError(f"corrupt partial frame: {exc!r}") from None


def _decode_positions(present: Any, sections: dict[str, Any], rows: int) -> np.ndarray | None:
    """A partial's public positions, or None when its writer gave none."""
    if not present:
        return None
    positions = sections["public.position"]
    if positions.dtype != np.int64 or len(positions) != rows:
        raise WireFormatError(f"a partial's public positions are {len(positions)} of {positions.dtype}, "
                              f"expected {rows} int64")
    return positions


def _decode_settings(settings: Any) -> str | None:
    """A partial's settings fingerprint, or None when its writer gave none."""
    if settings is not None and (not isinstance(settings, str) or not settings):
        raise WireFormatError(f"a partial's settings fingerprint is {settings!r}, not a string")
    return settings


def _decode_histogram(described: Any, sections: dict[str, Any], rows: int) -> SparseHistogram | None:
    """The sparse histogram of a partial frame, or None when it has none (every partial of other queries)."""
    if described is None:
        return None
    cells = int(described["cells"])
    columns = [sections["hist.group"], sections["hist.bin"], sections["hist.count"]]
    if any(len(c) != cells for c in columns):
        raise WireFormatError(f"a partial's histogram columns are not all {cells} cells long")
    # the constructor checks ranges, order and positive counts: a corrupt histogram raises ValueError
    return SparseHistogram(rows, int(described["bins"]), *columns)


def _decode_features(described: Any, sections: dict[str, Any], rows: int) -> np.ndarray | None:
    """The per-group feature sums of a vector query's partial frame, or None when it has none."""
    if described is None:
        return None
    width = int(described["width"])
    flat = sections["features"]
    if width < 1 or flat.dtype != np.float64 or len(flat) != rows * width:
        raise WireFormatError(f"a partial's features are not {rows} rows of {width} doubles")
    return flat.reshape(rows, width)


def _decode_blocks(described: Any, sections: dict[str, Any], rows: int) -> BlockValues | None:
    """The block values of a sample-and-aggregate query's partial frame, or None when it has none."""
    if described is None:
        return None
    n = int(described["rows"])
    group, block, value = sections["blk.group"], sections["blk.block"], sections["blk.value"]
    if not (len(group) == len(block) == len(value) == n):
        raise WireFormatError(f"a partial's block columns are not all {n} long")
    if n and (int(group.min()) < 0 or int(group.max()) >= rows or int(block.min()) < 0):
        raise WireFormatError("a partial's block values name groups or blocks out of range")
    return BlockValues(group, block, value)


def read_internal(value: bytes) -> PartialAggregate | Progress | Chunk:
    """A partials-topic record as it stands: a progress marker, a version-1 partial, or a chunk of a
    version-2 partial (to reassemble). Raises ``WireFormatError`` (``UnknownWireVersion`` for a
    version this worker does not read) on anything unexpected."""
    if value is None:
        raise WireFormatError("an internal record without a value")
    if is_binary(value):
        kind, fields, start = read_prefix(value, READABLE)
        if kind != KIND_CHUNK:
            raise WireFormatError(f"expected a chunk on the partials topic, got a binary record of kind {kind!r}")
        chunk = decode_chunk(fields, value[start:])
        if chunk.stream.get("type") != "partial":
            raise WireFormatError(f"chunk of an unknown internal record type {chunk.stream.get('type')!r}")
        return chunk
    return _decode_json(value)


def decode_internal(value: bytes) -> PartialAggregate | Progress | Chunk:
    """Like ``read_internal``, with a partial that fits one chunk decoded at once."""
    message = read_internal(value)
    if isinstance(message, Chunk) and message.count == 1:
        if len(message.piece) != message.size or payload_digest(message.piece) != message.digest:
            raise WireFormatError("a one-chunk partial does not match its size or digest")
        return decode_partial_payload(message.piece)
    return message


def chunk_stream_key(stream: dict[str, Any]) -> tuple[str, int, int]:
    """(query, window start, input partition): the partial a chunk belongs to."""
    try:
        return str(stream["query"]), int(stream["window_start_ms"]), int(stream["partition"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WireFormatError(f"corrupt chunk stream {stream!r}: {exc!r}") from None


def _decode_json(value: bytes) -> PartialAggregate | Progress:
    """A wire-version-1 (JSON) record; raises ``WireFormatError`` on anything unexpected."""
    try:
        data = orjson.loads(value)
        if data.get("v") != WIRE_VERSION:
            raise UnknownWireVersion(data.get("v"), READABLE)
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
            # and no settings fingerprint: the release stage does not combine such a partial
        )
    except WireFormatError:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireFormatError(f"corrupt internal record: {exc}") from None
