"""Group keys as columns: one column per group-by field, each all strings, all integers, or mixed.

A group key is a tuple of strings and signed 64-bit integers (``"1"`` and
``1`` are different groups). Keys go in and out as lists of tuples; in a
frame each field is one section or a few:

* strings: UTF-8 joined by NUL (one C-level split decodes them), or, if
  some value holds a NUL itself, byte lengths beside the concatenated text;
* integers: an int64 array;
* mixed: a type tag per row (1: integer), the integers, and the strings as above.

``json_values`` renders a column as JSON texts, byte for byte what
``orjson.dumps`` gives for each value, in bulk: plain strings (no quote,
backslash or control character) are wrapped in quotes by one join and one
split instead of one call per value.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, overload

import numpy as np
import orjson

from stream_dp.wire.frame import WireFormatError

GroupKey = tuple[Any, ...]
Column = list[Any]


def key_columns(keys: Sequence[GroupKey], width: int) -> list[Column]:
    """The per-field columns of ``keys``, each a tuple of ``width`` values."""
    if width == 0:
        if any(len(k) for k in keys):
            raise ValueError("group keys of a query without group-by fields must be empty tuples")
        return []
    widths = set(map(len, keys))
    if widths - {width}:
        raise ValueError(f"group keys have {sorted(widths)} fields, expected {width}")
    return [list(map(itemgetter(i), keys)) for i in range(width)]


def keys_from_columns(columns: Sequence[Column], rows: int) -> list[GroupKey]:
    """The tuples back from their columns (``rows`` empty tuples when there are no fields)."""
    if not columns:
        return [()] * rows
    return list(zip(*columns, strict=True))


class KeyRows(Sequence[GroupKey]):
    """Group keys kept as their columns: a row's tuple is built only when it is read (``rows[i]``, iteration).

    A partial of a million groups that names each group's public position is added up by position, and
    reads a few of its keys only to check them: decoding it builds no million tuples. Equal to any sequence
    holding the same tuples in the same order (``decoded.groups == [("/a",), ...]``).
    """

    __slots__ = ("_columns", "_rows")

    def __init__(self, columns: Sequence[Column], rows: int) -> None:
        if any(len(column) != rows for column in columns):
            raise ValueError(f"group columns of {[len(c) for c in columns]} values for {rows} rows")
        self._columns = list(columns)
        self._rows = rows

    def __len__(self) -> int:
        return self._rows

    @overload
    def __getitem__(self, index: int) -> GroupKey: ...

    @overload
    def __getitem__(self, index: slice) -> list[GroupKey]: ...

    def __getitem__(self, index: int | slice) -> GroupKey | list[GroupKey]:
        if isinstance(index, slice):
            return keys_from_columns([column[index] for column in self._columns], len(range(self._rows)[index]))
        if not -self._rows <= index < self._rows:
            raise IndexError(f"group row {index} of {self._rows}")
        return tuple(column[index] for column in self._columns)

    def __iter__(self) -> Iterator[GroupKey]:
        return zip(*self._columns) if self._columns else repeat((), self._rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._rows and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"KeyRows({self._rows} rows)"


def _kind(column: Column) -> str:
    try:
        "".join(column)  # C-level: fails on the first value that is not a string
        return "str"
    except TypeError:
        pass
    types = set(map(type, column))
    if types <= {str}:
        return "str"
    if types <= {int}:
        return "int"
    if types <= {str, int}:
        return "mixed"
    raise TypeError(f"group values must be strings or integers, got {sorted(t.__name__ for t in types - {str, int})}")


def _encode_text(values: Column, name: str, sections: dict[str, Any]) -> str:
    joined = "\x00".join(values)
    text = joined.encode("utf-8", "surrogatepass")
    if len(values) == 0 or joined.count("\x00") == len(values) - 1:
        sections[f"{name}.text"] = text
        return "nul"
    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    sections[f"{name}.len"] = np.fromiter(map(len, encoded), dtype=np.uint32, count=len(encoded))
    sections[f"{name}.text"] = b"".join(encoded)
    return "len"


def _decode_text(layout: str, name: str, sections: dict[str, Any], rows: int) -> list[str]:
    text = sections[f"{name}.text"]
    if rows == 0:
        return []
    if layout == "nul":
        values = text.decode("utf-8", "surrogatepass").split("\x00")
    else:
        ends = np.cumsum(sections[f"{name}.len"].astype(np.int64)).tolist()
        starts = [0, *ends[:-1]]
        values = [text[a:b].decode("utf-8", "surrogatepass") for a, b in zip(starts, ends)]
    if len(values) != rows:
        raise WireFormatError(f"group column {name} holds {len(values)} strings, expected {rows}")
    return values


def encode_columns(columns: Sequence[Column], prefix: str = "g") -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A header description and the frame sections of ``columns``."""
    described: list[dict[str, str]] = []
    sections: dict[str, Any] = {}
    for i, column in enumerate(columns):
        name = f"{prefix}{i}"
        kind = _kind(column)
        entry = {"kind": kind}
        if kind == "int":
            sections[f"{name}.int"] = np.array(column, dtype=np.int64)
        elif kind == "str":
            entry["text"] = _encode_text(column, name, sections)
        else:
            tags = np.fromiter((type(v) is int for v in column), dtype=np.uint8, count=len(column))
            sections[f"{name}.tag"] = tags
            sections[f"{name}.int"] = np.array([v for v in column if type(v) is int], dtype=np.int64)
            entry["text"] = _encode_text([v for v in column if type(v) is str], name, sections)
        described.append(entry)
    return described, sections


