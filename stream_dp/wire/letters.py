"""Dead letters: a bounded copy of a rejected event -- its head, its size and its digest -- in one record.

A dead letter (wire version 3) is one record whose value is the event's first
``DEAD_LETTER_HEAD_BYTES`` bytes (the whole event when it is no longer), with
headers saying why (``reason``, ``detail``, ``query``, ``source`` = input
topic/partition/offset), ``size`` (the whole event's bytes), ``digest``
(BLAKE2b-128 of the whole event, hex) and ``wire`` = ``DEAD_LETTER_VERSION``.
Its Kafka key is its ``source``. The copy is bounded so that a flood of large
rejected messages cannot fill the dead-letter topic, nor slow the worker that
writes it: each dead letter costs about a kilobyte whatever the event's size.
The whole event stays on its input topic (at ``source``, for the topic's
retention), where the digest identifies it.

Earlier versions wrote the whole event, split into pieces (wire version 2:
``chunk`` = ``index/count``, ``size``, ``digest``) when it exceeded the topic's
record limit, or cut short (no ``wire`` header, ``truncated_from_bytes``);
``reassemble`` still reads them.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from stream_dp.wire.chunks import payload_digest
from stream_dp.wire.frame import UnknownWireVersion, WireFormatError

DEAD_LETTER_VERSION = b"3"
SPLIT_VERSION = b"2"  # whole events in pieces: read, no longer written
#: The most of an event a dead letter copies: enough to see what a rejected event was.
DEAD_LETTER_HEAD_BYTES = 1_024
Header = tuple[str, bytes]
_RECORD_FRAMING = 64  # one record's own varints and attributes
_HEADER_FRAMING = 10  # varints of one header's key and value lengths
_CHUNK_FIELDS = ("chunk", "size", "digest")


def dead_letter_record(value: bytes, headers: Sequence[Header], max_record_bytes: int) -> tuple[bytes, list[Header]]:
    """(value, headers) of the one record of a dead letter: the event's head, its size and digest; at most
    ``max_record_bytes`` with the key (the ``source`` header's value) and framing. ``headers`` must hold
    ``source``."""
    source = dict(headers)["source"]
    stamped = [*headers, ("size", str(len(value)).encode()), ("digest", payload_digest(value).encode()),
               ("wire", DEAD_LETTER_VERSION)]
    head = value[:DEAD_LETTER_HEAD_BYTES]
    framing = _RECORD_FRAMING + len(source) + sum(len(k) + len(v) + _HEADER_FRAMING for k, v in stamped)
    if framing + len(head) > max_record_bytes:
        raise ValueError(
            f"dead-letter records of at most {max_record_bytes} bytes cannot hold a dead letter of "
            f"{framing + len(head)} bytes; the dead-letter topic must take records of at least "
            f"{framing + DEAD_LETTER_HEAD_BYTES} bytes"
        )
    return head, stamped


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: what it holds of the event (the whole event, or its head) and its headers (no chunk
    headers)."""

    value: bytes
    headers: dict[str, bytes]
    key: bytes | None = None

    @property
    def source(self) -> str:
        return self.headers.get("source", b"").decode()

    @property
    def size(self) -> int:
        """The whole event's bytes (those held, for a letter of an earlier version that does not say)."""
        return int(self.headers["size"]) if "size" in self.headers else len(self.value)

    @property
    def whole(self) -> bool:
        """Whether ``value`` is the whole event, not its head."""
        return self.size == len(self.value) and "truncated_from_bytes" not in self.headers


@dataclass
class _Pieces:
    count: int
    size: int
    pieces: dict[int, bytes] = field(default_factory=dict)


def reassemble(records: Iterable[tuple[bytes | None, bytes | None, Sequence[Header] | dict[str, bytes]]]) -> list[DeadLetter]:
    """Dead letters from dead-letter records (key, value, headers) read in order, pieces of an earlier
    version's split letter joined back, each once (a copy re-sent by a replay comes back again, as it would
    unsplit). Raises ``UnknownWireVersion`` on a record of a version this code does not read,
    ``WireFormatError`` on inconsistent chunks."""
    out: list[DeadLetter] = []
    open_: dict[tuple[bytes, bytes], _Pieces] = {}
    for key, value, raw_headers in records:
        headers = dict(raw_headers)
        value = value or b""
        version = headers.get("wire")
        if version not in (None, SPLIT_VERSION, DEAD_LETTER_VERSION):
            raise UnknownWireVersion(version.decode(errors="replace"), f"dead letters of wire versions "
                                     f"{SPLIT_VERSION.decode()} and {DEAD_LETTER_VERSION.decode()} (and earlier "
                                     "ones without a wire header)")
        if version != SPLIT_VERSION or "chunk" not in headers:
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
