"""Decoders of the evidence the checks judge, written from ``docs/reference/wire-formats.md`` alone.

The partials the workers published, the release-ledger entries and the
budget states in Redis are read here without ``stream_dp``'s own decoders:
a bug shared by the worker's encoder and its decoder (a column swapped on
both sides, a sum read back from the count) would otherwise pass every
check. Only the general libraries the format names (zstd, BLAKE2b, JSON)
are used. Each decoder raises ``EvidenceError`` on anything the page does
not describe.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import zstandard

MAGIC = b"\x00SDP"
VERSION = 2
_PREFIX = struct.Struct("<4sBcI")
_SIZES = {"u1": 1, "u2": 2, "u4": 4, "i4": 4, "i8": 8, "f8": 8, "bytes": 1}
_FORMATS = {"u1": "B", "u2": "H", "u4": "I", "i4": "i", "i8": "q", "f8": "d"}


class EvidenceError(ValueError):
    """A record that is not what the documented wire format describes."""


def read_header(value: bytes) -> tuple[bytes, dict, bytes]:
    """(kind, JSON header, the bytes after it) of a binary record."""
    if value is None or len(value) < _PREFIX.size:
        raise EvidenceError("shorter than the 10-byte prefix")
    magic, version, kind, length = _PREFIX.unpack_from(value)
    if magic != MAGIC:
        raise EvidenceError("no magic bytes")
    if version != VERSION:
        raise EvidenceError(f"wire version {version}, not {VERSION}")
    try:
        header = json.loads(value[_PREFIX.size:_PREFIX.size + length])
    except ValueError as exc:
        raise EvidenceError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise EvidenceError("header is not a JSON object")
    return kind, header, value[_PREFIX.size + length:]


def read_frame(value: bytes) -> tuple[dict, dict[str, list | bytes]]:
    """(header, sections) of a frame (kind ``F``); numeric sections as lists of Python numbers."""
    kind, header, body = read_header(value)
    if kind != b"F":
        raise EvidenceError(f"a record of kind {kind!r}, not a frame")
    table = header.pop("sections", None)
    try:
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        sections: dict[str, list | bytes] = {}
        position = 0
        for name, dtype, count, shuffled in table:
            size = _SIZES[dtype] * count
            data = raw[position:position + size]
            if len(data) != size:
                raise EvidenceError(f"section {name} is cut short")
            position += size
            if dtype == "bytes":
                sections[name] = data
                continue
            width = _SIZES[dtype]
            if shuffled:  # byte j of value i is at j * count + i
                data = bytes(data[j * count + i] for i in range(count) for j in range(width))
            sections[name] = list(struct.unpack(f"<{count}{_FORMATS[dtype]}", data))
        if position != len(raw):
            raise EvidenceError(f"{len(raw) - position} bytes after the last section")
    except (TypeError, ValueError, KeyError, zstandard.ZstdError) as exc:
        if isinstance(exc, EvidenceError):
            raise
        raise EvidenceError(f"corrupt frame: {exc!r}") from None
    return header, sections


def group_keys(described: list, sections: dict, rows: int) -> list[tuple]:
    """The group keys of a frame's ``groups`` description and its ``g<i>.*`` sections."""
    columns = []
    for i, entry in enumerate(described):
        name = f"g{i}"
        kind = entry["kind"]
        if kind == "int":
            columns.append(list(sections[f"{name}.int"]))
        elif kind == "str":
            columns.append(_texts(entry["text"], name, sections, rows))
        elif kind == "mixed":
            tags = sections[f"{name}.tag"]
            ints = iter(sections[f"{name}.int"])
            texts = iter(_texts(entry["text"], name, sections, tags.count(0)))
            columns.append([next(ints) if tag == 1 else next(texts) for tag in tags])
        else:
            raise EvidenceError(f"group column of kind {kind!r}")
    if any(len(c) != rows for c in columns):
        raise EvidenceError(f"group columns are not all {rows} rows long")
    return [tuple(row) for row in zip(*columns)] if columns else [()] * rows


