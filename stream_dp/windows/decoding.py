"""Raw message values to columns of valid events, and reasons for the rest.

The fast path decodes every message with a typed msgspec decoder built for the
query's fields (it checks JSON syntax, field presence, JSON types, integer
ranges and value bounds in C) and reads the fields into columns. A message
that fails it is handed to ``classify_message``, which re-reads it slowly to
name the reason; the others keep going through the fast path.

Messages are decoded one by one rather than joined into one JSON array: a
joined array is no faster once the garbage collector is on, and a crafted
message (``{"a":"`` followed by ``"}``) could merge with its neighbour and
shift every later event onto the wrong offset.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

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


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_inf(token: str) -> float:
    raise ValueError(f"{token} is not valid JSON")


def classify_message(raw: bytes, schema: EventSchema) -> tuple[RejectReason, str] | None:
    """Why ``raw`` is not a valid event, or ``None`` if no reason is found.

    Slow and thorough; only messages the typed decoder refused come here.
    """
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        return RejectReason.INVALID_UTF8, f"byte {exc.start} is not valid UTF-8"
    if not text.strip():
        return RejectReason.INVALID_JSON, "the message is empty"
    try:
        # Python's parser reads 1e999 as inf, which lets it be reported as non-finite
        event = json.loads(text, parse_constant=_reject_inf)
    except (ValueError, RecursionError) as exc:
        return RejectReason.INVALID_JSON, str(exc)[:200]
    if not isinstance(event, dict):
        return RejectReason.WRONG_TYPE, f"an event must be a JSON object, got {_describe(event)}"
    if schema.report_tag_field is not None and (problem := _check_tag(event.get(schema.report_tag_field), schema)):
        return problem  # before the other fields: an event without a tag is most likely a true value
    fields = [(schema.unit_field, "unit"), (schema.timestamp_field, "timestamp")]
    fields += [(name, "group") for name in schema.group_by]
    fields += [(name, "value") for name in schema.value_fields]
    if schema.report_field is not None:
        fields.append((schema.report_field, "report"))
    for name, role in fields:
        if name not in event:
            return RejectReason.MISSING_FIELD, f"field {name!r} is missing"
        value = event[name]
        if value is None:
            return RejectReason.NULL_FIELD, f"field {name!r} is null"
        problem = _check_field(name, role, value, schema)
        if problem is not None:
            return problem
    return None


def _check_field(name: str, role: str, value: Any, schema: EventSchema) -> tuple[RejectReason, str] | None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_number = is_int or isinstance(value, float)
    if role in ("unit", "group"):
        if not (isinstance(value, str) or is_int):
            return RejectReason.WRONG_TYPE, f"field {name!r} must be a string or an integer, got {_describe(value)}"
        if is_int and not _INT64_MIN <= value <= _INT64_MAX:
            return RejectReason.WRONG_TYPE, f"field {name!r} is an integer outside the signed 64-bit range"
        if role == "unit" and value == "":
            return RejectReason.EMPTY_UNIT, f"field {name!r} (the privacy unit) is an empty string"
        if role == "unit" and isinstance(value, str) and len(value) > schema.max_unit_length:
            return RejectReason.BAD_UNIT, (
                f"field {name!r} (the privacy unit) has {len(value)} characters, more than max_unit_length {schema.max_unit_length}"
            )
        return None
    if role == "report":
        if not isinstance(value, list):
            return RejectReason.WRONG_TYPE, f"field {name!r} must be a list of reported values, got {_describe(value)}"
        for item in value:
            item_is_int = isinstance(item, int) and not isinstance(item, bool)
            if not (isinstance(item, str) or item_is_int):
                return RejectReason.WRONG_TYPE, f"field {name!r} holds {_describe(item)}; a report lists strings or integers"
        return _check_report(name, value, schema)
    if role == "timestamp":
        allowed_number = schema.timestamp_format != "iso8601"
        allowed_string = schema.timestamp_format in ("auto", "iso8601")
        if not ((is_number and allowed_number) or (isinstance(value, str) and allowed_string)):
            expected = {"iso8601": "an ISO-8601 string", "auto": "a number or an ISO-8601 string"}
            wanted = expected.get(schema.timestamp_format, "a number")
            return RejectReason.WRONG_TYPE, f"field {name!r} must be {wanted}, got {_describe(value)}"
        if isinstance(value, float) and not math.isfinite(value):
            return RejectReason.BAD_TIMESTAMP, f"field {name!r} is not a finite number"
        return None
    if not is_number:
        return RejectReason.WRONG_TYPE, f"field {name!r} must be a number, got {_describe(value)}"
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if not math.isfinite(as_float):
        return RejectReason.NON_FINITE, f"field {name!r} is too large to be a finite double"
    if abs(as_float) > schema.max_abs_value:
        return (
            RejectReason.VALUE_OUT_OF_RANGE,
            f"field {name!r} = {as_float:g} exceeds max_abs_value {schema.max_abs_value:g}",
        )
    return None


def _check_tag(tag: Any, schema: EventSchema) -> tuple[RejectReason, str] | None:
    """Why an event is not a report of the query's own randomizer, or None."""
    name, wanted = schema.report_tag_field, schema.report_tag
    if tag is None:
        return RejectReason.NOT_RANDOMIZED, (
            f"field {name!r} is missing or null: not a randomized report (a true value, never used); send this "
            "topic's events with `stream-dp produce --local-dp FIELD` and the query's --config and --query")
    if tag != wanted:
        got = repr(tag[:100]) if isinstance(tag, str) else _describe(tag)
        return RejectReason.RANDOMIZER_MISMATCH, (
            f"field {name!r} is {got}, a report of another randomizer than the query's {wanted!r} "
            "(mechanism:epsilon:k:domain hash); produce with the query's local_dp settings and groups.public")
    return None


