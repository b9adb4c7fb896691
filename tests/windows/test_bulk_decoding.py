"""The bulk decoder against the reference decoder: the same events and the same problems, on hostile batches."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from stream_dp.windows import EventSchema, RejectReason
from stream_dp.windows.bulk_decoding import BulkEventDecoder
from stream_dp.windows.decoding import EventDecoder
from stream_dp.windows.specs import MAX_TIMESTAMP_MS

from ._support import NOW_MS

SKEW_MS = 300_000

# -- hostile batches ------------------------------------------------------------------------

# (group_by, group_domain): a domain is a k-RR report's, of one group-by field
group_settings = st.sampled_from([((), ()), (("page",), ()), (("page", "kind"), ()), (("page",), ("/a", 7, "\u00e9"))])
schemas = group_settings.flatmap(lambda groups: st.builds(
    EventSchema,
    unit_field=st.just("user_id"),
    timestamp_field=st.just("ts"),
    group_by=st.just(groups[0]),
    group_domain=st.just(groups[1]),
    value_field=st.sampled_from([None, "value"]),
    timestamp_format=st.sampled_from(["auto", "epoch_s", "epoch_ms", "iso8601"]),
    max_message_bytes=st.sampled_from([64, 120, 65_536]),
    max_abs_value=st.sampled_from([1e15, 1_000.0]),
    max_future_skew_ms=st.just(SKEW_MS),
    max_unit_length=st.sampled_from([4, 256]),
))

units = st.one_of(
    st.sampled_from(["u1", "u22", "user-333", "", "a\x00b", "z\u00fcrich", "\u20ac", "x" * 300, "\ud800"]),
    st.text(max_size=6),
    st.integers(-(2**64), 2**64),
    st.sampled_from([2**63 - 1, -(2**63), 2**63, 0, True, None, 1.5, [], {}]),
)
times = st.one_of(
    st.integers(NOW_MS - 3_600_000, NOW_MS),
    st.sampled_from([
        NOW_MS // 1000, NOW_MS / 1000 + 0.0005, NOW_MS + 0.7, 0, -1, -0.5, MAX_TIMESTAMP_MS, MAX_TIMESTAMP_MS + 1,
        NOW_MS + SKEW_MS, NOW_MS + SKEW_MS + 1, 2**53 + 1, 2**63, -(2**63) - 1, 10**30, 99_999_999_999, 100_000_000_000,
        "2024-01-01T00:00:00Z", "2024-01-01T00:00:00", "2024-01-01T00:09:59.999+00:00", "yesterday", "", None,
        True, [1], 1e308,
    ]),
)
groups = st.one_of(
    st.sampled_from(["/a", "/b", "", "\u00e9", 7, -1, 2**64, None, 2.5, False, ["x"]]), st.text(max_size=3),
)
numbers = st.one_of(
    st.floats(-2_000.0, 2_000.0, allow_nan=False),
    st.sampled_from([0, -0.0, 1e15, -1e15, 1e15 + 1e3, 1e16, 2**1024 - 2**970, 10**400, 1_000, 1_000.0000001, "1", None,
                     True, {"a": 1}]),
)
MISSING = object()


def maybe_missing(strategy):
    return st.one_of(strategy, strategy, strategy, st.just(MISSING))


@st.composite
def event_json(draw):
    fields = {"user_id": draw(maybe_missing(units)), "ts": draw(maybe_missing(times)),
              "page": draw(maybe_missing(groups)), "kind": draw(maybe_missing(groups)),
              "value": draw(maybe_missing(numbers))}
    body = {k: v for k, v in fields.items() if v is not MISSING}
    if draw(st.booleans()):
        body["extra"] = draw(st.sampled_from([[1, {"x": None}], "s", 3]))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:
        text = text.replace(":", ": ").replace(",", " ,\n ")  # whitespace inside is fine
    return text.encode("utf-8", "surrogatepass")


raw_garbage = st.one_of(
    st.sampled_from([
        b"", b" ", b"\n", b"null", b"[]", b"[1,2]", b'"text"', b"1", b"{", b"}", b'{"user_id":"', b'"}', b"{}", b"\xff",
        b'{"user_id":"\xc3"}', b"\xef\xbb\xbf{}", b'{"ts":1e999}', b'{"user_id":"a","ts":NaN}', b"[" * 2_000,
        b'{"user_id":"a","ts":1704067200000,"page":"p","value":1}{"user_id":"b"}', b'{"a":1} {"b":2}',
        b'{"user_id":"u","ts":1704067200000,"page":"p","value":1,"user_id":"v"}',
    ]),
    st.binary(max_size=40),
    st.just(None),
    st.just("not bytes"),
    st.builds(bytearray, event_json()),
)


def message():
    # Mostly valid-looking events, so that batches where every message is valid are common.
    return st.one_of(event_json(), event_json(), event_json(), event_json(), raw_garbage)


@st.composite
def batches(draw):
    schema = draw(schemas)
    values = draw(st.lists(message(), min_size=1, max_size=12))
    if draw(st.booleans()):
        record_ms = np.array(draw(st.lists(st.sampled_from([NOW_MS, NOW_MS - 3_600_000, -1, NOW_MS - 10**9]),
                                           min_size=len(values), max_size=len(values))), dtype=np.int64)
    else:
        record_ms = None
    return schema, values, record_ms


RARE = {
    # one event of the batch changed so that the reference refuses it, or reads it with care
    "nul unit": ("user_id", "a\x00b"),
    "non-ASCII unit": ("user_id", "z\u00fcrich"),
    "long unit": ("user_id", "x" * 9),
    "integer unit": ("user_id", 12),
    "time at the skew limit": ("ts", NOW_MS + SKEW_MS),
    "time past the skew limit": ("ts", NOW_MS + SKEW_MS + 1),
    "time after year 9999": ("ts", MAX_TIMESTAMP_MS + 1),
    "time zero": ("ts", 0),
    "time in seconds": ("ts", NOW_MS // 1000),
    "negative time": ("ts", -1),
    "record far behind": ("record", NOW_MS - 10**9),
    "group outside the domain": ("page", "/c"),
    "group of another type than the domain's": ("page", "3"),
}


@st.composite
def plausible_batches(draw):
    """Batches of events with the right fields and types, in every format; in most of them one
    event is changed in one of the ``RARE`` ways: the fast path's own ground, and where it would
    go wrong if it did."""
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value",
                         group_domain=draw(st.sampled_from([(), ("/a", "/b", 3)])),
                         timestamp_format=draw(st.sampled_from(["auto", "epoch_s", "epoch_ms"])),
                         max_future_skew_ms=SKEW_MS, max_unit_length=8)
    n = draw(st.integers(1, 12))
    time = st.one_of(st.integers(NOW_MS - 3_600_000, NOW_MS), st.floats(NOW_MS - 3_600_000, NOW_MS))
    rows = draw(st.lists(st.fixed_dictionaries({
        "user_id": st.sampled_from(["u1", "u22", "user-333", "7"]), "ts": time,
        "page": st.sampled_from(["/a", "/b", 3]), "value": st.floats(-100, 100, allow_nan=False),
    }), min_size=n, max_size=n))
    record_ms = np.full(n, NOW_MS, dtype=np.int64) if draw(st.booleans()) else None
    change = draw(st.sampled_from([None, None, None, *RARE]))
    if change is not None:
        field, value = RARE[change]
        i = draw(st.integers(0, n - 1))
        if field == "record":
            record_ms = np.full(n, NOW_MS, dtype=np.int64)
            record_ms[i] = value
        else:
            rows[i][field] = value
    return schema, [json.dumps(row).encode() for row in rows], record_ms


# -- comparison -------------------------------------------------------------------------------


def outcome(decoder, values, record_ms):
    events, problems = decoder.decode(values, NOW_MS, record_ms)
    return {
        "index": (events.index.dtype.str, events.index.tolist()),
        "units": (events.units.dtype.str, events.units.tolist()),
        "groups": None if events.group_keys is None else [(type(k).__name__, k) for k in events.group_keys],
        "ts": (events.ts_ms.dtype.str, events.ts_ms.tolist()),
        "values": None if events.values is None else (events.values.dtype.str,
                                                      [(math.copysign(1, v), abs(v)) for v in events.values.tolist()]),
        "problems": [(int(i), RejectReason(r).value, d) for i, r, d in problems],
    }


def disagreement(bulk_type, schema, values, record_ms):
    """The two outcomes if ``bulk_type`` disagrees with the reference on this batch, else None."""
    expected = outcome(EventDecoder(schema), values, record_ms)
    got = outcome(bulk_type(schema), values, record_ms)
    return None if got == expected else (expected, got)


BULK_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@BULK_SETTINGS
@given(batches())
def test_bulk_decoder_decides_every_message_as_the_reference_does(batch):
    schema, values, record_ms = batch
    assert disagreement(BulkEventDecoder, schema, values, record_ms) is None


@BULK_SETTINGS
@given(plausible_batches())
def test_bulk_decoder_matches_the_reference_on_plausible_batches(batch):
    schema, values, record_ms = batch
    assert disagreement(BulkEventDecoder, schema, values, record_ms) is None


def test_a_batch_of_valid_events_takes_the_fast_path_and_one_bad_message_the_reference():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value",
                         timestamp_format="epoch_ms")
    good = [json.dumps({"user_id": f"u{i}", "ts": NOW_MS - i, "page": "/p", "value": i}).encode() for i in range(50)]
    decoder = BulkEventDecoder(schema)
    events, problems = decoder.decode(good, NOW_MS)
    assert (decoder.fast_batches, decoder.reference_batches, len(events), problems) == (1, 0, 50, [])
    events, problems = decoder.decode([*good, b"{"], NOW_MS)
    assert (decoder.fast_batches, decoder.reference_batches, len(events)) == (1, 1, 50)
    assert [(i, r) for i, r, _ in problems] == [(50, RejectReason.INVALID_JSON)]


# -- the comparison catches a doctored decoder -------------------------------------------------


class _IntegersAlwaysMilliseconds(BulkEventDecoder):
    """Doctored: takes integer times as milliseconds whatever the timestamp format."""

    def __init__(self, schema):
        super().__init__(schema)
        self._ints_are_ms = True


class _RecordTimeIgnored(BulkEventDecoder):
    """Doctored: does not compare event times with their records' timestamps."""

    def _fast(self, values, now_ms, record_ms):
        return super()._fast(values, now_ms, None)


