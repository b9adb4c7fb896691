"""The sandbox process of a sample-and-aggregate function: ``python -m stream_dp.worker.sandbox_child PATH TIMEOUT_S``.

Started by ``stream_dp.worker.sandbox`` with an environment that holds none
of the worker's settings. It loads the function once, then runs every block
in a process of its own, forked from the loaded state: nothing a call leaves
behind (a global, a cache, a crash) reaches the next block, so one unit's
data can only ever change its own block's output. Protocol on its original
stdin/stdout (the function's own prints go to stderr): a request is an 8-byte
little-endian count ``n`` then ``n`` float64 values (``n = 2^64 - 1``: stop);
each answer is one JSON line, ``{"s": "ok", "v": x}``, ``{"s": "error", "e":
type name}``, ``{"s": "not_finite"}``, ``{"s": "timeout"}`` or ``{"s":
"crashed"}``; the first line says ``ready`` or ``load_error``. Imports
nothing of the worker.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import select
import signal
import struct
import sys
import time
from typing import Any

import numpy as np

from stream_dp.worker.process_guard import drop_capabilities

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


def _run_block(function: Any, values: np.ndarray, timeout_s: float, protocol: tuple[int, int]) -> dict[str, Any]:
    """The function's answer on one block, computed in a forked copy of this process and waited for here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the block's own process: it answers on its pipe and ends, whatever the function does
        code = 70
        try:
            os.setpgid(0, 0)  # its own group: a timeout ends whatever it started too
            os.close(read_end)
            for fd in protocol:  # the function never touches the sandbox's protocol pipes
                os.close(fd)
            try:
                out = float(function(values))
                message: dict[str, Any] = {"s": "ok", "v": out} if math.isfinite(out) else {"s": "not_finite"}
            except Exception as exc:  # the user's function failed on this block
                message = {"s": "error", "e": type(exc).__name__}
            os.write(write_end, json.dumps(message).encode())
            code = 0
        finally:
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # also here, so that the group exists whichever process runs first
    except OSError:  # it already ended, or set it itself
        pass
    os.close(write_end)
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    os.kill(pid, signal.SIGKILL)
                return {"s": "timeout"}
            chunk = os.read(read_end, 65_536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    try:
        return json.loads(data) if data else {"s": "crashed"}
    except ValueError:  # cut short by the process ending mid-answer
        return {"s": "crashed"}


def main(path: str, timeout_s: float) -> None:
    # the protocol keeps the original pipes; the function's stdout and stdin are stderr and /dev/null
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout = sys.stderr

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")

    try:
        drop_capabilities()  # before any of the user's code runs, its module's import included
        function = _load(path)
    except BaseException as exc:  # anything the import does: report it, then stop
        answer({"s": "load_error", "e": f"{type(exc).__name__}: {exc}"[:500]})
        return
    answer({"s": "ready"})
    protocol = (requests.fileno(), answers.fileno())
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
        answer(_run_block(function, np.frombuffer(body, dtype="<f8").copy(), timeout_s, protocol))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
