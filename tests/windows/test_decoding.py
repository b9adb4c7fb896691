from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.windows import EventSchema, RejectReason
from stream_dp.windows.classify import classify_message
from stream_dp.windows.decoding import EventDecoder

from ._support import NOW_MS, event


def decode(schema: EventSchema, values: list[bytes | None]):
    return EventDecoder(schema).decode(values, NOW_MS)


def test_columns_of_valid_events():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value")
    events, problems = decode(schema, [event("a", 1_704_067_200, "/x", 2.5), event(7, 1_704_067_200_001, 3, -1)])
    assert problems == []
    assert events.index.tolist() == [0, 1]
    assert events.units.tolist() == [b"a", b"7"]  # integer ids are read as their decimal string
    assert events.group_keys == ["/x", 3]
    assert events.ts_ms.tolist() == [1_704_067_200_000, 1_704_067_200_001]
    assert events.values.tolist() == [2.5, -1.0]


def test_several_group_fields_make_tuples_and_none_makes_one_group():
    multi = EventSchema(unit_field="u", timestamp_field="t", group_by=("a", "b"))
    events, _ = decode(multi, [b'{"u":"x","t":1704067200000,"a":"p","b":2,"ignored":[1,{}]}'])
    assert events.group_keys == [("p", 2)] and events.values is None
    ungrouped = EventSchema(unit_field="u", timestamp_field="t")
    events, _ = decode(ungrouped, [b'{"u":"x","t":1704067200000}'])
    assert events.group_keys is None and len(events) == 1


def test_field_names_need_not_be_identifiers():
    schema = EventSchema(unit_field="user id", timestamp_field="@timestamp", group_by=("class",), value_field="v-1")
    events, problems = decode(schema, [b'{"user id":"x","@timestamp":"2024-01-01T00:00:00Z","class":"c","v-1":4}'])
    assert problems == [] and events.values.tolist() == [4.0]


def test_non_ascii_unit_ids_are_kept_as_utf8():
    events, problems = decode(
        EventSchema(unit_field="u", timestamp_field="t"), [b'{"u":"z\xc3\xbcrich-\xe2\x82\xac","t":1704067200000}']
    )
    assert problems == []
    assert events.units[0].decode("utf-8") == "zürich-€"


def test_timestamp_format_restricts_json_types():
    epoch = EventSchema(unit_field="u", timestamp_field="t", timestamp_format="epoch_ms")
    _, problems = decode(epoch, [b'{"u":"x","t":"2024-01-01T00:00:00Z"}'])
    assert [(p[0], p[1]) for p in problems] == [(0, RejectReason.WRONG_TYPE)]
    iso = EventSchema(unit_field="u", timestamp_field="t", timestamp_format="iso8601")
    _, problems = decode(iso, [b'{"u":"x","t":1704067200000}'])
    assert [(p[0], p[1]) for p in problems] == [(0, RejectReason.WRONG_TYPE)]
    seconds = EventSchema(unit_field="u", timestamp_field="t", timestamp_format="epoch_s")
    events, _ = decode(seconds, [b'{"u":"x","t":1704067200000}'])  # taken as seconds: far future
    assert len(events) == 0


def test_every_message_is_either_an_event_or_a_problem():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value")
    values = [
        event("a", NOW_MS),
        None,
        b"{",
        event("", NOW_MS),
        event("b", NOW_MS + 10**9),
        event("c", NOW_MS),
        b"x" * 70_000,
    ]
    events, problems = decode(schema, values)
    reasons = {index: reason for index, reason, _ in problems}
    assert events.index.tolist() == [0, 5]
    assert reasons == {
        1: RejectReason.TOMBSTONE,
        2: RejectReason.INVALID_JSON,
        3: RejectReason.EMPTY_UNIT,
        4: RejectReason.FUTURE_TIMESTAMP,
        6: RejectReason.OVERSIZE,
    }


