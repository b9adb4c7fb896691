"""Builders shared by the window-engine tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowPartial, WindowSpec

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


@dataclass
class Stream:
    """Messages with partitions and offsets numbered per partition, in arrival order."""

    values: list[bytes | None] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    _next: dict[int, int] = field(default_factory=dict)

    def add(self, value: bytes | None, partition: int = 0) -> int:
        offset = self._next.get(partition, 0)
        self._next[partition] = offset + 1
        self.values.append(value)
        self.partitions.append(partition)
        self.offsets.append(offset)
        return offset

    def batch(self, start: int = 0, stop: int | None = None) -> RawBatch:
        return RawBatch(
            self.values[start:stop], np.array(self.partitions[start:stop]), np.array(self.offsets[start:stop])
        )


def batch_of(values: Sequence[bytes | None], partition: int = 0, first_offset: int = 0) -> RawBatch:
    n = len(values)
    return RawBatch(list(values), np.full(n, partition), np.arange(first_offset, first_offset + n))


def by_key(partials: Iterable[WindowPartial]) -> dict[tuple[int, int], WindowPartial]:
    out: dict[tuple[int, int], WindowPartial] = {}
    for p in partials:
        key = (p.window_start_ms, p.partition)
        assert key not in out, f"window {key} was emitted twice"
        out[key] = p
    return out
