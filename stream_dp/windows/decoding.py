"""Raw message values to columns of valid events, and reasons for the rest.

The fast path decodes every message with a typed msgspec decoder built for the
query's fields (it checks JSON syntax, field presence, JSON types, integer
ranges and value bounds in C) and reads the fields into columns. A message
that fails it is handed to ``classify_message`` (:mod:`stream_dp.windows.classify`),
which re-reads it slowly to name the reason; the others keep going through
the fast path.

Messages are decoded one by one rather than joined into one JSON array: a
joined array is no faster once the garbage collector is on, and a crafted
message (``{"a":"`` followed by ``"}``) could merge with its neighbour and
shift every later event onto the wrong offset.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from stream_dp.dp.local import UnaryReports
from stream_dp.windows.classify import check_report, classify_message
from stream_dp.windows.rejections import RejectReason
from stream_dp.windows.specs import EventSchema
from stream_dp.windows.timestamps import to_epoch_ms

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# Integer identifiers and group values are kept to signed 64 bits: larger ones
# are almost surely corrupt and would not survive most consumers' parsers.
_BoundedInt = Annotated[int, msgspec.Meta(ge=_INT64_MIN, le=_INT64_MAX)]
_DECODE_ERRORS = (msgspec.DecodeError, ValueError, TypeError, RecursionError)
_BYTES_LIKE = (bytes, bytearray, memoryview)

#: Where a problem is reported per message: (index in the batch, reason, detail).
Problem = tuple[int, RejectReason, str]


@dataclass(frozen=True, slots=True)
class DecodedEvents:
    """Valid events of a batch as columns.

    ``index`` holds each event's position in the batch; ``units`` the unit ids
    as UTF-8 in a fixed-width ``S`` array (ids never contain NUL, so the
    padding is unambiguous). ``group_keys`` holds
    the group value itself when the query groups by one field, a tuple when
    it groups by several, and is ``None`` when it does not group (one group).
    """

    index: np.ndarray
    units: np.ndarray
    group_keys: list[Hashable] | None
    ts_ms: np.ndarray
    values: np.ndarray | None

    def __len__(self) -> int:
        return len(self.index)

    def take(self, keep: np.ndarray) -> DecodedEvents:
        """The events where the boolean mask ``keep`` is set."""
        rows = np.flatnonzero(keep)
        return DecodedEvents(
            index=self.index[rows],
            units=self.units[rows],
            group_keys=None if self.group_keys is None else list(map(self.group_keys.__getitem__, rows.tolist())),
            ts_ms=self.ts_ms[rows],
            values=None if self.values is None else self.values[rows],
        )


class EventDecoder:
    """Decodes batches of one query's messages; build once per query."""

    def __init__(self, schema: EventSchema) -> None:
        self.schema = schema
        ts_type: Any = {
            "auto": int | float | str,
            "epoch_s": int | float,
            "epoch_ms": int | float,
            "iso8601": str,
        }[schema.timestamp_format]
        unit_str = Annotated[str, msgspec.Meta(min_length=1, max_length=schema.max_unit_length)]
        fields: list[tuple[str, Any]] = [("u", unit_str | _BoundedInt), ("t", ts_type)]
        rename = {"u": schema.unit_field, "t": schema.timestamp_field}
        group_attrs = [f"g{i}" for i in range(len(schema.group_by))]
        for attr, name in zip(group_attrs, schema.group_by):
            # A k-RR report's value must be one of its domain: a literal is checked in C while decoding (it is
            # faster than reading any string), and classify_message names the reason for the rest.
            group_type = Literal[schema.group_domain] if schema.group_domain else str | _BoundedInt
            fields.append((attr, group_type))
            rename[attr] = name
        limit = float(schema.max_abs_value)
        value_attrs = ["v"] if schema.value_field is not None else [f"v{i}" for i in range(len(schema.vector_fields))]
        for attr, name in zip(value_attrs, schema.value_fields):
            fields.append((attr, Annotated[float, msgspec.Meta(ge=-limit, le=limit)]))
            rename[attr] = name
        self._report_index: dict[Any, int] | None = None
        self._unary: UnaryReports | None = None
        if schema.report_field is not None:  # a unary report: the list of its 1-bits' values
            domain = schema.report_domain
            fields.append(("r", Annotated[list[str | _BoundedInt], msgspec.Meta(max_length=len(domain))]))
            rename["r"] = schema.report_field
            self._report_index = {(type(v), v): i for i, v in enumerate(domain)}
            self._unary = UnaryReports(len(domain))
        if schema.report_tag_field is not None:
            # A literal: a missing or other tag fails the typed decoder, so valid batches pay nothing per event
            # for the check, and classify_message names the reason.
            fields.append(("k", Literal[schema.report_tag]))  # type: ignore[valid-type]
            rename["k"] = schema.report_tag_field
        event_type = msgspec.defstruct("Event", fields, rename=rename, gc=False, frozen=True)
        self._decode_one = msgspec.json.Decoder(event_type).decode
        self._group_getter = attrgetter(*group_attrs) if group_attrs else None
        self._value_getter = attrgetter(*value_attrs) if schema.value_fields else None
        self._vector_width = len(schema.vector_fields)

    def reports_of(self, events: list[Any]) -> tuple[np.ndarray, dict[int, tuple[RejectReason, str]]]:
        """Unary reports packed one bit per value (``UnaryReports.pack``), and why some rows are not valid reports."""
        assert self._report_index is not None and self._unary is not None
        index, name = self._report_index, self.schema.report_field
        lengths = np.zeros(len(events), dtype=np.int64)
        values: list[int] = []
        bad: dict[int, tuple[RejectReason, str]] = {}
        for row, event in enumerate(events):
            positions = [index.get((type(v), v), -1) for v in event.r]
            if -1 in positions or len(set(positions)) != len(positions):
                bad[row] = check_report(str(name), list(event.r), self.schema) or (
                    RejectReason.VALUE_OUT_OF_RANGE, f"field {name!r} reports a value outside the domain")
                continue
            lengths[row] = len(positions)
            values.extend(positions)
        rows = np.repeat(np.arange(len(events), dtype=np.int64), lengths)
        return self._unary.pack(rows, np.array(values, dtype=np.int64), len(events)), bad

    def values_of(self, events: list[Any]) -> np.ndarray | None:
        """The events' value column (n,), their vectors (n, d), or None for a query without values."""
        if self._value_getter is None:
            return None
        values = np.array(list(map(self._value_getter, events)), dtype=np.float64)
        return values.reshape(len(events), self._vector_width) if self._vector_width else values

    def decode(
        self, values: Sequence[bytes | None], now_ms: int, record_ms: np.ndarray | None = None
    ) -> tuple[DecodedEvents, list[Problem]]:
        """Decode one batch; every message ends up either in the events or in the problems.

        An event may be at most ``max_future_skew_ms`` ahead of the wall clock
        ``now_ms`` and, where given, of its message's record timestamp
        (``record_ms``, one per message).
        """
        schema = self.schema
        problems: list[Problem] = []
        candidates, positions = self._screen(values, problems)
        events = self._decode_all(candidates, positions, problems)
        index = positions
        keep = positions >= 0  # _decode_all marks failures with -1
        if not keep.all():
            events = [e for e in events if e is not None]
            index = positions[keep]
        units = [e.u for e in events]
        raw_ts = [e.t for e in events]
        values_col = self.values_of(events)
        report_problems: dict[int, tuple[RejectReason, str]] = {}
        if self._report_index is not None:
            values_col, report_problems = self.reports_of(events)
        group_keys = list(map(self._group_getter, events)) if self._group_getter is not None else None
        if set(map(type, units)) != {str} and units:
            units = [u if type(u) is str else str(u) for u in units]
        bad = np.zeros(len(events), dtype=bool)
        joined = "".join(units)
        if "\x00" in joined:
            for i, unit in enumerate(units):
                if "\x00" in unit:
                    bad[i] = True
                    problems.append(
                        (int(index[i]), RejectReason.BAD_UNIT, "the privacy-unit id contains a NUL character")
                    )
        if joined.isascii():
            unit_bytes = np.array(units, dtype="S")
        else:
            unit_bytes = np.array([u.encode("utf-8") for u in units], dtype="S")

        for i, (reason, detail) in report_problems.items():
            if not bad[i]:
                bad[i] = True
                problems.append((int(index[i]), reason, detail))
        ts_ms, ts_problems = to_epoch_ms(raw_ts, schema.timestamp_format)
        for i, detail in ts_problems.items():
            if bad[i]:
                continue
            bad[i] = True
            problems.append((int(index[i]), RejectReason.BAD_TIMESTAMP, detail))
        future = ts_ms > now_ms + schema.max_future_skew_ms
        if future.any():
            for i in np.flatnonzero(future & ~bad).tolist():
                problems.append((int(index[i]), RejectReason.FUTURE_TIMESTAMP, (
                    f"event time {int(ts_ms[i])} ms is more than {schema.max_future_skew_ms} ms "
                    f"ahead of the wall clock ({now_ms} ms)"
                )))
            bad |= future
        if record_ms is not None:
            record = record_ms[index]
            ahead = (ts_ms > record + schema.max_future_skew_ms) & ~bad
            for i in np.flatnonzero(ahead).tolist():
                problems.append((int(index[i]), RejectReason.AHEAD_OF_RECORD, (
                    f"event time {int(ts_ms[i])} ms is more than {schema.max_future_skew_ms} ms ahead of "
                    f"its Kafka record timestamp ({int(record[i])} ms); producers stamp records when they send "
                    "them, or with the event time"
                )))
            bad |= ahead
        if bad.any():
            good = np.flatnonzero(~bad)
            index, ts_ms, unit_bytes = index[good], ts_ms[good], unit_bytes[good]
            if group_keys is not None:
                group_keys = list(map(group_keys.__getitem__, good.tolist()))
            if values_col is not None:
                values_col = values_col[good]
        return DecodedEvents(index, unit_bytes, group_keys, ts_ms, values_col), problems

    def _screen(self, values: Sequence[bytes | None], problems: list[Problem]) -> tuple[list[bytes], np.ndarray]:
        """Drop tombstones, values that are not bytes, oversize and non-UTF-8 messages before decoding.

        Returns the messages left and their positions in the batch.
        """
        limit = self.schema.max_message_bytes
        n = len(values)
        try:
            lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
            # Joining with an ASCII separator keeps UTF-8 validity exact: a broken
            # sequence cannot be completed across a "\n".
            joined: bytes | None = b"\n".join(values)  # type: ignore[arg-type]
        except TypeError:  # a tombstone (None) or a value that is not bytes
            lengths = np.array([len(v) if isinstance(v, _BYTES_LIKE) else -1 for v in values], dtype=np.int64)
            joined = None
        if joined is None or (lengths > limit).any():
            for i in np.flatnonzero(lengths < 0).tolist():
                if values[i] is None:
                    problems.append((i, RejectReason.TOMBSTONE, "the message value is null (a tombstone)"))
                else:
                    kind = type(values[i]).__name__
                    problems.append((i, RejectReason.INVALID_JSON, f"the message value is a {kind}, not bytes"))
            for i in np.flatnonzero(lengths > limit).tolist():
                problems.append((i, RejectReason.OVERSIZE, f"{int(lengths[i])} bytes exceed max_message_bytes {limit}"))
            positions = np.flatnonzero((lengths >= 0) & (lengths <= limit))
            candidates = [values[i] for i in positions.tolist()]  # type: ignore[misc]
            joined = b"\n".join(candidates)
        else:
            positions = np.arange(n, dtype=np.int64)
            candidates = values if isinstance(values, list) else list(values)  # type: ignore[assignment]
        if joined.isascii():
            return candidates, positions
        try:
            joined.decode("utf-8")
            return candidates, positions
        except UnicodeDecodeError:
            pass
        kept: list[int] = []
        for local, pos in enumerate(positions.tolist()):
            try:
                bytes(candidates[local]).decode("utf-8")
                kept.append(local)
            except UnicodeDecodeError as exc:
                problems.append((pos, RejectReason.INVALID_UTF8, f"byte {exc.start} is not valid UTF-8"))
        return [candidates[i] for i in kept], positions[np.array(kept, dtype=np.int64)]

    def _decode_all(self, candidates: list[bytes], positions: np.ndarray, problems: list[Problem]) -> list[Any]:
        """Typed-decode every candidate; a failure becomes ``None`` and a problem,
        and its entry in ``positions`` is set to -1."""
        decode_one = self._decode_one
        out: list[Any] = []
        n = len(candidates)
        while len(out) < n:
            try:
                out.extend(map(decode_one, islice(candidates, len(out), None)))
            except _DECODE_ERRORS as exc:
                local = len(out)
                raw = candidates[local]
                out.append(None)
                found = classify_message(raw, self.schema)
                if found is None:  # the slow reader accepted what msgspec did not
                    found = (RejectReason.INVALID_JSON, str(exc)[:200])
                problems.append((int(positions[local]), found[0], found[1]))
                positions[local] = -1
        return out
