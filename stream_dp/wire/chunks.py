"""Payloads of any size as Kafka records that fit the limits in force: chunking and reassembly.

A payload (e.g. an encoded window partial) is cut into chunks of at most
``max_payload`` bytes; each chunk record carries the payload's stream (what
it belongs to, e.g. query, window and input partition), its digest, its
index and the chunk count. The reader reassembles a payload exactly once:

* a payload is whole only when every chunk of one emission (one digest) is
  there; until then nothing of it is handed on;
* duplicates (a replayed record, the same payload emitted twice) are ignored;
* two emissions of one stream (a worker that died mid-way, then its replay,
  whose close time differs) never mix: chunks are grouped by digest, and when
  one emission is whole the others of its stream are dropped;
* the reader may not commit past the first chunk of a payload still
  incomplete: ``holds`` names those positions.

Pure logic, no I/O: positions and clocks are passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from stream_dp.wire.frame import BINARY_VERSION, KIND_CHUNK, MAGIC, PREFIX, WireFormatError

Source = tuple[int, int]  # (partition, offset) of a record
_DIGEST_BYTES = 16
#: What a chunk record's own framing may take beside its payload (prefix and JSON header with
#: a stream of a query name, window and partition); chunk sizes leave this much room.
CHUNK_HEADER_ROOM = 1_024


def payload_digest(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=_DIGEST_BYTES).hexdigest()


def chunk_records(stream: dict[str, Any], payload: bytes, max_payload: int) -> list[bytes]:
    """The chunk records of ``payload``, each holding at most ``max_payload`` bytes of it.

    ``stream``: JSON-serialisable fields naming what the payload belongs to;
    every chunk repeats them, so a reader can route or drop a chunk alone.
    """
    if max_payload < 1:
        raise ValueError(f"max_payload must be positive, got {max_payload}")
    count = max(1, -(-len(payload) // max_payload))
    digest = payload_digest(payload)
    records = []
    for index in range(count):
        header = orjson.dumps({**stream, "chunk": [index, count], "size": len(payload), "digest": digest})
        if len(header) > CHUNK_HEADER_ROOM - PREFIX.size:
            raise ValueError(f"a chunk header of {len(header)} bytes is over its {CHUNK_HEADER_ROOM}-byte room")
        piece = payload[index * max_payload:(index + 1) * max_payload]
        records.append(PREFIX.pack(MAGIC, BINARY_VERSION, KIND_CHUNK, len(header)) + header + piece)
    return records


@dataclass(frozen=True)
class Chunk:
    """One decoded chunk record."""

    stream: dict[str, Any]
    digest: str
    index: int
    count: int
    size: int
    piece: bytes


def decode_chunk(fields: dict[str, Any], body: bytes) -> Chunk:
    """A chunk from its header ``fields`` (see ``frame.read_prefix``) and the bytes after the header."""
    try:
        index, count = (int(v) for v in fields.pop("chunk"))
        size = int(fields.pop("size"))
        digest = str(fields.pop("digest"))
    except (KeyError, TypeError, ValueError) as exc:
        raise WireFormatError(f"corrupt chunk header: {exc!r}") from None
    if not 0 <= index < count or size < 0 or len(body) > size:
        raise WireFormatError(f"corrupt chunk header: chunk {index} of {count}, {len(body)} of {size} bytes")
    return Chunk(fields, digest, index, count, size, body)


@dataclass
class _Emission:
    count: int
    size: int
    pieces: dict[int, bytes] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)
    oldest_timestamp_ms: int | None = None
    newest_timestamp_ms: int | None = None

    def add(self, chunk: Chunk, source: Source, timestamp_ms: int | None) -> None:
        self.pieces.setdefault(chunk.index, chunk.piece)
        self.sources.append(source)
        if timestamp_ms is not None and timestamp_ms >= 0:
            oldest, newest = self.oldest_timestamp_ms, self.newest_timestamp_ms
            self.oldest_timestamp_ms = timestamp_ms if oldest is None else min(oldest, timestamp_ms)
            self.newest_timestamp_ms = timestamp_ms if newest is None else max(newest, timestamp_ms)

    @property
    def first_source(self) -> Source:
        return min(self.sources)


@dataclass(frozen=True)
class Assembled:
    """A whole payload: its stream, bytes, every record it came from and the oldest record timestamp."""

    stream: dict[str, Any]
    key: Hashable
    payload: bytes
    sources: list[Source]
    oldest_timestamp_ms: int | None


@dataclass(frozen=True)
class Dropped:
    """An incomplete emission given up: its stream and how many of its chunks had come."""

    stream: dict[str, Any]
    key: Hashable
    received: int
    count: int


class ChunkAssembler:
    """Incomplete payloads of many streams; ``stream_key`` maps a chunk's stream fields to a hashable key."""

    def __init__(self, stream_key: Callable[[dict[str, Any]], Hashable]) -> None:
        self._stream_key = stream_key
        self._open: dict[Hashable, dict[str, _Emission]] = {}
        self._streams: dict[Hashable, dict[str, Any]] = {}

    def key(self, chunk: Chunk) -> Hashable:
        return self._stream_key(chunk.stream)

    def add(self, chunk: Chunk, source: Source, timestamp_ms: int | None) -> Assembled | None:
        """Take a chunk read at ``source`` with record timestamp ``timestamp_ms``; the whole payload
        once its last missing chunk arrives, else None.

        Raises ``WireFormatError`` when chunks of one digest disagree on their
        count or size, or the joined payload does not match its digest (the
        emission is dropped).
        """
        key = self._stream_key(chunk.stream)
        emissions = self._open.setdefault(key, {})
        self._streams.setdefault(key, chunk.stream)
        emission = emissions.get(chunk.digest)
        if emission is None:
            emission = emissions[chunk.digest] = _Emission(chunk.count, chunk.size)
        elif (emission.count, emission.size) != (chunk.count, chunk.size):
            self._forget(key, chunk.digest)
            raise WireFormatError(
                f"chunks of one payload disagree: {emission.count} chunks of {emission.size} bytes, "
                f"then {chunk.count} of {chunk.size}"
            )
        emission.add(chunk, source, timestamp_ms)
        if len(emission.pieces) < emission.count:
            return None
        payload = b"".join(emission.pieces[i] for i in range(emission.count))
        stream = self._streams[key]
        # Whole: the stream's other (incomplete) emissions are superseded.
        del self._open[key]
        del self._streams[key]
        if len(payload) != emission.size or payload_digest(payload) != chunk.digest:
            raise WireFormatError(
                f"a reassembled payload of {len(payload)} bytes does not match its header "
                f"({emission.size} bytes, digest {chunk.digest})"
            )
        return Assembled(stream, key, payload, sorted(emission.sources), emission.oldest_timestamp_ms)

    def _forget(self, key: Hashable, digest: str) -> None:
        emissions = self._open.get(key, {})
        emissions.pop(digest, None)
        if not emissions:
            self._open.pop(key, None)
            self._streams.pop(key, None)

    def holds(self) -> list[Source]:
        """The first record of every incomplete emission: a reader commits no further than these."""
        return [e.first_source for emissions in self._open.values() for e in emissions.values()]

    def _drop_where(self, which: Callable[[Hashable, _Emission], bool]) -> list[Dropped]:
        dropped = []
        for key in list(self._open):
            emissions = self._open[key]
            for digest in [d for d, e in emissions.items() if which(key, e)]:
                emission = emissions.pop(digest)
                dropped.append(Dropped(self._streams[key], key, len(emission.pieces), emission.count))
            if not emissions:
                del self._open[key]
                del self._streams[key]
        return dropped

    def drop(self, which: Callable[[Hashable], bool]) -> list[Dropped]:
        """Give up every incomplete emission of the streams ``which`` picks (e.g. of a window released)."""
        return self._drop_where(lambda key, _emission: which(key))

    def drop_stale(self, read_through_ms: Callable[[int], int | None], quiet_ms: Callable[[Hashable], int]) -> list[Dropped]:
        """Give up emissions whose partition was read ``quiet_ms(key)`` past their newest chunk (in record time:
        ``read_through_ms(partition)`` is the newest record timestamp read there) without completing them.

        A writer sends all chunks of an emission back to back, so by then it died
        mid-way and no replay completed it (a replay is a new emission, and
        completing it drops the old one). Record time, not the reader's clock:
        a reader that pauses between two fetches of one emission keeps it.
        """
        def stale(key: Hashable, emission: _Emission) -> bool:
            through = read_through_ms(emission.first_source[0])
            newest = emission.newest_timestamp_ms
            return through is not None and newest is not None and through - newest >= quiet_ms(key)

        return self._drop_where(stale)

    def forget_partitions(self, partitions: Iterable[int]) -> None:
        """Forget emissions read from these partitions (now read by another process)."""
        lost = set(partitions)
        self._drop_where(lambda _key, emission: emission.first_source[0] in lost)

    @property
    def incomplete(self) -> int:
        return sum(len(e) for e in self._open.values())
