"""Event times: JSON numbers or ISO-8601 strings to integer epoch milliseconds.

Epoch seconds are rounded to the nearest millisecond (so 1700000000.123 is
exactly ...123 ms despite binary floating point); fractional epoch
milliseconds are floored. ISO-8601 strings must carry a zone (``Z`` or
``+hh:mm``): a zone-less time means something different on every host.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from stream_dp.windows.specs import AUTO_SECONDS_BELOW, MAX_TIMESTAMP_MS, TimestampFormat

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_NUMBER_TYPES = frozenset({int, float})


def parse_iso8601_ms(text: str) -> int | str:
    """Epoch milliseconds of an ISO-8601 time with zone, or a description of what is wrong."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return f"{text[:64]!r} is not an ISO-8601 time; write e.g. 2024-05-01T12:00:00.250Z"
    if parsed.tzinfo is None:
        return f"{text[:64]!r} has no zone; add Z or an offset such as +02:00"
    return (parsed - _EPOCH) // _ONE_MS


def _numbers_to_ms(numbers: np.ndarray, timestamp_format: TimestampFormat) -> np.ndarray:
    """Float epoch numbers to float milliseconds (NaN stays NaN, caught by the range check)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if timestamp_format == "epoch_ms":
            return np.floor(numbers)
        if timestamp_format == "epoch_s":
            return np.rint(numbers * 1000.0)
        return np.where(numbers < AUTO_SECONDS_BELOW, np.rint(numbers * 1000.0), np.floor(numbers))


def _number_column(raw: list[object]) -> np.ndarray:
    """Numbers as float64; an integer too large for a double becomes NaN."""
    try:
        return np.array(raw, dtype=np.float64)
    except (OverflowError, TypeError, ValueError):
        out = np.empty(len(raw), np.float64)
        for i, x in enumerate(raw):
            try:
                out[i] = float(x)  # type: ignore[arg-type]
            except (OverflowError, TypeError, ValueError):
                out[i] = np.nan
        return out


def to_epoch_ms(raw: list[object], timestamp_format: TimestampFormat) -> tuple[np.ndarray, dict[int, str]]:
    """Convert decoded timestamp fields; returns ``(ms, problems)``.

    ``ms`` is int64 (0 where there is a problem); ``problems`` maps the index
    of each unusable timestamp to a description of what is wrong with it.
    Types have been checked by the decoder: numbers for the epoch formats,
    strings for ``iso8601``, either for ``auto``.
    """
    problems: dict[int, str] = {}
    if set(map(type, raw)) <= _NUMBER_TYPES:
        ms_float = _numbers_to_ms(_number_column(raw), timestamp_format)
    else:
        ms_float = np.full(len(raw), np.nan)
        texts: dict[str, int | str] = {}  # events of one batch often share their time text
        number_rows: list[int] = []
        for i, x in enumerate(raw):
            if type(x) is str:
                parsed = texts.get(x)
                if parsed is None:
                    parsed = texts[x] = parse_iso8601_ms(x)
                if type(parsed) is int:
                    ms_float[i] = parsed  # exact: epoch ms stays below 2**53
                else:
                    problems[i] = parsed  # type: ignore[assignment]
            else:
                number_rows.append(i)
        if number_rows:
            numbers = _number_column([raw[i] for i in number_rows])
            ms_float[np.array(number_rows, dtype=np.int64)] = _numbers_to_ms(numbers, timestamp_format)
    valid = (ms_float >= 0) & (ms_float <= MAX_TIMESTAMP_MS)  # False for NaN
    if not valid.all():
        for i in np.flatnonzero(~valid).tolist():
            if i not in problems:
                problems[i] = f"event time {raw[i]!r} is negative, not finite or after year 9999"
    ms = np.where(valid, ms_float, 0.0).astype(np.int64)
    return ms, problems
