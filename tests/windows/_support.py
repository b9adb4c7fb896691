"""Builders shared by the window-engine tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowPartial, WindowSpec
from stream_dp.windows.batch import NO_TIMESTAMP
from stream_dp.windows.specs import AUTO_SECONDS_BELOW

NOW_MS = 1_704_067_800_000  # 2024-01-01T00:10:00Z, a minute boundary
SECRET = b"test-secret-0123456789abcdef"
SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value")


@dataclass
class FakeClock:
    now_ms: int = NOW_MS

    def __call__(self) -> int:
        return self.now_ms


def make_engine(
    *,
    schema: EventSchema = SCHEMA,
    size_ms: int = 60_000,
    lateness_ms: int = 10_000,
    idle_ms: int = 30_000,
    max_groups: int = 100,
    max_events: int = 100,
    clip: tuple[float, float] = (-1e6, 1e6),
    partitions: Iterable[int] = (0,),
    clock: FakeClock | None = None,
    compact_min_rows: int = 262_144,
) -> tuple[WindowEngine, FakeClock]:
    clock = clock or FakeClock()
    engine = WindowEngine(
        schema,
        WindowSpec(size_ms=size_ms, allowed_lateness_ms=lateness_ms, idle_timeout_ms=idle_ms),
        BoundingSpec(
            max_groups_per_unit=max_groups,
            max_events_per_group=max_events,
            clip_lo=clip[0],
            clip_hi=clip[1],
            secret=SECRET,
        ),
        clock_ms=clock,
        compact_min_rows=compact_min_rows,
    )
    engine.assign(list(partitions))
    return engine, clock


def event(
    unit: str | int, ts: int | float | str, page: str | int = "/a", value: float | None = 1.0, **extra: object
) -> bytes:
    body: dict[str, object] = {"user_id": unit, "ts": ts, "page": page, **extra}
    if value is not None:
        body["value"] = value
    return orjson.dumps(body)


def stamp_of(value: bytes | None, previous: int = NO_TIMESTAMP) -> int:
    """The record timestamp a producer that stamps records with their event time would give ``value``.

    Events without a readable numeric ``ts`` get ``previous`` (the stamp of the
    record before them): a record's timestamp never comes from bad contents.
    """
    try:
        ts = orjson.loads(value)["ts"]  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return previous
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < 1e16:
        return previous
    return int(ts * 1000) if ts < AUTO_SECONDS_BELOW else int(ts)


def stamps_of(values: Sequence[bytes | None], partitions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Record timestamps of ``values`` (see ``stamp_of``), falling back per partition."""
    parts = [0] * len(values) if partitions is None else [int(p) for p in partitions]
    out, previous = [], {}
    for value, p in zip(values, parts):
        previous[p] = stamp_of(value, previous.get(p, NO_TIMESTAMP))
        out.append(previous[p])
    return np.array(out, dtype=np.int64)


def raw_batch(values: Sequence[bytes | None], partitions: Sequence[int] | np.ndarray, offsets: Sequence[int] | np.ndarray) -> RawBatch:
    """A batch whose records are stamped with their event times (see ``stamp_of``)."""
    return RawBatch(list(values), np.asarray(partitions), np.asarray(offsets), stamps_of(values, partitions))


@dataclass
class Stream:
    """Messages with partitions, offsets numbered per partition and record timestamps, in arrival order.

    A record's timestamp is its event time unless ``add`` is given one (a
    producer stamping records with the event time, as backfills do).
    """

    values: list[bytes | None] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    _next: dict[int, int] = field(default_factory=dict)
    _stamp: dict[int, int] = field(default_factory=dict)

    def add(self, value: bytes | None, partition: int = 0, *, timestamp_ms: int | None = None) -> int:
        offset = self._next.get(partition, 0)
        self._next[partition] = offset + 1
        if timestamp_ms is None:
            timestamp_ms = stamp_of(value, self._stamp.get(partition, NO_TIMESTAMP))
        self._stamp[partition] = timestamp_ms
        self.values.append(value)
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.timestamps.append(timestamp_ms)
        return offset

    def batch(self, start: int = 0, stop: int | None = None) -> RawBatch:
        return RawBatch(
            self.values[start:stop],
            np.array(self.partitions[start:stop]),
            np.array(self.offsets[start:stop]),
            np.array(self.timestamps[start:stop], dtype=np.int64),
        )


def batch_of(
    values: Sequence[bytes | None], partition: int = 0, first_offset: int = 0, *, timestamps: Sequence[int] | None = None
) -> RawBatch:
    """One partition's records; record timestamps are the event times unless given."""
    n = len(values)
    stamps = stamps_of(values) if timestamps is None else np.asarray(timestamps, dtype=np.int64)
    return RawBatch(list(values), np.full(n, partition), np.arange(first_offset, first_offset + n), stamps)


def by_key(partials: Iterable[WindowPartial]) -> dict[tuple[int, int], WindowPartial]:
    out: dict[tuple[int, int], WindowPartial] = {}
    for p in partials:
        key = (p.window_start_ms, p.partition)
        assert key not in out, f"window {key} was emitted twice"
        out[key] = p
    return out
