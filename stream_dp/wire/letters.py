"""Dead letters: a rejected event's original bytes, whole, in records that fit the dead-letter topic.

A dead letter is the event's value as it came, with headers saying why
(``reason``, ``detail``, ``query``, ``source`` = input topic/partition/offset)
and ``wire`` = ``DEAD_LETTER_VERSION``. Its Kafka key is its ``source``, so
every record of one dead letter lands on one partition, in order.

An event can be as large as its input topic allows, more than the
dead-letter topic may take. Such a dead letter is split: each record holds a
piece of the value and the same headers plus ``chunk`` (``index/count``),
``size`` (the whole value's bytes) and ``digest`` (BLAKE2b-128 of it, hex).
``reassemble`` joins them back; dead letters of earlier versions (no ``wire``
header, possibly cut short with a ``truncated_from_bytes`` header) read as
they are.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from stream_dp.wire.chunks import payload_digest
from stream_dp.wire.frame import UnknownWireVersion, WireFormatError

DEAD_LETTER_VERSION = b"2"
Header = tuple[str, bytes]
_RECORD_FRAMING = 64  # one record's own varints and attributes
_HEADER_FRAMING = 10  # varints of one header's key and value lengths
_CHUNK_HEADERS_BYTES = 120  # "chunk", "size" and "digest" headers with their values
MIN_PIECE_BYTES = 1_024
_CHUNK_FIELDS = ("chunk", "size", "digest")


def dead_letter_records(value: bytes, headers: Sequence[Header], max_record_bytes: int) -> list[tuple[bytes, list[Header]]]:
    """(value, headers) of each record of one dead letter, each at most ``max_record_bytes`` with the key
    (the ``source`` header's value) and framing; ``headers`` must hold ``source``."""
    source = dict(headers)["source"]
    stamped = [*headers, ("wire", DEAD_LETTER_VERSION)]
    framing = _RECORD_FRAMING + len(source) + sum(len(k) + len(v) + _HEADER_FRAMING for k, v in stamped)
    if framing + len(value) <= max_record_bytes:
        return [(value, stamped)]
    room = max_record_bytes - framing - _CHUNK_HEADERS_BYTES
    if room < MIN_PIECE_BYTES:
        raise ValueError(
            f"dead-letter records of at most {max_record_bytes} bytes leave {room} bytes for the event; the "
            f"dead-letter topic must take records of at least {framing + _CHUNK_HEADERS_BYTES + MIN_PIECE_BYTES} bytes"
        )
    count = -(-len(value) // room)
    digest = payload_digest(value).encode()
    size = str(len(value)).encode()
    return [
        (value[i * room:(i + 1) * room], [*stamped, ("chunk", f"{i}/{count}".encode()), ("size", size), ("digest", digest)])
        for i in range(count)
    ]


@dataclass(frozen=True)
class DeadLetter:
    """A whole dead letter: the event's bytes and the headers that came with it (no chunk headers)."""

    value: bytes
    headers: dict[str, bytes]
    key: bytes | None = None

    @property
    def source(self) -> str:
        return self.headers.get("source", b"").decode()


@dataclass
class _Pieces:
    count: int
    size: int
    pieces: dict[int, bytes] = field(default_factory=dict)


def reassemble(records: Iterable[tuple[bytes | None, bytes | None, Sequence[Header] | dict[str, bytes]]]) -> list[DeadLetter]:
    """Whole dead letters from dead-letter records (key, value, headers) read in order, each once (a
    copy re-sent by a replay comes back again, as it would unsplit). Raises ``UnknownWireVersion`` on a
    record of a version this code does not read, ``WireFormatError`` on inconsistent chunks."""
    out: list[DeadLetter] = []
    open_: dict[tuple[bytes, bytes], _Pieces] = {}
    for key, value, raw_headers in records:
        headers = dict(raw_headers)
        value = value or b""
        version = headers.get("wire")
        if version not in (None, DEAD_LETTER_VERSION):
            raise UnknownWireVersion(version.decode(errors="replace"), f"dead letters of wire version "
                                     f"{DEAD_LETTER_VERSION.decode()} (and earlier ones without a wire header)")
        if "chunk" not in headers:
            out.append(DeadLetter(value, headers, key))
            continue
        try:
            index, count = (int(x) for x in headers["chunk"].split(b"/"))
            size, digest = int(headers["size"]), headers["digest"]
        except (KeyError, ValueError) as exc:
            raise WireFormatError(f"corrupt dead-letter chunk headers {headers!r}: {exc!r}") from None
        if not 0 <= index < count:
            raise WireFormatError(f"dead-letter chunk {index} of {count}")
        pieces = open_.setdefault((headers.get("source", b""), digest), _Pieces(count, size))
        if (pieces.count, pieces.size) != (count, size):
            raise WireFormatError(f"chunks of one dead letter disagree: {pieces.count} of {pieces.size} bytes, "
                                  f"then {count} of {size}")
        pieces.pieces.setdefault(index, value)
        if len(pieces.pieces) < count:
            continue
        del open_[(headers.get("source", b""), digest)]
        whole = b"".join(pieces.pieces[i] for i in range(count))
        if len(whole) != size or payload_digest(whole).encode() != digest:
            raise WireFormatError(f"a reassembled dead letter of {len(whole)} bytes does not match its headers")
        out.append(DeadLetter(whole, {k: v for k, v in headers.items() if k not in _CHUNK_FIELDS}, key))
    return out