class _NulUnitsAccepted(BulkEventDecoder):
    """Doctored: lets unit ids with a NUL through."""

    def _fast(self, values, now_ms, record_ms):
        cleaned = [v.replace(b"\\u0000", b"") if isinstance(v, bytes) else v for v in values]
        decoded = super()._fast(cleaned, now_ms, record_ms)
        return decoded


@pytest.mark.parametrize("doctored", [_IntegersAlwaysMilliseconds, _RecordTimeIgnored, _NulUnitsAccepted])
def test_the_comparison_finds_a_doctored_decoder_out(doctored):
    found = find(
        plausible_batches(),
        lambda batch: disagreement(doctored, *batch) is not None,
        settings=settings(max_examples=5_000, deadline=None, suppress_health_check=list(HealthCheck), database=None),
    )
    schema, values, record_ms = found
    expected, got = disagreement(doctored, schema, values, record_ms)
    assert expected != got


@pytest.mark.parametrize("decoder_class", [BulkEventDecoder, EventDecoder])
def test_a_message_over_max_message_bytes_is_rejected_by_its_length_before_any_decoding(decoder_class):
    """A flood of large messages costs their length check, never a JSON decode: a valid event over the
    limit is refused as oversize, and the decoder is never handed it."""
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", max_message_bytes=4_096)
    small = json.dumps({"user_id": "u1", "ts": NOW_MS}).encode()
    large = json.dumps({"user_id": "u2", "ts": NOW_MS, "pad": "x" * 60_000}).encode()
    decoder = decoder_class(schema)
    handed: list[bytes] = []
    reference = decoder.reference if isinstance(decoder, BulkEventDecoder) else decoder
    decode_one = reference._decode_one

    def recording(raw):
        handed.append(bytes(raw))
        return decode_one(raw)

    reference._decode_one = recording
    if isinstance(decoder, BulkEventDecoder):
        decoder._decode_one = recording
    events, problems = decoder.decode([large, small, large], NOW_MS)
    assert events.index.tolist() == [1]
    assert [(i, reason) for i, reason, _ in problems] == [(0, RejectReason.OVERSIZE), (2, RejectReason.OVERSIZE)]
    assert large not in handed and small in handed
