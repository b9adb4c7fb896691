"""Batch decoding for the common case: every message of the batch a valid event.

``EventDecoder`` (``decoding``) is the reference: it screens every message,
decodes what passes, and names a reason for each one that fails, keeping
track of positions all the way. ``BulkEventDecoder`` gives exactly its result
-- the same events in the same columns and the same problems with the same
reasons and details -- but first tries the whole batch in one pass of C
calls: one join and ASCII test of all values, one ``map`` of the typed msgspec
decoder, one column per field, one array conversion each. The moment anything
in the batch is unusual (a value that is not bytes, too long, not ASCII, not a
valid event, an integer or non-ASCII unit id, a NUL, a timestamp that needs
converting or is out of range, an event too far ahead of the clocks) it hands
the whole batch to the reference decoder, which then decides every message.
So the fast path only ever accepts batches in which the reference decoder
accepts every message, and produces the very columns it would.

``tests/windows/test_bulk_decoding.py`` checks this on hostile batches against
the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import msgspec
import numpy as np

from stream_dp.windows.decoding import DecodedEvents, EventDecoder, Problem
from stream_dp.windows.specs import MAX_TIMESTAMP_MS, EventSchema
from stream_dp.windows.timestamps import to_epoch_ms

_DECODE_ERRORS = (msgspec.DecodeError, ValueError, TypeError, RecursionError)
_UNIT = attrgetter("u")
_TIME = attrgetter("t")


class BulkEventDecoder:
    """``EventDecoder`` with a fast path for batches of valid events (see the module docstring)."""

    def __init__(self, schema: EventSchema) -> None:
        self.schema = schema
        self.reference = EventDecoder(schema)
        self._decode_one = self.reference._decode_one
        self._group_getter = self.reference._group_getter
        self._ints_are_ms = schema.timestamp_format == "epoch_ms"
        #: batches decoded by the fast path and handed to the reference (for tests and profiles)
        self.fast_batches = 0
        self.reference_batches = 0

    def decode(
        self, values: Sequence[bytes | None], now_ms: int, record_ms: np.ndarray | None = None
    ) -> tuple[DecodedEvents, list[Problem]]:
        """Same contract as ``EventDecoder.decode``."""
        decoded = self._fast(values, now_ms, record_ms)
        if decoded is None:
            self.reference_batches += 1
            return self.reference.decode(values, now_ms, record_ms)
        self.fast_batches += 1
        return decoded, []

    def _fast(self, values: Sequence[bytes | None], now_ms: int, record_ms: np.ndarray | None) -> DecodedEvents | None:
        """The batch's events if every message is a valid event, else None."""
        schema = self.schema
        n = len(values)
        if n == 0:
            return None
        try:
            joined = b"\n".join(values)  # type: ignore[arg-type]
        except TypeError:  # a tombstone or a value that is not bytes
            return None
        # ASCII is valid UTF-8; the total bounds every message, so lengths are read only when it is large.
        if not joined.isascii():
            return None
        if len(joined) > schema.max_message_bytes and max(map(len, values)) > schema.max_message_bytes:  # type: ignore[arg-type]
            return None
        try:
            events = list(map(self._decode_one, values))
        except _DECODE_ERRORS:
            return None
        units = list(map(_UNIT, events))
        if set(map(type, units)) != {str}:  # integer ids are turned into strings by the reference
            return None
        joined_units = "".join(units)
        if not joined_units.isascii() or "\x00" in joined_units:
            return None
        ts_ms = self._times(list(map(_TIME, events)))
        if ts_ms is None:
            return None
        if (ts_ms > now_ms + schema.max_future_skew_ms).any():
            return None
        if record_ms is not None and (ts_ms > record_ms + schema.max_future_skew_ms).any():
            return None
        values_col = self.reference.values_of(events)
        if self.schema.report_field is not None:
            values_col, bad_reports = self.reference.reports_of(events)
            if bad_reports:
                return None
        group_keys = list(map(self._group_getter, events)) if self._group_getter is not None else None
        return DecodedEvents(np.arange(n, dtype=np.int64), np.array(units, dtype="S"), group_keys, ts_ms, values_col)

    def _times(self, raw: list[object]) -> np.ndarray | None:
        """Event times in epoch ms if every one is valid, else None."""
        if self._ints_are_ms and set(map(type, raw)) == {int}:
            # Integer milliseconds: what the reference computes through floats, exactly (all valid
            # times are below 2**53); anything out of range goes back to it.
            try:
                ms = np.array(raw, dtype=np.int64)
            except OverflowError:
                return None
            if ms.min() < 0 or ms.max() > MAX_TIMESTAMP_MS:
                return None
            return ms
        ms, problems = to_epoch_ms(raw, self.schema.timestamp_format)
        return None if problems else ms