def test_values_that_are_not_bytes_are_rejected_not_raised():
    schema = EventSchema(unit_field="u", timestamp_field="t")
    values = [b'{"u":"x","t":1704067200000}', 12345, '{"u":"y","t":1704067200000}', None]
    events, problems = decode(schema, values)  # type: ignore[arg-type]
    assert len(events) == 1
    assert sorted(p[:2] for p in problems) == [
        (1, RejectReason.INVALID_JSON),
        (2, RejectReason.INVALID_JSON),
        (3, RejectReason.TOMBSTONE),
    ]
    assert "a str, not bytes" in [p[2] for p in problems if p[0] == 2][0]


def test_memoryview_values_are_read():
    schema = EventSchema(unit_field="u", timestamp_field="t")
    events, problems = decode(schema, [memoryview(b'{"u":"x","t":1704067200000}')])  # type: ignore[list-item]
    assert problems == [] and len(events) == 1


def test_classifier_accepts_what_is_valid():
    schema = EventSchema(unit_field="u", timestamp_field="t", value_field="v")
    assert classify_message(b'{"u":"x","t":1,"v":2}', schema) is None
    reason, detail = classify_message(b'{"u":"x","t":1,"v":"2"}', schema)  # type: ignore[misc]
    assert reason is RejectReason.WRONG_TYPE and "'v'" in detail and "a string" in detail


def test_decoded_columns_have_the_documented_dtypes():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value")
    events, _ = decode(schema, [event("a", NOW_MS)])
    assert events.index.dtype == np.int64 and events.ts_ms.dtype == np.int64
    assert events.values.dtype == np.float64 and events.units.dtype.kind == "S"


# -- the decoder against an independent oracle on near-valid events ---------------------------------

ORACLE_SCHEMA = EventSchema(
    unit_field="user_id",
    timestamp_field="ts",
    group_by=("page",),
    value_field="value",
    max_abs_value=1e6,
    max_unit_length=8,
)
INT64 = (-(2**63), 2**63 - 1)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
MISSING = object()


def maybe(strategy):
    return st.one_of(st.just(MISSING), json_values, strategy)


def oracle_accepts(unit, ts, page, value) -> bool:
    """Validity by the documented rules, written independently of the decoder."""

    def is_int(x):
        return type(x) is int

    def is_number(x):
        return type(x) in (int, float)

    if not (
        (type(unit) is str and 1 <= len(unit) <= 8 and "\x00" not in unit)
        or (is_int(unit) and INT64[0] <= unit <= INT64[1])
    ):
        return False
    if not ((type(page) is str) or (is_int(page) and INT64[0] <= page <= INT64[1])):
        return False
    if not (is_number(value) and abs(float(value)) <= 1e6):
        return False
    if not is_number(ts):
        return False
    ms = round(ts * 1000) if ts < 1e11 else int(ts // 1)
    return 0 <= ms <= NOW_MS + ORACLE_SCHEMA.max_future_skew_ms


@settings(max_examples=300, deadline=None)
@given(
    unit=maybe(st.one_of(st.text(min_size=0, max_size=10), st.integers(-(2**64), 2**64))),
    ts=maybe(st.one_of(st.integers(-10, 2 * NOW_MS), st.floats(-1.0, 2e12, allow_nan=False))),
    page=maybe(st.one_of(st.text(max_size=4), st.integers(-(2**64), 2**64))),
    value=maybe(st.one_of(st.floats(-2e6, 2e6, allow_nan=False), st.integers(-(2**64), 2**64))),
)
def test_decoder_agrees_with_the_oracle(unit, ts, page, value):
    body = {k: v for k, v in {"user_id": unit, "ts": ts, "page": page, "value": value}.items() if v is not MISSING}
    raw = json.dumps(body).encode()
    events, problems = EventDecoder(ORACLE_SCHEMA).decode([raw], NOW_MS)
    assert len(events) + len(problems) == 1
    expected = all(v is not MISSING for v in (unit, ts, page, value)) and oracle_accepts(unit, ts, page, value)
    assert (len(events) == 1) == expected, problems
