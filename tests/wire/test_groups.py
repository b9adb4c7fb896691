"""Group-key columns: every key comes back as it went in (strings, integers, both, NUL inside), and the
bulk JSON rendering is byte for byte ``orjson.dumps``."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.wire import WireFormatError, decode_frame, encode_frame
from stream_dp.wire.groups import KeyRows, decode_columns, encode_columns, json_values, key_columns, keys_from_columns

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)  # no lone surrogates: JSON refuses them
VALUE = st.one_of(TEXT, INT64)


def _round_trip(keys: list[tuple], width: int) -> list[tuple]:
    described, sections = encode_columns(key_columns(keys, width))
    frame = decode_frame(encode_frame({"groups": described}, sections))
    return keys_from_columns(decode_columns(frame.fields["groups"], frame.sections, len(keys)), len(keys))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3).flatmap(lambda w: st.tuples(st.just(w), st.lists(st.tuples(*[VALUE] * w), max_size=40))))
def test_keys_round_trip_whatever_their_values(case):
    width, keys = case
    back = _round_trip(keys, width)
    assert back == keys
    assert [tuple(map(type, k)) for k in back] == [tuple(map(type, k)) for k in keys]  # "1" stays a string


@pytest.mark.parametrize(
    "keys",
    [[("a\x00b",), ("",), ("c",)], [("",)], [("\x00",), ("\x00\x00",)], [(1,), ("1",), (-(2**63),)], [], [("é€😀",)]],
    ids=["nul-inside", "one-empty", "only-nuls", "mixed", "no-rows", "unicode"],
)
def test_awkward_keys_round_trip(keys):
    assert _round_trip(keys, 1) == keys


def test_queries_without_group_fields_have_empty_keys():
    assert _round_trip([(), ()], 0) == [(), ()]
    with pytest.raises(ValueError, match="empty tuples"):
        key_columns([("a",)], 0)
    with pytest.raises(ValueError, match="fields"):
        key_columns([("a", "b"), ("c",)], 2)


def test_other_value_types_are_refused():
    with pytest.raises(TypeError, match="strings or integers"):
        encode_columns([[1.5, "a"]])


def test_corrupt_columns_raise_one_error_type():
    described, sections = encode_columns([["a", "b"], [1, 2]])
    with pytest.raises(WireFormatError, match="expected 3"):
        decode_columns(described, sections, 3)
    with pytest.raises(WireFormatError):
        decode_columns([{"kind": "float"}], sections, 2)
    with pytest.raises(WireFormatError):
        decode_columns(described, {}, 2)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(TEXT, max_size=30), st.lists(INT64, max_size=30), st.lists(VALUE, max_size=30),
                 st.lists(st.sampled_from(['"', "\\", "\n", "\x00", "\x1f", "\x7f", "a", "é", "\u2028"]).map(str),
                          max_size=30)))
def test_json_values_are_orjsons_exactly(column):
    assert json_values(column) == [orjson.dumps(v) for v in column]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3).flatmap(lambda w: st.tuples(st.just(w), st.lists(st.tuples(*[VALUE] * w), max_size=12))),
       st.integers(-15, 15), st.integers(-15, 15), st.integers(-3, 3).filter(bool))
def test_key_rows_read_as_the_list_of_tuples_they_hold(case, start, stop, step):
    """``KeyRows`` (tuples built when read) against the plain list of the same keys: length, each index
    (negative ones too, and out of range), slices, iteration and equality."""
    width, keys = case
    rows = KeyRows(key_columns(keys, width), len(keys))
    assert len(rows) == len(keys) and list(rows) == keys and rows == keys and keys == rows
    for index in range(-len(keys) - 2, len(keys) + 2):
        if -len(keys) <= index < len(keys):
            assert rows[index] == keys[index]
        else:
            with pytest.raises(IndexError):
                rows[index]
    assert rows[start:stop:step] == keys[start:stop:step]
    assert rows != keys + [()] and (not keys or rows != keys[:-1])
    if keys and width:
        assert rows != [tuple(f"~{value}" for value in keys[0])] + keys[1:]  # another first key
