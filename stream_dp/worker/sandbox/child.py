"""The sandbox process of a sample-and-aggregate function: ``python -m stream_dp.worker.sandbox.child PATH TIMEOUT_S``.

Started by ``stream_dp.worker.sandbox.runner`` with an environment of the few
variables it passes on (``sandbox.runner.PASSED_ON``), none a setting or a secret.
Before the function's module is imported it makes itself not dumpable, drops
every capability (``guard.process``) and takes sockets away for good
(``guard.network``: no Redis, no Kafka, no other service, for it and every
process forked or started from it); if any of these fails it answers
``load_error`` with ``UNGUARDED`` and never loads the function. It loads the function once, then runs every block
in a process of its own, forked from the loaded state: nothing a call leaves
behind (a global, a cache, a crash, a process it started) reaches the next
block, so one unit's data can only ever change its own block's output.

This process never reads a block's values, nor an answer: memory that held
them keeps them after it is freed (allocators reuse memory, they do not clear
it), and every later block is forked from this process, so a function reading
raw memory would find earlier blocks' units there. Instead it forks the next
block's process *before* the request comes; that process reads the request
itself, says so with one byte, runs the function and writes its answer to its
own pipe, and once it has ended this process moves the answer on to the worker
inside the kernel (``os.splice``). All this process learns of a block is that
it came and whether it ended in time.

Protocol on its original stdin/stdout (the function's own prints go to
stderr): a request is an 8-byte little-endian count ``n`` then ``n`` float64
values (``n = 2^64 - 1``: stop); every answer, the first included, is one
``ANSWER`` record: a status byte (an index into ``STATUSES``), a float64 (the
value, for ``ok``) and NUL-padded UTF-8 text (``what_failed``'s class name, a
load error). The first answer is ``ready`` or ``load_error``. Imports nothing of the
worker.
"""

from __future__ import annotations

import builtins
import fcntl
import importlib
import inspect
import numbers
import math
import os
import select
import signal
import struct
import sys
import termios
import time
from typing import Any

import numpy as np

from stream_dp.worker.guard.network import deny_sockets
from stream_dp.worker.guard.process import drop_capabilities, make_undumpable

STOP = (1 << 64) - 1
STATUSES = ("ok", "error", "not_finite", "timeout", "crashed", "ready", "load_error")
ANSWER = struct.Struct("<Bd503s")  # 512 bytes: one write of at most PIPE_BUF, so never mixed with another's
_COUNT = struct.Struct("<Q")
_TAKEN = b"\x01"  # a block's process has read its whole request: its time limit starts
UNGUARDED = "unguarded: "  # starts a load error's text: a guard could not be set up, the function was not loaded


class UnfitFunction(TypeError):
    """The function loads, but no block could get a number from it; its message says how to fix it."""


def encode(status: str, value: float = 0.0, text: str = "") -> bytes:
    return ANSWER.pack(STATUSES.index(status), value, text.encode(errors="replace"))


def decode(record: bytes) -> dict[str, Any]:
    """``{"s": status, "v": value, "e": text}``; a status byte outside ``STATUSES`` (a block writing to its pipe
    itself) reads as ``crashed``."""
    code, value, text = ANSWER.unpack(record)
    status = STATUSES[code] if code < len(STATUSES) else "crashed"
    return {"s": status, "v": value, "e": text.rstrip(b"\0").decode(errors="replace")}


_TIMEOUT, _CRASHED = encode("timeout"), encode("crashed")


def _read_into(fd: int, view: memoryview) -> bool:
    """Fill ``view`` from ``fd``; False if it ends first."""
    got = 0
    while got < len(view):
        chunk = os.readv(fd, [view[got:]])
        if not chunk:
            return False
        got += chunk
    return True


def class_name(cls: type) -> str:
    """``cls``'s name if it is one of Python's builtin classes or numpy's, else its nearest such base's with
    `` (subclass)``: a class the function defines has a name of its choosing, which may spell out its data.
    Only the identity with the builtin class makes a name trusted, never the name itself."""
    try:
        for base in cls.__mro__:
            name = base.__name__
            if getattr(builtins, name, None) is base:
                found = name
            elif getattr(np, name, None) is base:
                found = f"numpy.{name}"
            else:
                continue
            return found if base is cls else f"{found} (subclass)"
    except Exception:  # a metaclass's own __name__ or __mro__
        pass
    return "object (subclass)"


def _answer(function: Any, values: np.ndarray) -> bytes:
    """The block's answer: a real number (a Python or numpy int or float; not a bool, not text), or what failed,
    as a builtin class name only (``class_name``), never an exception's message or a value."""
    try:
        out = function(values)
        if isinstance(out, (bool, np.bool_)) or not isinstance(out, numbers.Real):
            return encode("error", text=f"returned {class_name(type(out))}, not a number")
        value = float(out)
    except Exception as exc:  # the user's function failed on this block
        return encode("error", text=class_name(type(exc)))
    return encode("ok", value) if math.isfinite(value) else encode("not_finite")


