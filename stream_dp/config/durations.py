"""Durations written the way people write them in YAML: ``500ms``, ``10s``, ``1m``, ``24h``, ``7d``; and
instants, as ISO-8601 times with a zone (``2026-01-01T00:00:00Z``)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Union

from pydantic import BeforeValidator, Field

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(value: object) -> int:
    """Return the duration in whole milliseconds.

    Accepts a string with a unit (``"1m"``, ``"1.5s"``, ``"250ms"``) or a bare
    integer already in milliseconds. Raises ``ValueError`` saying how to write
    one otherwise.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write it like 30s, 1m, 1h or 24h")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"duration {value} ms is negative; use 0 or more")
        return value
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            amount, unit = match.groups()
            ms = float(amount) * _UNIT_MS[unit]
            if ms != int(ms):
                raise ValueError(f"duration {value!r} is not a whole number of milliseconds")
            return int(ms)
    raise ValueError(
        f"{value!r} is not a duration; write a number and a unit (ms, s, m, h, d), e.g. 30s, 1m, 1h or 24h"
    )


def format_duration_ms(ms: int) -> str:
    """The shortest exact way to write ``ms`` with one unit (``3600000`` -> ``"1h"``)."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


# A duration setting of the query file: read into whole milliseconds; its JSON Schema (editors, the
# query-file reference) shows how it is written, a whole number of milliseconds or a number and a unit.
DurationMs = Annotated[int, BeforeValidator(
    parse_duration_ms,
    json_schema_input_type=Union[Annotated[int, Field(ge=0)], Annotated[str, Field(pattern=_DURATION.pattern)]],
)]


_LATEST_INSTANT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the latest event time accepted


def parse_instant_ms(value: object) -> int:
    """Milliseconds since the epoch of an ISO-8601 time with a zone (``"2026-01-01T00:00:00Z"``, or the
    datetime YAML reads from it unquoted). A time without a zone, a date alone or a number is refused:
    each could be read more than one way."""
    how = "write an ISO-8601 time with its zone, e.g. 2026-01-01T00:00:00Z or 2026-01-01T09:00:00+09:00"
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a time; {how}") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"time {value.isoformat()} has no zone, so which instant it is depends on the "
                             f"machine; {how}")
        ms = (value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)
        if not 0 < ms <= _LATEST_INSTANT_MS:
            raise ValueError(f"time {value.isoformat()} is not after 1970-01-01T00:00:00Z; {how}")
        return ms
    if isinstance(value, dt.date):
        raise ValueError(f"{value.isoformat()} is a date, not a time; {how}")
    raise ValueError(f"{value!r} is not a time; {how}")


# An instant setting of the query file (``window.publish_from``): read into milliseconds since the epoch; its
# JSON Schema shows it as an ISO-8601 date-time (a YAML timestamp written unquoted is one too).
InstantMs = Annotated[int, BeforeValidator(
    parse_instant_ms, json_schema_input_type=Annotated[str, Field(json_schema_extra={"format": "date-time"})],
)]
