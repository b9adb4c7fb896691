"""Dead letters: whole events in records that fit, joined back exactly; earlier versions read as they
are; an unknown version named."""

from __future__ import annotations

import os
import random

import pytest

from stream_dp.wire import UnknownWireVersion, WireFormatError
from stream_dp.wire.letters import DEAD_LETTER_VERSION, dead_letter_records, reassemble


def _headers(offset: int = 7) -> list[tuple[str, bytes]]:
    return [("reason", b"oversize"), ("detail", b"d" * 500), ("query", b"q"), ("source", f"in/0/{offset}".encode())]


def _size(value: bytes, headers: list, key: bytes) -> int:
    return len(value) + len(key) + sum(len(k) + len(v) for k, v in headers)


def test_a_small_dead_letter_is_one_record_with_its_wire_version():
    ((value, headers),) = dead_letter_records(b'{"bad":', _headers(), 1_000_000)
    assert value == b'{"bad":' and dict(headers)["wire"] == DEAD_LETTER_VERSION and "chunk" not in dict(headers)
    (letter,) = reassemble([(b"in/0/7", value, headers)])
    assert letter.value == b'{"bad":' and letter.source == "in/0/7" and letter.headers["reason"] == b"oversize"


def test_a_large_event_is_split_within_the_limit_and_joined_back_exactly_once():
    events = {offset: os.urandom(random.Random(offset).randrange(50_000, 300_000)) for offset in range(4)}
    records = []
    for offset, event in events.items():
        key = f"in/0/{offset}".encode()
        pieces = dead_letter_records(event, _headers(offset), 32_768)
        assert len(pieces) > 1 and all(_size(v, h, key) + 64 <= 32_768 for v, h in pieces)
        records += [(key, v, h) for v, h in pieces]
    records += records[:3]  # a replay re-sent the first pieces of the first letter
    random.Random(1).shuffle(records)
    letters = reassemble(records)
    assert sorted((letter.source, letter.value) for letter in letters) == sorted((f"in/0/{o}", e) for o, e in events.items())
    assert all("chunk" not in d.headers and d.headers["wire"] == DEAD_LETTER_VERSION for d in letters)


def test_dead_letters_of_earlier_versions_read_as_they_are():
    old = [(None, b"x" * 10, [("reason", b"oversize"), ("truncated_from_bytes", b"2000000"), ("source", b"in/0/1")])]
    (letter,) = reassemble(old)
    assert letter.value == b"x" * 10 and letter.headers["truncated_from_bytes"] == b"2000000"


def test_an_unknown_version_and_inconsistent_pieces_are_refused():
    with pytest.raises(UnknownWireVersion, match="wire version '3'"):
        reassemble([(b"k", b"v", [("source", b"in/0/1"), ("wire", b"3")])])
    pieces = dead_letter_records(os.urandom(40_000), _headers(), 16_384)
    forged = [(b"k", v[::-1], h) for v, h in pieces]
    with pytest.raises(WireFormatError, match="does not match"):
        reassemble(forged)
    with pytest.raises(WireFormatError, match="corrupt"):
        reassemble([(b"k", b"v", [("source", b"s"), ("wire", DEAD_LETTER_VERSION), ("chunk", b"x/2")])])


def test_too_small_a_limit_is_refused_with_the_size_needed():
    with pytest.raises(ValueError, match="must take records of at least"):
        dead_letter_records(b"x" * 5_000, _headers(), 1_500)
