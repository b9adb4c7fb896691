"""Dead letters: a bounded copy of each rejected event (head, size, digest) in one record that fits;
whole events split by an earlier version joined back exactly; an unknown version named."""

from __future__ import annotations

import os
import random

import pytest

from stream_dp.wire import UnknownWireVersion, WireFormatError
from stream_dp.wire.chunks import payload_digest
from stream_dp.wire.letters import (
    DEAD_LETTER_HEAD_BYTES,
    DEAD_LETTER_VERSION,
    SPLIT_VERSION,
    dead_letter_record,
    reassemble,
)


def _headers(offset: int = 7) -> list[tuple[str, bytes]]:
    return [("reason", b"oversize"), ("detail", b"d" * 500), ("query", b"q"), ("source", f"in/0/{offset}".encode())]


def _size(value: bytes, headers: list, key: bytes) -> int:
    return len(value) + len(key) + sum(len(k) + len(v) for k, v in headers)


def test_a_small_dead_letter_is_the_whole_event_with_its_size_digest_and_wire_version():
    value, headers = dead_letter_record(b'{"bad":', _headers(), 1_000_000)
    assert value == b'{"bad":' and dict(headers)["wire"] == DEAD_LETTER_VERSION
    assert dict(headers)["size"] == b"7" and dict(headers)["digest"] == payload_digest(b'{"bad":').encode()
    (letter,) = reassemble([(b"in/0/7", value, headers)])
    assert letter.value == b'{"bad":' and letter.whole and letter.size == 7
    assert letter.source == "in/0/7" and letter.headers["reason"] == b"oversize"


@pytest.mark.parametrize("size", [DEAD_LETTER_HEAD_BYTES + 1, 60 * 1024, 10 * 1024 * 1024])
def test_a_large_event_is_copied_as_its_head_size_and_digest_in_one_small_record(size):
    event = os.urandom(size)
    value, headers = dead_letter_record(event, _headers(), 8 * 1024)
    assert value == event[:DEAD_LETTER_HEAD_BYTES]
    assert _size(value, headers, b"in/0/7") + 64 <= 8 * 1024  # whatever the event's size
    (letter,) = reassemble([(b"in/0/7", value, headers)])
    assert not letter.whole and letter.size == size
    assert letter.headers["digest"] == payload_digest(event).encode()  # identifies the event on its input topic


def _split(event: bytes, offset: int, room: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """A whole event as wire version 2 wrote it: pieces of ``room`` bytes with chunk, size and digest."""
    count = -(-len(event) // room)
    stamped = [*_headers(offset), ("wire", SPLIT_VERSION)]
    extra = [("size", str(len(event)).encode()), ("digest", payload_digest(event).encode())]
    return [(f"in/0/{offset}".encode(), event[i * room:(i + 1) * room],
             [*stamped, ("chunk", f"{i}/{count}".encode()), *extra]) for i in range(count)]


def test_events_split_by_the_earlier_version_are_joined_back_exactly_once():
    events = {offset: os.urandom(random.Random(offset).randrange(50_000, 300_000)) for offset in range(4)}
    records = [record for offset, event in events.items() for record in _split(event, offset, 30_000)]
    records += records[:3]  # a replay re-sent the first pieces of the first letter
    random.Random(1).shuffle(records)
    letters = reassemble(records)
    assert sorted((letter.source, letter.value) for letter in letters) == sorted((f"in/0/{o}", e) for o, e in events.items())
    assert all("chunk" not in d.headers and d.headers["wire"] == SPLIT_VERSION and d.whole for d in letters)


def test_dead_letters_of_earlier_versions_read_as_they_are():
    old = [(None, b"x" * 10, [("reason", b"oversize"), ("truncated_from_bytes", b"2000000"), ("source", b"in/0/1")])]
    (letter,) = reassemble(old)
    assert letter.value == b"x" * 10 and letter.headers["truncated_from_bytes"] == b"2000000" and not letter.whole


def test_an_unknown_version_and_inconsistent_pieces_are_refused():
    with pytest.raises(UnknownWireVersion, match="wire version '4'"):
        reassemble([(b"k", b"v", [("source", b"in/0/1"), ("wire", b"4")])])
    forged = [(key, value[::-1], headers) for key, value, headers in _split(os.urandom(40_000), 7, 16_000)]
    with pytest.raises(WireFormatError, match="does not match"):
        reassemble(forged)
    with pytest.raises(WireFormatError, match="corrupt"):
        reassemble([(b"k", b"v", [("source", b"s"), ("wire", SPLIT_VERSION), ("chunk", b"x/2")])])


def test_too_small_a_limit_is_refused_with_the_size_needed():
    with pytest.raises(ValueError, match="must take records of at least"):
        dead_letter_record(b"x" * 5_000, _headers(), 1_500)