def decode_columns(described: Any, sections: dict[str, Any], rows: int, prefix: str = "g") -> list[Column]:
    """The columns back from ``encode_columns``' description and sections; raises ``WireFormatError``."""
    try:
        columns: list[Column] = []
        for i, entry in enumerate(described):
            name = f"{prefix}{i}"
            kind = entry["kind"]
            if kind == "int":
                values = sections[f"{name}.int"].tolist()
                if len(values) != rows:
                    raise WireFormatError(f"group column {name} holds {len(values)} integers, expected {rows}")
                columns.append(values)
            elif kind == "str":
                columns.append(_decode_text(entry["text"], name, sections, rows))
            elif kind == "mixed":
                tags = sections[f"{name}.tag"]
                if len(tags) != rows:
                    raise WireFormatError(f"group column {name} holds {len(tags)} type tags, expected {rows}")
                ints = iter(sections[f"{name}.int"].tolist())
                texts = iter(_decode_text(entry["text"], name, sections, int((tags == 0).sum())))
                columns.append([next(ints) if tag else next(texts) for tag in tags.tolist()])
            else:
                raise WireFormatError(f"group column {name} of unknown kind {kind!r}")
        return columns
    except (KeyError, TypeError, AttributeError, StopIteration, UnicodeDecodeError) as exc:
        raise WireFormatError(f"corrupt group columns: {exc!r}") from None


_PLAIN_TEXT_LIMIT = 0x20  # bytes below it, '"' and '\\' are escaped by JSON


def json_values(column: Column) -> list[bytes]:
    """Each value's JSON text, exactly as ``orjson.dumps(value)``."""
    if not column:
        return []
    kind = _kind(column)
    if kind == "int":
        return orjson.dumps(np.array(column, dtype=np.int64), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    if kind == "str":
        joined = "\x00".join(column)
        try:
            raw = joined.encode("utf-8")  # strict: a lone surrogate takes the slow path (orjson refuses it there too)
        except UnicodeEncodeError:
            raw = b""
            plain = False
        else:
            data = np.frombuffer(raw, dtype=np.uint8)
            nuls = int(np.count_nonzero(data == 0))
            special = int(np.count_nonzero((data < _PLAIN_TEXT_LIMIT) | (data == 0x22) | (data == 0x5C)))
            plain = nuls == len(column) - 1 and special == nuls
        if plain:
            return (b'"' + raw.replace(b"\x00", b'"\x00"') + b'"').split(b"\x00")
    return list(map(orjson.dumps, column))
