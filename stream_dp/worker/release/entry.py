"""A window's release as the ledger keeps it, and its output records rendered in bulk.

The ledger stores what a release *is* -- the released groups' keys and noisy
values as numpy columns, and the JSON every record of the window shares
(query, window, std, privacy block, release time) -- in one binary frame,
rather than the rendered records: about 30 bytes per group instead of ~700.
Rendering is deterministic, so a republished window gets the same records
(same ``release_id``, same values) as its first publication.

Rendering works on columns, not on a dict per group: each column becomes its
JSON texts at once (``orjson`` on a whole numpy array, split at the commas;
strings wrapped by one join and split), release ids are one BLAKE2b call per
group into one buffer turned to hex by numpy, and each record is one
``bytes.join`` of those pieces, run by ``map`` in C. Records come in slices
so that a window of a million groups never holds all its records at once.

Entries written by earlier versions (zlib of the rendered records) are read too.

Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import orjson

from stream_dp.wire.frame import WireFormatError, decode_frame, encode_frame, is_binary
from stream_dp.wire.groups import Column, decode_columns, encode_columns, json_values, key_columns
from stream_dp.worker.release.ids import iso_utc

Record = tuple[bytes, bytes]  # (Kafka key: the group values as a JSON array, record JSON)
VALUE_COLUMNS = ("count", "sum", "mean", "mean_ci")
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NULL = b"null"


@dataclass(frozen=True)
class ReleaseEntry:
    """The released groups of one window and everything their records need.

    ``values[name]`` is a numpy array (one value per row; NaN renders as null),
    or the JSON text every row shares (``b"null"`` for a column not asked for).
    """

    query: str
    window_start_ms: int
    group_names: list[str]
    groups: list[Column]
    rows: int
    values: dict[str, np.ndarray | bytes]
    prefix: bytes  # '{"query":...,"window":{...}'
    ci: tuple[bytes, bytes]  # the count and sum 95% half-widths, shared by every row
    tail: bytes  # '"std":...,"privacy":...,"released_at_ms":...,"released_at":"..."}'
    #: Per row, a JSON fragment (``,"name":value...``) placed after the ci95 block (quantiles), or None.
    row_extra: list[bytes] | None = None
    #: Whole records published after the rows (other hierarchy levels, a top-k record).
    extras: tuple[Record, ...] = ()
    #: Internal state stored with the release, never rendered (a continual release's tree):
    #: JSON-able fields and named numpy arrays.
    state: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None

    @property
    def total(self) -> int:
        """Records in all: the rows, then the extra records."""
        return self.rows + len(self.extras)

    def render(self, start: int = 0, stop: int | None = None) -> list[Record]:
        """Records ``start`` .. ``stop`` of ``total``: rows first, then the extra records."""
        keys, values = self.render_columns(start, stop)
        return list(zip(keys, values))

    def render_columns(self, start: int = 0, stop: int | None = None) -> tuple[list[bytes], list[bytes]]:
        """``render``'s records as two lists, their keys and their values (no tuple per record)."""
        stop = self.total if stop is None else min(stop, self.total)
        keys, values = self._render_rows(start, min(stop, self.rows))
        if stop > self.rows:
            extras = self.extras[max(0, start - self.rows):stop - self.rows]
            keys += [key for key, _ in extras]
            values += [value for _, value in extras]
        return keys, values

    def _render_rows(self, start: int, stop: int) -> tuple[list[bytes], list[bytes]]:
        n = max(0, stop - start)
        if n == 0:
            return [], []
        fields = [json_values(column[start:stop]) for column in self.groups]
        keys = _wrap(b"[", b"]", _join_fields(fields, [b""] + [b","] * (len(fields) - 1), n))
        names = [orjson.dumps(name) + b":" for name in self.group_names]
        members = _join_fields(fields, [names[0]] + [b"," + name for name in names[1:]] if names else [], n)
        ids = self._release_ids(keys)
        opening = self.prefix + b',"release_id":' + orjson.dumps(f"{self.query}:{self.window_start_ms}:")[:-1]
        value = {name: self._column(name, start, stop) for name in VALUE_COLUMNS}
        ci_count, ci_sum = self.ci
        closing = b"}" + b"," + self.tail
        if self.row_extra is None:  # one constant piece fewer per record
            ending = [repeat(closing)]
        else:
            ending = [repeat(b"}"), self.row_extra[start:stop], repeat(b"," + self.tail)]
        records = list(map(b"".join, zip(
            repeat(opening), ids, repeat(b'","group":{'), members,
            repeat(b'},"count":'), value["count"], repeat(b',"sum":'), value["sum"],
            repeat(b',"mean":'), value["mean"],
            repeat(b',"ci95":{"count":' + ci_count + b',"sum":' + ci_sum + b',"mean":'), value["mean_ci"],
            *ending,
        )))
        return keys, records

    def _release_ids(self, keys: list[bytes]) -> list[bytes]:
        """Hex digests of ``stream_dp.worker.release.ids.release_id`` for each key (its JSON array)."""
        head = b"[" + orjson.dumps(self.query) + b"," + str(self.window_start_ms).encode() + b","
        blake2b = hashlib.blake2b
        # each hashed text built by one join and one split (JSON text holds no NUL) rather than a concatenation each
        texts = _wrap(head, b"]", keys)
        digests = b"".join([blake2b(text, digest_size=12).digest() for text in texts])
        raw = np.frombuffer(digests, dtype=np.uint8).reshape(len(keys), 12)
        text = np.empty((len(keys), 24), dtype=np.uint8)
        text[:, 0::2] = _HEX[raw >> 4]
        text[:, 1::2] = _HEX[raw & 15]
        return text.view("S24").ravel().tolist()

    def _column(self, name: str, start: int, stop: int) -> Any:
        value = self.values[name]
        if isinstance(value, bytes):
            return repeat(value, stop - start)
        return orjson.dumps(value[start:stop], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")


def _join_fields(fields: list[list[bytes]], separators: list[bytes], n: int) -> list[bytes]:
    """Per row, each field's text after its separator, joined (b"" for every row without fields)."""
    if not fields:
        return [b""] * n
    if len(fields) == 1 and not separators[0]:
        return fields[0]
    pieces: list[Any] = []
    for separator, texts in zip(separators, fields):
        pieces += [repeat(separator), texts]
    return list(map(b"".join, zip(*pieces)))


def _wrap(left: bytes, right: bytes, texts: list[bytes]) -> list[bytes]:
    """``left + text + right`` for each text (JSON text holds no NUL, so one join and one split do it)."""
    if not texts:
        return []
    return (left + (right + b"\x00" + left).join(texts) + right).split(b"\x00")


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _value_column(values: Any, index: np.ndarray, requested: bool) -> np.ndarray | bytes:
    """A requested column's values of the released groups (JSON null where not requested or not finite)."""
    if not requested or values is None:
        return _NULL
    array = np.asarray(values)
    if array.ndim == 0:
        return orjson.dumps(_finite(array.item()))
    picked = array[index]
    if picked.dtype.kind == "f":
        return picked.astype(np.float64)  # non-finite values render as null
    if picked.dtype.kind in "iub":
        return picked.astype(np.int64)
    raise TypeError(f"a release column of dtype {picked.dtype} cannot be rendered")


def as_if_empty_field(window: Any) -> bytes:
    """``,"as_if_empty":"<reason>"`` for a window released without its data (noise only), else nothing."""
    reason = getattr(window, "withheld", None)
    return b"" if reason is None else b',"as_if_empty":' + orjson.dumps(reason)


def build_entry(
    query: Any,
    window: Any,
    noisy: Any,
    released_at_ms: int,
    *,
    group_names: list[str] | None = None,
    groups: list[Any] | None = None,
    extra_prefix: bytes = b"",
    privacy: dict[str, Any] | None = None,
) -> ReleaseEntry:
    """The release of ``window`` for ``query`` (a ``QueryRuntime``): its kept groups (``noisy.keep``)
    with their noisy or post-processed values only, and what every record shares.

    ``group_names`` / ``groups`` replace the query's group-by fields and the window's groups (a
    coarser level of a hierarchy); ``extra_prefix`` (``,"name":value``) is added to every record
    after its window block; ``privacy`` replaces the query's privacy block. A window released as if empty
    (``window.withheld``) says so in every record (``as_if_empty``)."""
    aggregations = query.config.aggregations
    want_count, want_sum, want_mean = (aggregations.count is not None, aggregations.sum is not None,
                                       aggregations.mean is not None)
    index = np.flatnonzero(np.asarray(noisy.keep, dtype=bool))
    window_block = {"start": iso_utc(window.window_start_ms), "end": iso_utc(window.window_end_ms),
                    "start_ms": window.window_start_ms, "end_ms": window.window_end_ms}
    names = list(query.config.group_by) if group_names is None else list(group_names)
    source = window.groups if groups is None else groups
    kept = [source[i] for i in index.tolist()]
    return ReleaseEntry(
        query=query.name,
        window_start_ms=window.window_start_ms,
        group_names=names,
        groups=key_columns(kept, len(names)),
        rows=len(kept),
        values={
            "count": _value_column(noisy.count, index, want_count),
            "sum": _value_column(noisy.sum, index, want_sum),
            "mean": _value_column(noisy.mean, index, want_mean),
            "mean_ci": _value_column(noisy.mean_ci95, index, want_mean),
        },
        prefix=(b'{"query":' + orjson.dumps(query.name) + b',"window":' + orjson.dumps(window_block)
                + as_if_empty_field(window) + extra_prefix),
        ci=(orjson.dumps(_finite(noisy.count_ci95) if want_count else None),
            orjson.dumps(_finite(noisy.sum_ci95) if want_sum else None)),
        tail=orjson.dumps({
            "std": {"count": _finite(noisy.count_std) if want_count else None,
                    "sum": _finite(noisy.sum_std) if want_sum else None},
            "privacy": query.privacy if privacy is None else privacy,
            "released_at_ms": released_at_ms,
            "released_at": iso_utc(released_at_ms),
        })[1:],
    )


def encode_entry(entry: ReleaseEntry) -> bytes:
    described, sections = encode_columns(entry.groups)
    shared = {}
    for name in VALUE_COLUMNS:
        value = entry.values[name]
        if isinstance(value, bytes):
            shared[name] = value.decode()
        else:
            sections[name] = value
    fields: dict[str, Any] = {
        "type": "release", "query": entry.query, "window_start_ms": entry.window_start_ms,
        "group_names": entry.group_names, "groups": described, "rows": entry.rows, "shared": shared,
        "prefix": entry.prefix.decode(), "ci": [entry.ci[0].decode(), entry.ci[1].decode()], "tail": entry.tail.decode(),
    }
    if entry.row_extra is not None:
        sections["row_extra"] = b"".join(entry.row_extra)
        sections["row_extra_ends"] = np.cumsum([len(t) for t in entry.row_extra], dtype=np.int64)
    if entry.extras:
        sections["extras"] = pack_records(entry.extras)
    if entry.state is not None:
        state_fields, arrays = entry.state
        fields["state"] = {"fields": state_fields, "arrays": sorted(arrays)}
        for name, array in arrays.items():
            sections[f"state.{name}"] = array
    return encode_frame(fields, sections)


@dataclass(frozen=True)
class StoredRecords:
    """A release stored by an earlier version: its rendered records."""

    records: list[Record]

    @property
    def rows(self) -> int:
        return len(self.records)

    @property
    def total(self) -> int:
        return len(self.records)

    state = None

    def render(self, start: int = 0, stop: int | None = None) -> list[Record]:
        return self.records[start:stop]

    def render_columns(self, start: int = 0, stop: int | None = None) -> tuple[list[bytes], list[bytes]]:
        records = self.records[start:stop]
        return [key for key, _ in records], [value for _, value in records]


def decode_entry(payload: bytes) -> ReleaseEntry | StoredRecords:
    """What ``encode_entry`` stored, or an earlier version's records; raises ``WireFormatError``."""
    if not is_binary(payload):
        return StoredRecords(_unpack_records(payload))
    frame = decode_frame(payload)
    data, sections = frame.fields, frame.sections
    try:
        if data.get("type") != "release":
            raise WireFormatError(f"expected a release entry, got type {data.get('type')!r}")
        rows = int(data["rows"])
        values: dict[str, np.ndarray | bytes] = {}
        for name in VALUE_COLUMNS:
            shared = data["shared"].get(name)
            values[name] = shared.encode() if shared is not None else sections[name]
            if not isinstance(values[name], bytes) and len(values[name]) != rows:
                raise WireFormatError(f"release column {name} holds {len(values[name])} values, expected {rows}")
        row_extra = None
        if "row_extra" in sections:
            ends = sections["row_extra_ends"]
            if len(ends) != rows:
                raise WireFormatError(f"release row extras hold {len(ends)} rows, expected {rows}")
            blob, starts = sections["row_extra"], np.concatenate(([0], ends[:-1])) if rows else ends
            row_extra = [blob[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        extras = tuple(_unpack_records(sections["extras"])) if "extras" in sections else ()
        state = None
        if "state" in data:
            state = (dict(data["state"]["fields"]), {n: sections[f"state.{n}"] for n in data["state"]["arrays"]})
        return ReleaseEntry(
            query=str(data["query"]), window_start_ms=int(data["window_start_ms"]),
            group_names=[str(n) for n in data["group_names"]],
            groups=decode_columns(data["groups"], sections, rows), rows=rows, values=values,
            prefix=data["prefix"].encode(), ci=(data["ci"][0].encode(), data["ci"][1].encode()),
            tail=data["tail"].encode(), row_extra=row_extra, extras=extras, state=state,
        )
    except WireFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise WireFormatError(f"corrupt release entry: {exc!r}") from None


def _unpack_records(payload: bytes) -> list[Record]:
    """Records as earlier versions stored them: zlib of ``key TAB value`` lines (JSON holds no raw TAB or newline)."""
    try:
        data = zlib.decompress(payload)
    except zlib.error as exc:
        raise WireFormatError(f"corrupt release entry of an earlier version: {exc}") from None
    if not data:
        return []
    return [tuple(line.split(b"\t", 1)) for line in data.split(b"\n")]  # type: ignore[misc]


def pack_records(records: Sequence[Record]) -> bytes:
    """An earlier version's entry for ``records`` (kept to test that such entries are still read)."""
    return zlib.compress(b"\n".join(key + b"\t" + value for key, value in records), 1)