def _check_report(name: str, items: list[Any], schema: EventSchema) -> tuple[RejectReason, str] | None:
    """Why a unary report is not a set of domain values, or None."""
    domain = set(schema.report_domain)
    if len(items) > len(domain):
        return RejectReason.VALUE_OUT_OF_RANGE, f"field {name!r} lists {len(items)} values, more than the domain's {len(domain)}"
    for item in items:
        if item not in domain or isinstance(item, bool):
            return RejectReason.VALUE_OUT_OF_RANGE, f"field {name!r} reports {str(item)[:64]!r}, which is not in the domain"
    if len(set(items)) != len(items):
        return RejectReason.WRONG_TYPE, f"field {name!r} lists a value twice; a report is a set of values"
    return None


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
            fields.append((attr, str | _BoundedInt))
            rename[attr] = name
        limit = float(schema.max_abs_value)
        value_attrs = ["v"] if schema.value_field is not None else [f"v{i}" for i in range(len(schema.vector_fields))]
        for attr, name in zip(value_attrs, schema.value_fields):
            fields.append((attr, Annotated[float, msgspec.Meta(ge=-limit, le=limit)]))
            rename[attr] = name
        self._report_index: dict[Any, int] | None = None
        if schema.report_field is not None:  # a unary report: the list of its 1-bits' values
            domain = schema.report_domain
            fields.append(("r", Annotated[list[str | _BoundedInt], msgspec.Meta(max_length=len(domain))]))
            rename["r"] = schema.report_field
            self._report_index = {(type(v), v): i for i, v in enumerate(domain)}
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
        """Unary reports as a (n, domain) 0/1 matrix, and why some rows are not valid reports."""
        assert self._report_index is not None
        index, name = self._report_index, self.schema.report_field
        matrix = np.zeros((len(events), len(index)), dtype=np.float64)
        bad: dict[int, tuple[RejectReason, str]] = {}
        for row, event in enumerate(events):
            positions = [index.get((type(v), v), -1) for v in event.r]
            if -1 in positions or len(set(positions)) != len(positions):
                bad[row] = _check_report(str(name), list(event.r), self.schema) or (
                    RejectReason.VALUE_OUT_OF_RANGE, f"field {name!r} reports a value outside the domain")
                continue
            matrix[row, positions] = 1.0
        return matrix, bad

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