def _load(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    if not callable(target):
        raise UnfitFunction(f"{path} is a {type(target).__name__}, not a function; name a function that takes a "
                            "block's values (one numpy array) and returns a number")
    _check_takes_one_block(path, target)
    return target


def _check_takes_one_block(path: str, target: Any) -> None:
    """Refuse what no block could ever get a number from, when it is loaded (and so by ``check-config``),
    rather than as a failed block at every release: a class (calling it makes an instance) and a function
    that cannot be called with one argument, the block's values."""
    if isinstance(target, type):
        raise UnfitFunction(f"{path} is a class, and calling it makes an instance, not a number; name a function "
                        "that takes a block's values (one numpy array) and returns a number")
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (some builtins and C functions): left to the calls
        return
    try:
        signature.bind(np.empty(0))
    except TypeError as exc:
        raise UnfitFunction(f"{path}{signature} cannot be called with one argument, a block's values ({exc}); name a "
                        "function of one argument, e.g. def f(values): return float(values.mean()), or give the "
                        "others defaults") from None


def _read_request(fd: int) -> np.ndarray | None:
    """The next block's values, read straight into the array the function gets; None: stop, or the worker is gone."""
    head = bytearray(_COUNT.size)
    if not _read_into(fd, memoryview(head)):
        return None
    (count,) = _COUNT.unpack(head)
    if count == STOP:
        return None
    values = np.empty(count, dtype="<f8")
    return values if _read_into(fd, memoryview(values.view(np.uint8))) else None


def _serve_block(function: Any, requests: int, answers: int, write_end: int) -> None:
    """The block's own process: read the request, say so, run the function, answer on ``write_end``; never returns."""
    code = 70
    try:
        os.setpgid(0, 0)  # its own group: whatever it starts ends with it
        values = _read_request(requests)
        if values is not None:
            for fd in (requests, answers):  # the function never touches the protocol: no later request, no answer
                os.close(fd)
            os.write(write_end, _TAKEN)
            os.write(write_end, _answer(function, values))
        code = 0
    finally:
        sys.stderr.flush()
        os._exit(code)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # no group (it ended before setting it): the process alone, if still there
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _hung_up_in_time(fd: int, timeout_s: float) -> bool:
    """Wait until every writer of pipe ``fd`` has closed it (the block's process has ended), up to ``timeout_s``."""
    poller = select.poll()
    poller.register(fd, 0)  # no event asked for: the answer's bytes do not wake it, the hang-up does
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if poller.poll(min(math.ceil(left * 1000), 3_600_000)):  # in ms, a C int: a longer limit waits in turns
            return True
    return False


def _waiting_bytes(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, bytes(4)))[0]


_RELAY = bytearray(ANSWER.size)  # only where os.splice is missing (not Linux); overwritten with zeros after each use
_ZEROS = bytes(ANSWER.size)


def _forward(source: int, target: int) -> None:
    """Move one answer from pipe ``source`` to ``target`` without it passing through this process's memory."""
    if hasattr(os, "splice"):
        left = ANSWER.size
        while left:
            moved = os.splice(source, target, left)
            if not moved:
                raise EOFError("the answer ended early")
            left -= moved
        return
    relay = memoryview(_RELAY)  # no splice: through one fixed buffer (never reallocated, cleared right after)
    try:
        if not _read_into(source, relay):
            raise EOFError("the answer ended early")
        os.write(target, relay)
    finally:
        relay[:] = _ZEROS


def _run_block(function: Any, timeout_s: float, requests: int, answers: int) -> bool:
    """Fork the next block's process, wait for its request and its answer, pass the answer on; False: stop."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _serve_block(function, requests, answers, write_end)
    try:
        os.setpgid(pid, pid)  # also here, so that the group exists whichever process runs first
    except OSError:  # it already ended, or set it itself
        pass
    os.close(write_end)
    try:
        # blocks until the worker's next request, however long; no byte: it read a stop, the worker is gone, or it
        # ended mid-request and where the next request starts is unknown -- the worker sees this process end
        if os.read(read_end, 1) != _TAKEN:
            return False
        ended = _hung_up_in_time(read_end, timeout_s)
        _kill_group(pid)  # also what it started: nothing of this block is left when the worker sends the next
        os.waitpid(pid, 0)
        pid = 0
        if not ended:
            os.write(answers, _TIMEOUT)
        elif _waiting_bytes(read_end) >= ANSWER.size:
            _forward(read_end, answers)
        else:  # it ended without answering (a crash, os._exit, a signal) or mid-answer
            os.write(answers, _CRASHED)
        return True
    finally:
        os.close(read_end)  # and with it, unread, anything more the block's process wrote
        if pid:
            _kill_group(pid)
            os.waitpid(pid, 0)


def main(path: str, timeout_s: float) -> None:
    # the protocol keeps the original pipes; the function's stdout and stdin are stderr and /dev/null
    requests, answers = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    try:
        # Before any of the user's code runs, its module's import included. Not dumpable: a block's process
        # (same user, no capabilities) cannot open this process's /proc/PID/fd, the pipes of every later request.
        # No sockets (after drop_capabilities, which sets the no_new_privs the filter needs): no Redis, no Kafka.
        make_undumpable()
        drop_capabilities()
        deny_sockets()
    except OSError as exc:  # fail closed: without its guards the function is not loaded at all
        os.write(answers, encode("load_error", text=f"{UNGUARDED}{exc}"))
        return
    try:
        function = _load(path)
    except UnfitFunction as exc:
        os.write(answers, encode("load_error", text=f"{UnfitFunction.__name__}: {exc}"))
        return
    except BaseException as exc:  # anything the import does: report it, then stop
        os.write(answers, encode("load_error", text=f"{type(exc).__name__}: {exc}"))
        return
    os.write(answers, encode("ready"))
    while _run_block(function, timeout_s, requests, answers):
        pass


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
