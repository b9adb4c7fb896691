"""Chunking: a payload of any size in records that fit, reassembled exactly once from any order,
duplicates and replays; incomplete payloads hold the commit and are given up on the rules."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.wire import Assembled, ChunkAssembler, WireFormatError, chunk_records, decode_chunk, read_prefix
from stream_dp.wire.chunks import CHUNK_HEADER_ROOM


def _key(stream: dict) -> tuple:
    return stream["query"], stream["window"], stream["partition"]


def _stream(partition: int = 0, window: int = 60_000) -> dict:
    return {"type": "partial", "query": "q", "window": window, "partition": partition}


def _chunks(payload: bytes, size: int, **stream) -> list:
    out = []
    for record in chunk_records(_stream(**stream), payload, size):
        kind, fields, start = read_prefix(record, "test")
        assert kind == b"C"
        out.append(decode_chunk(fields, record[start:]))
    return out


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 5_000), piece=st.integers(1, 700), order=st.randoms(use_true_random=False))
def test_any_payload_comes_back_whole_once_from_any_order(size, piece, order):
    payload = os.urandom(size)
    records = chunk_records(_stream(), payload, piece)
    assert len(records) == max(1, -(-size // piece))
    assert all(len(r) <= piece + CHUNK_HEADER_ROOM for r in records)
    chunks = [(c, i) for i, c in enumerate(_chunks(payload, piece))]
    with_duplicates = chunks + chunks[: len(chunks) // 2]
    order.shuffle(with_duplicates)
    assembler = ChunkAssembler(_key)
    whole = [a for c, i in with_duplicates if (a := assembler.add(c, (0, i), 1_000 + i)) is not None]
    # once: copies read after the payload completed start a new emission that never completes alone,
    # unless the whole payload was one chunk (then each copy is the whole payload again)
    assert len(whole) >= 1 and all(w.payload == payload for w in whole)
    first = whole[0]
    assert isinstance(first, Assembled) and first.stream == _stream() and first.key == ("q", 60_000, 0)
    assert first.oldest_timestamp_ms == 1_000  # chunk 0's: every chunk is among those that completed it


def test_a_writer_that_died_mid_way_is_superseded_by_its_replay():
    assembler = ChunkAssembler(_key)
    first = _chunks(b"first emission " * 100, 200)
    replay = _chunks(b"replayed emission " * 100, 200)  # another close time: another digest
    for offset, chunk in enumerate(first[:3]):
        assert assembler.add(chunk, (0, offset), 1) is None
    assert assembler.holds() == [(0, 0)]  # the commit may not pass the first chunk
    whole = None
    for offset, chunk in enumerate(replay, start=10):
        whole = assembler.add(chunk, (0, offset), 2) or whole
    assert whole is not None and whole.payload == b"replayed emission " * 100
    assert whole.sources[0] == (0, 10)
    assert assembler.incomplete == 0 and assembler.holds() == []


def test_streams_of_other_partials_never_mix():
    assembler = ChunkAssembler(_key)
    a, b = _chunks(b"A" * 1000, 300, partition=0), _chunks(b"B" * 1000, 300, partition=1)
    results = []
    for offset, (x, y) in enumerate(zip(a, b)):
        results += [assembler.add(x, (0, 2 * offset), 1), assembler.add(y, (0, 2 * offset + 1), 1)]
    payloads = sorted(r.payload for r in results if r is not None)
    assert payloads == [b"A" * 1000, b"B" * 1000]


def test_chunks_that_disagree_or_do_not_match_their_digest_are_refused():
    good = _chunks(b"x" * 1000, 400)
    assembler = ChunkAssembler(_key)
    assembler.add(good[0], (0, 0), 1)
    liar = type(good[1])(good[1].stream, good[1].digest, 1, 5, good[1].size, good[1].piece)
    with pytest.raises(WireFormatError, match="disagree"):
        assembler.add(liar, (0, 1), 1)
    assert assembler.incomplete == 0
    forged = [type(c)(c.stream, c.digest, c.index, c.count, c.size, c.piece.replace(b"x", b"y")) for c in good]
    assembler = ChunkAssembler(_key)
    with pytest.raises(WireFormatError, match="does not match"):
        for offset, chunk in enumerate(forged):
            assembler.add(chunk, (0, offset), 1)


@pytest.mark.parametrize(
    "fields",
    [{}, {"chunk": [2, 2], "size": 3, "digest": "d"}, {"chunk": [0, 1], "size": 1, "digest": "d"},
     {"chunk": "0/1", "size": 3, "digest": "d"}, {"chunk": [0, 1], "size": "x", "digest": "d"}],
    ids=["no-fields", "index-past-count", "longer-than-size", "not-a-pair", "size-not-int"],
)
def test_corrupt_chunk_headers_are_refused(fields):
    with pytest.raises(WireFormatError, match="corrupt chunk header"):
        decode_chunk({"query": "q", **fields}, b"abc")


def test_incomplete_payloads_are_given_up_by_record_time_window_or_partition():
    assembler = ChunkAssembler(_key)
    stale, kept, released = (_chunks(b"s" * 900, 300, window=w) for w in (0, 60_000, 120_000))
    assembler.add(stale[0], (0, 0), 1_000)
    assembler.add(kept[0], (1, 0), 1_000)
    assembler.add(released[0], (0, 1), 1_000)
    # partition 0 was read on to record time 40 s; partition 1 only to 1 s
    through = {0: 40_000, 1: 1_000}
    dropped = assembler.drop_stale(through.get, lambda key: 30_000)
    assert [(d.key, d.received, d.count) for d in dropped] == [(("q", 0, 0), 1, 3), (("q", 120_000, 0), 1, 3)]
    assert assembler.holds() == [(1, 0)]
    assert [d.key for d in assembler.drop(lambda key: key[1] == 60_000)] == [("q", 60_000, 0)]
    assembler.add(kept[1], (1, 5), 2_000)
    assembler.forget_partitions({1})  # now read by another process
    assert assembler.incomplete == 0


def test_chunk_sizes_must_be_positive_and_headers_small():
    with pytest.raises(ValueError, match="positive"):
        chunk_records(_stream(), b"x", 0)
    with pytest.raises(ValueError, match="room"):
        chunk_records({**_stream(), "query": "q" * 2_000}, b"x", 10)
