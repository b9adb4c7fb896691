"""The sandbox process of a sample-and-aggregate function: ``python -m stream_dp.worker.sandbox_child PATH``.

Started by ``stream_dp.worker.sandbox`` with an environment that holds none
of the worker's settings. Protocol on its original stdin/stdout (the
function's own prints go to stderr): a request is an 8-byte little-endian
count ``n`` then ``n`` float64 values (``n = 2^64 - 1``: stop); each answer
is one JSON line, ``{"s": "ok", "v": x}``, ``{"s": "error", "e": type name}``
or ``{"s": "not_finite"}``; the first line says ``ready`` or ``load_error``.
Imports nothing of the worker.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import struct
import sys
from typing import Any

import numpy as np

STOP = (1 << 64) - 1
_COUNT = struct.Struct("<Q")


def _read_exactly(stream: Any, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _load(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    if not callable(target):
        raise TypeError(f"{path} is a {type(target).__name__}, not a function")
    return target


def main(path: str) -> None:
    # the protocol keeps the original pipes; the function's stdout and stdin are stderr and /dev/null
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout = sys.stderr

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")

    try:
        function = _load(path)
    except BaseException as exc:  # anything the import does: report it, then stop
        answer({"s": "load_error", "e": f"{type(exc).__name__}: {exc}"[:500]})
        return
    answer({"s": "ready"})
    while True:
        head = _read_exactly(requests, _COUNT.size)
        if head is None:
            return
        (count,) = _COUNT.unpack(head)
        if count == STOP:
            return
        body = _read_exactly(requests, 8 * count)
        if body is None:
            return
        values = np.frombuffer(body, dtype="<f8").copy()  # the function may change its own copy
        try:
            out = float(function(values))
        except Exception as exc:  # the user's function failed on this block
            answer({"s": "error", "e": type(exc).__name__})
            continue
        answer({"s": "ok", "v": out} if math.isfinite(out) else {"s": "not_finite"})


if __name__ == "__main__":
    main(sys.argv[1])
