"""An application's event checked against its query before it is sent, with what to change when it is wrong.

The check is the worker's own decoder (``stream_dp.windows.decoding.EventDecoder``) run on the JSON the
producer would send, so an event passes here exactly when the worker would take it; the message adds how to
fix it. Python floats that JSON cannot carry (NaN, infinities) are refused before encoding, since JSON
encoders turn them into ``null`` or invalid documents. For a local-DP query the event checked is the one the
application holds (its true value in the query's ``local_dp.field``), before randomization.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from stream_dp.config import QueryConfig
from stream_dp.windows.decoding import EventDecoder
from stream_dp.windows.rejections import RejectReason
from stream_dp.windows.specs import EventSchema


class EventError(ValueError):
    """An event the query's worker would reject, with the reason and how to fix it; nothing was sent."""


def event_schema(query: QueryConfig) -> EventSchema:
    """The fields and limits of the events an application publishes for ``query`` (before any local-DP
    randomization, which replaces the true value by a report in this process)."""
    aggregations = query.aggregations
    local = query.local_dp
    return EventSchema(
        unit_field=query.privacy_unit.field,
        timestamp_field=query.timestamp_field,
        # a local-DP query's true value is one value of its domain (the public groups), whatever the mechanism
        group_by=(local.field,) if local is not None else tuple(query.group_by),
        group_domain=tuple(key[0] for key in query.public_group_keys() or ()) if local is not None else (),
        value_field=aggregations.value_field,
        vector_fields=tuple(aggregations.vector.fields) if aggregations.vector is not None else (),
        timestamp_format=query.timestamp_format,
        max_message_bytes=query.max_message_bytes,
        max_future_skew_ms=query.max_future_skew_ms,
    )


def _fix(reason: RejectReason, schema: EventSchema, query: str) -> str:
    unit, ts = schema.unit_field, schema.timestamp_field
    fields = ", ".join(repr(f) for f in (unit, ts, *schema.group_by, *schema.value_fields))
    fixes = {
        RejectReason.MISSING_FIELD: f"query {query!r} reads the fields {fields}: give the event each of them",
        RejectReason.NULL_FIELD: f"give every field query {query!r} reads ({fields}) a value, not None",
        RejectReason.WRONG_TYPE: (f"send the privacy unit {unit!r} and group fields as strings or integers, "
                                  f"the values as numbers, and {ts!r} as the query's timestamp_format "
                                  f"({schema.timestamp_format}) says"),
        RejectReason.EMPTY_UNIT: f"give {unit!r} the id of the user or device the event is about",
        RejectReason.BAD_UNIT: f"shorten {unit!r} (a hash of a long id works) and drop NUL characters",
        RejectReason.NON_FINITE: "send a finite number, or leave the event out",
        RejectReason.VALUE_OUT_OF_RANGE: ("send a value of the query's groups.public list" if schema.group_domain
                                          else f"values beyond {schema.max_abs_value:g} are refused; rescale them"),
        RejectReason.BAD_TIMESTAMP: (f"give {ts!r} epoch seconds, epoch milliseconds or an ISO-8601 time with a "
                                     f"zone, as timestamp_format ({schema.timestamp_format}) says"),
        RejectReason.FUTURE_TIMESTAMP: f"date {ts!r} when the event happened (now, not later)",
        RejectReason.OVERSIZE: f"leave out fields query {query!r} does not read",
    }
    return fixes.get(reason, f"send a JSON object with the fields {fields}")


def _non_finite(event: Mapping[str, Any]) -> str | None:
    for name, value in event.items():
        if isinstance(value, float) and not math.isfinite(value):
            return name
    return None


class EventChecker:
    """Checks and encodes one query's events: ``encode`` gives (key, value, event time in ms) or raises
    ``EventError``."""

    def __init__(self, query: QueryConfig, clock_ms: Any = None) -> None:
        self.query = query
        self.schema = event_schema(query)
        self._decoder = EventDecoder(self.schema)
        self._clock_ms = clock_ms if clock_ms is not None else (lambda: int(time.time() * 1000))

    def encode(self, event: Any, position: int | None = None) -> tuple[bytes, bytes, int]:
        """(key, value, event time in ms) of one event, or ``EventError``."""
        (record,) = self.encode_all([event], first=position or 0, named=position is not None)
        return record

    def encode_all(self, events: Iterable[Any], *, first: int = 0, named: bool = True) -> list[tuple[bytes, bytes, int]]:
        """(key, value, event time in ms) of every event, or ``EventError`` for the first wrong one; the worker's
        decoder reads them all in one batch."""
        name = self.query.name
        values = []
        for position, event in enumerate(events, start=first):
            where = f"event {position}" if named else "event"
            if not isinstance(event, Mapping):
                raise EventError(f"{where} is a {type(event).__name__}, not a dict: send each event as a dict of "
                                 f"its fields (query {name!r})")
            bad = _non_finite(event)
            if bad is not None:
                raise EventError(f"{where}: field {bad!r} is {event[bad]!r}, which JSON cannot carry; send a "
                                 f"finite number, or leave the event out (query {name!r})")
            try:
                values.append(orjson.dumps(dict(event)))
            except TypeError as exc:
                raise EventError(f"{where} cannot be sent as JSON ({exc}); give its fields strings, numbers, "
                                 f"lists or dicts (query {name!r})") from None
        decoded, problems = self._decoder.decode(values, now_ms=self._clock_ms())
        if problems:
            index, reason, detail = min(problems, key=lambda problem: problem[0])
            where = f"event {first + index}" if named else "event"
            raise EventError(f"{where} would be rejected by query {name!r} ({reason.value}: {detail}); "
                             f"{_fix(reason, self.schema, name)}")
        # the key is the unit id's UTF-8 bytes, as the worker reads it (an integer id: its decimal digits)
        return list(zip(decoded.units.tolist(), values, decoded.ts_ms.tolist(), strict=True))