def _texts(layout: str, name: str, sections: dict, rows: int) -> list[str]:
    text = sections[f"{name}.text"]
    if rows == 0:
        return []
    if layout == "nul":
        return text.decode("utf-8", "surrogatepass").split("\x00")
    values, position = [], 0
    for length in sections[f"{name}.len"]:
        values.append(text[position:position + length].decode("utf-8", "surrogatepass"))
        position += length
    return values


# -- partials ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partial:
    query: str
    window_start_ms: int
    window_end_ms: int
    partition: int
    input_partitions: int
    groups: list[tuple]
    count: list[int]
    sum: list[float] | None
    distinct_units: list[int]
    units_charged: int
    units_excluded: int
    #: each group's position in the query's public list (-1: not in it), when the writer gave them
    public_positions: list[int] | None = None

    def same_as(self, other: Partial) -> bool:
        """Identical contents (``closed_at_ms`` aside: it is the close time, not data)."""
        return self == other


def decode_partial(frame: bytes) -> Partial:
    header, sections = read_frame(frame)
    if header.get("type") != "partial":
        raise EvidenceError(f"a frame of type {header.get('type')!r}, not a partial")
    try:
        rows = int(header["rows"])
        count, distinct = sections["count"], sections["distinct_units"]
        sums = sections.get("sum")
        if len(count) != rows or len(distinct) != rows or (sums is not None and len(sums) != rows):
            raise EvidenceError(f"a partial's columns are not all {rows} long")
        positions = sections.get("public.position") if header.get("public_positions") else None
        if header.get("public_positions") and (not isinstance(positions, list) or len(positions) != rows):
            raise EvidenceError(f"a partial says it has public positions but no public.position section of {rows}")
        return Partial(str(header["query"]), int(header["window_start_ms"]), int(header["window_end_ms"]),
                       int(header["partition"]), int(header["input_partitions"]),
                       group_keys(header["groups"], sections, rows), list(count),
                       None if sums is None else list(sums), list(distinct),
                       int(header["units_charged"]), int(header["units_excluded"]), positions)
    except (KeyError, TypeError) as exc:
        raise EvidenceError(f"corrupt partial: {exc!r}") from None


@dataclass(frozen=True)
class PartialCopy:
    """One emission of a partial, whole, with the position of its last chunk on the partials topic."""

    partial: Partial
    partition: int
    offset: int
    timestamp: int


def read_partials(records: Iterable, skip: set[tuple[int, int]] = frozenset()) -> tuple[list[PartialCopy], list[str]]:
    """Every whole partial on the partials topic (records with ``partition``, ``offset``, ``value``,
    ``timestamp``), and what could not be read. JSON records (progress markers) are not partials; a
    record at a position in ``skip`` (planted by a fault) is ignored."""
    pieces: dict[tuple, dict[int, tuple]] = {}
    whole: list[PartialCopy] = []
    errors: list[str] = []
    for record in records:
        where = (record.partition, record.offset)
        if where in skip or (record.value or b"")[:1] == b"{":
            continue
        try:
            kind, header, body = read_header(record.value)
            if kind != b"C":
                raise EvidenceError(f"a record of kind {kind!r} on the partials topic")
            index, count = header["chunk"]
            key = (header["query"], header["window_start_ms"], header["partition"], header["digest"], count,
                   header["size"])
            got = pieces.setdefault(key, {})
            got[int(index)] = (body, record)
            if len(got) == count:
                frame = b"".join(got[i][0] for i in range(count))
                if len(frame) != header["size"] or hashlib.blake2b(frame, digest_size=16).hexdigest() != header["digest"]:
                    raise EvidenceError("the joined chunks do not match their size or digest")
                last = max((r for _, r in got.values()), key=lambda r: r.offset)
                whole.append(PartialCopy(decode_partial(frame), last.partition, last.offset, last.timestamp))
                del pieces[key]
        except (EvidenceError, KeyError, TypeError, ValueError) as exc:
            errors.append(f"partials record {where[0]}@{where[1]}: {exc}")
    return whole, errors


# -- release ledger ------------------------------------------------------------------------------------------


