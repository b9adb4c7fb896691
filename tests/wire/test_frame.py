"""Binary frames: numpy columns and bytes in, the same out; a wire version this worker does not read is
named as such; anything corrupt is one error type, never a crash."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import zstandard

from stream_dp.wire import BINARY_VERSION, UnknownWireVersion, WireFormatError, decode_frame, encode_frame, is_binary
from stream_dp.wire.frame import KIND_CHUNK, MAGIC, PREFIX


def _sections() -> dict:
    rng = np.random.default_rng(1)
    return {
        "i8": rng.integers(-(2**62), 2**62, 1_000),
        "f8": np.array([0.0, -0.0, 1.5, np.inf, -np.inf, np.nan, 1e-300]),
        "u4": np.arange(10, dtype=np.uint32),
        "i4": np.array([-1, 2], dtype=np.int32),
        "u1": np.array([0, 255], dtype=np.uint8),
        "text": b"a\x00b\xff",
        "empty": np.zeros(0, dtype=np.int64),
    }


def test_sections_and_fields_round_trip_exactly():
    sections = _sections()
    frame = decode_frame(encode_frame({"type": "t", "n": 3, "nested": {"a": [1, "x"]}}, sections))
    assert frame.fields == {"type": "t", "n": 3, "nested": {"a": [1, "x"]}}
    assert list(frame.sections) == list(sections)
    for name, value in sections.items():
        got = frame.sections[name]
        if isinstance(value, bytes):
            assert got == value
        else:
            assert got.dtype == value.dtype and got.tobytes() == np.ascontiguousarray(value).tobytes(), name


def test_big_endian_and_strided_arrays_are_written_little_endian():
    values = np.arange(12, dtype=">i8")[::3]
    frame = decode_frame(encode_frame({}, {"v": values}))
    assert frame.sections["v"].tolist() == [0, 3, 6, 9]


def test_other_dtypes_and_the_reserved_field_are_refused():
    with pytest.raises(TypeError, match="dtype"):
        encode_frame({}, {"c": np.zeros(2, dtype=np.complex128)})
    with pytest.raises(ValueError, match="reserved"):
        encode_frame({"sections": []}, {})


def test_a_frame_is_told_apart_from_json_by_its_first_byte():
    assert is_binary(encode_frame({}, {}))
    assert not is_binary(orjson.dumps({"v": 1}))
    assert not is_binary(b"")


def test_an_unknown_version_is_named_with_what_to_do():
    value = bytearray(encode_frame({"type": "partial"}, {"c": np.arange(3)}))
    value[4] = BINARY_VERSION + 1
    with pytest.raises(UnknownWireVersion) as raised:
        decode_frame(bytes(value))
    assert raised.value.version == BINARY_VERSION + 1
    message = str(raised.value)
    assert f"wire version {BINARY_VERSION + 1}" in message and "run the same version on every worker" in message
    assert isinstance(raised.value, WireFormatError)


def _frame_with(header: bytes, body: bytes, kind: bytes = b"F") -> bytes:
    return PREFIX.pack(MAGIC, BINARY_VERSION, kind, len(header)) + header + body


@pytest.mark.parametrize(
    "value",
    [
        MAGIC + b"\x02",  # shorter than the prefix
        _frame_with(b'{"sections": []}', b"")[:-1] + b"",  # fine header, no body: zstd refuses
        PREFIX.pack(MAGIC, BINARY_VERSION, b"F", 100) + b"{}",  # header longer than the record
        _frame_with(b"not json", b""),
        _frame_with(b"[1]", b""),
        _frame_with(b"{}", zstandard.compress(b"")),  # no section table
        _frame_with(b'{"sections": [["a", "c16", 1, false]]}', zstandard.compress(b"x" * 16)),
        _frame_with(b'{"sections": [["a", "i8", 2, false]]}', zstandard.compress(b"x" * 8)),  # body too short
        _frame_with(b'{"sections": [["a", "i8", 1, false]]}', b"not zstd"),
        _frame_with(b'{"sections": [["a", "i8", 1e12, false]]}', zstandard.compress(b"")),  # absurd size
        _frame_with(b'{"sections": []}', zstandard.compress(b""), kind=KIND_CHUNK),
    ],
    ids=["short", "no-body", "truncated-header", "header-not-json", "header-not-object", "no-table", "bad-dtype",
         "short-body", "body-not-zstd", "absurd-size", "a-chunk"],
)
def test_corrupt_frames_raise_one_error_type(value):
    with pytest.raises(WireFormatError):
        decode_frame(value)


def test_numeric_sections_are_shuffled_for_compression():
    counts = np.random.default_rng(2).integers(0, 50, 100_000)
    shuffled = encode_frame({}, {"c": counts})
    plain = zstandard.ZstdCompressor(level=1).compress(counts.astype("<i8").tobytes())
    assert len(shuffled) < 0.85 * len(plain)