def release_id(query: str, window_start_ms: int, group: tuple) -> str:
    key = json.dumps([query, window_start_ms, list(group)], separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return f"{query}:{window_start_ms}:{digest}"


def ledger_records(payload: bytes) -> list[dict]:
    """The output records a ledger entry stands for, as JSON objects."""
    header, sections = read_frame(payload)
    if header.get("type") != "release":
        raise EvidenceError(f"a frame of type {header.get('type')!r}, not a release")
    if "row_extra" in sections:
        raise EvidenceError("a release with per-row extras (quantiles): not read here")
    try:
        rows = int(header["rows"])
        query, start = header["query"], int(header["window_start_ms"])
        keys = group_keys(header["groups"], sections, rows)
        shared = json.loads(header["prefix"] + "}")
        tail = json.loads("{" + header["tail"])
        ci_count, ci_sum = (json.loads(t) for t in header["ci"])
        columns = {}
        for name in ("count", "sum", "mean", "mean_ci"):
            text = header["shared"].get(name)
            values = [json.loads(text)] * rows if text is not None else sections[name]
            columns[name] = [None if isinstance(v, float) and v != v else v for v in values]
        out = []
        for r, key in enumerate(keys):
            out.append({**shared, "release_id": release_id(query, start, key),
                        "group": dict(zip(header["group_names"], key)), "count": columns["count"][r],
                        "sum": columns["sum"][r], "mean": columns["mean"][r],
                        "ci95": {"count": ci_count, "sum": ci_sum, "mean": columns["mean_ci"][r]}, **tail})
        if "extras" in sections:  # whole records published after the rows: zlib of key TAB value lines
            text = zlib.decompress(sections["extras"])
            out += [json.loads(line.split(b"\t", 1)[1]) for line in text.split(b"\n") if line]
        return out
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise EvidenceError(f"corrupt release entry: {exc!r}") from None


def canonical(record: dict) -> bytes:
    """One text per JSON value, whatever its key order: what the ledger and an output record are compared by."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


# -- budget states -------------------------------------------------------------------------------------------


def unit_state(raw: bytes, limits: int) -> list[dict[int, int]]:
    """Per limit of the namespace: bucket -> fixed-point units charged (buckets counted from the state's
    generation base; their sum is the spend while every bucket lies within the horizon)."""
    if not raw:
        return [{} for _ in range(limits)]
    try:
        flags = raw[0]
        position = 1 + 4 * bin(flags & 0x7F).count("1")
        heads = []
        for _ in range(limits):
            heads.append(struct.unpack_from("<iH", raw, position))
            position += 6
        width = 4 if flags & 0x80 else 3
        out = []
        for first, count in heads:
            buckets = {}
            for k in range(count):
                chunk = raw[position:position + width]
                if len(chunk) != width:
                    raise EvidenceError("a budget state ends inside a counter")
                position += width
                if value := int.from_bytes(chunk, "little"):
                    buckets[first + k] = value
            out.append(buckets)
    except struct.error as exc:
        raise EvidenceError(f"corrupt budget state: {exc}") from None
    if position != len(raw):
        raise EvidenceError(f"{len(raw) - position} bytes after a budget state's counters")
    return out


def spends(client, prefix: str, namespace: str, limits: int) -> dict[str, list[int]]:
    """unit -> fixed-point units charged against each limit, from the newest generation holding the unit."""
    newest: dict[str, tuple[int, bytes]] = {}
    match = f"{prefix}s:{namespace}:*"
    for key in client.scan_iter(match=match, count=10_000):
        parts = key.decode().split(":")
        try:
            generation = int(parts[-2])
        except (IndexError, ValueError):
            continue
        for field, raw in client.hgetall(key).items():
            if not field:
                continue  # the field of empty name keeps the hash a hash table: no unit's
            unit = field.decode("utf-8", "surrogatepass")
            if unit not in newest or newest[unit][0] < generation:
                newest[unit] = (generation, raw)
    return {unit: [sum(b.values()) for b in unit_state(raw, limits)] for unit, (_, raw) in newest.items()}
