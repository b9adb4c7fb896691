"""Runs a sample-and-aggregate query's user function away from the worker: one sandbox process per query.

The sandbox is a new interpreter (``python -m stream_dp.worker.sandbox.child``:
none of the worker's objects, sockets or memory) started with an environment
of the few variables in ``PASSED_ON`` and nothing else -- the worker's settings
are read in any case (``redis_url`` as well as ``REDIS_URL``), and a secret may
sit in any variable, so none is ever set there, not even in
``/proc/self/environ`` -- and with the worker's import path as
``PYTHONPATH``, so the function loads as it would in the worker. It loads the function once and runs each block in a fresh process
forked from that state, with the block's time limit: whatever a call leaves
behind (globals, caches, a crash, a process it started in its process group) dies with its block,
and the sandbox process never reads a block's values or answer (the block's
own process reads its request; ``sandbox.child`` says why), so no freed memory
carries one block's units into a later block's process. The worker writes it
nothing but requests, one block at a time, the next only once this one's
answer is back (by then every process of the block's group is gone; one that left it, with setsid, is
not: the sandbox keeps the operator's function off the worker's state, it is no jail for hostile code).
The sandbox process is not dumpable, so a block cannot reach its pipes through ``/proc``, and can make no
socket (``guard.network``), so no block reaches Redis or Kafka; where that cannot be ensured the function is
refused when loaded. A block whose function
raises, returns something that is not a finite real number, runs past
``timeout_s`` or ends its process counts as failed (the plan puts the output
range's midpoint in its place) -- so one unit's data can only ever change its
own block's output, never stop the worker or reach the other blocks.
"""

from __future__ import annotations

import builtins
import logging
import math
import os
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from typing import Any

import numpy as np

from stream_dp.dp.sample_aggregate import parse_function_path
from stream_dp.worker.sandbox.child import ANSWER, STOP, UNGUARDED, UnfitFunction, decode

log = logging.getLogger(__name__)

# What a process needs to run and find its files, locale and time zone; none holds a setting or a secret.
# PYTHONPATH is set from the worker's import path; PYTHONHOME, where the worker's interpreter needed it to
# find its standard library, the sandbox's needs it too. Exact names: settings are read whatever their case.
PASSED_ON = frozenset({
    "PATH", "HOME", "TMPDIR", "TZ", "LANG", "LANGUAGE", "LC_ALL", "LC_ADDRESS", "LC_COLLATE", "LC_CTYPE",
    "LC_IDENTIFICATION", "LC_MEASUREMENT", "LC_MESSAGES", "LC_MONETARY", "LC_NAME", "LC_NUMERIC", "LC_PAPER",
    "LC_TELEPHONE", "LC_TIME", "PYTHONHASHSEED", "PYTHONHOME",
})
_START_TIMEOUT_S = 60.0
_ANSWER_GRACE_S = 10.0  # beyond a block's own limit, which the sandbox enforces: then the sandbox itself is stuck
_COUNT = struct.Struct("<Q")


class FunctionLoadError(ValueError):
    """The function's import path does not name a callable that can be loaded."""


class _Gone(Exception):
    """The child's answer did not come: it ended (``crashed``) or ran out of time (``timeout``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End a child and reap it (also when its sandbox is garbage collected or the worker exits)."""
    if process.poll() is None:
        process.kill()
    process.wait(5)
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


def _child_environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name in PASSED_ON}
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return env


_RETURNED, _NOT_A_NUMBER, _SUBCLASS = "returned ", ", not a number", " (subclass)"
_NAMESPACES = {"": builtins, "numpy": np}


def _logged_failure(text: str) -> str:
    """An ``error`` answer's text if it is one ``sandbox.child`` writes (a builtin or numpy class's name, as
    ``class_name`` gives it, or ``returned NAME, not a number``); anything else is a record the block wrote
    itself, whose text the function chose, and is not logged."""
    name = text
    if name.startswith(_RETURNED) and name.endswith(_NOT_A_NUMBER):
        name = name[len(_RETURNED):-len(_NOT_A_NUMBER)]
    module, _, attribute = name.removesuffix(_SUBCLASS).rpartition(".")
    namespace = _NAMESPACES.get(module)
    if namespace is not None and attribute.isidentifier() and isinstance(getattr(namespace, attribute, None), type):
        return text
    return "an answer not written by the sandbox"


class FunctionSandbox:
    """One query's user function in a child process (module docstring). Thread-safe; starts on first use."""

    def __init__(self, function: str, *, timeout_s: float = 1.0) -> None:
        parse_function_path(function)
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.function = function
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self._failures: Counter[str] = Counter()
        self._error_types: Counter[str] = Counter()

    def check(self) -> None:
        """Start the child and load the function; raises ``FunctionLoadError`` with the child's reason."""
        with self._lock:
            self._ensure_started()

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        """The child's next answer (``sandbox.child.decode``), or ``_Gone``."""
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while len(self._buffer) < ANSWER.size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Gone("timeout")
            chunk = os.read(fd, ANSWER.size - len(self._buffer))  # never beyond this answer
            if not chunk:
                raise _Gone("crashed")
            self._buffer += chunk
        record, self._buffer = self._buffer, b""
        return decode(record)

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self._process = subprocess.Popen(
            [sys.executable, "-m", "stream_dp.worker.sandbox.child", self.function, repr(self.timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_environment(), close_fds=True,
        )
        self._finalizer = weakref.finalize(self, _stop, self._process)
        self._buffer = b""
        try:
            first = self._answer(_START_TIMEOUT_S)
        except _Gone as gone:
            code = self._process.poll()
            self._restart()
            detail = (f"the sandbox did not start within {_START_TIMEOUT_S:g} s" if gone.reason == "timeout"
                      else f"the sandbox process exited with code {code}")
            raise FunctionLoadError(f"function {self.function}: {detail}") from None
        if first.get("s") != "ready":
            self._restart()
            unfit = f"{UnfitFunction.__name__}: "
            if str(first.get("e")).startswith(unfit):  # it loads: its message says what to change in it
                raise FunctionLoadError(f"function {str(first.get('e')).removeprefix(unfit)}")
            if str(first.get("e")).startswith(UNGUARDED):  # not the function's fault: the machine's
                raise FunctionLoadError(f"function {self.function} was not loaded, its sandbox cannot be set up: "
                                        f"{str(first.get('e')).removeprefix(UNGUARDED)}")
            raise FunctionLoadError(
                f"function {self.function} cannot be loaded: {first.get('e')}; make its module importable by the "
                "worker (installed, or on PYTHONPATH) and name a function as package.module:function"
            )

    def _restart(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # _stop, once
            self._finalizer = None
        self._process = None
        self._buffer = b""

    def run(self, blocks: list[np.ndarray]) -> np.ndarray:
        """The function's output on each block's values; NaN where it failed (reasons: ``take_failures``)."""
        out = np.full(len(blocks), np.nan)
        with self._lock:
            for i, values in enumerate(blocks):
                try:
                    self._ensure_started()
                except FunctionLoadError as exc:  # data-independent: every block left counts as failed
                    log.error("%s; %d block(s) count as failed", exc, len(blocks) - i)
                    self._failures["load_error"] += len(blocks) - i
                    break
                assert self._process is not None and self._process.stdin is not None
                payload = np.ascontiguousarray(values, dtype="<f8")
                try:
                    self._process.stdin.write(_COUNT.pack(len(payload)) + payload.tobytes())
                    self._process.stdin.flush()
                    reply = self._answer(self.timeout_s + _ANSWER_GRACE_S)
                except (_Gone, OSError) as exc:  # the sandbox itself ended or hangs (BrokenPipe: on a write)
                    self._failures[exc.reason if isinstance(exc, _Gone) else "crashed"] += 1
                    self._restart()
                    continue
                status = reply["s"]
                if status == "ok" and not math.isfinite(reply["v"]):  # only a record the function wrote itself
                    status = "not_finite"
                if status == "ok":
                    out[i] = reply["v"]
                elif status == "error":
                    self._failures["error"] += 1
                    self._error_types[_logged_failure(reply["e"])] += 1
                elif status in ("not_finite", "timeout"):
                    self._failures[status] += 1
                else:  # crashed, or a status that is no block's answer: the block broke the protocol
                    self._failures["crashed"] += 1
        return out

    def take_failures(self) -> dict[str, int]:
        """Failed blocks by reason (``error``, ``not_finite``, ``timeout``, ``crashed``, ``load_error``) since the last call,
        for the worker's metrics and log (counts only: no values, no unit ids); what an ``error`` raised or returned is
        logged as a builtin class's name (``sandbox.child.class_name``), never a name the function made up."""
        with self._lock:
            if self._error_types:
                log.warning("%s failed on %s", self.function,
                            ", ".join(f"{n} block(s): {name}" for name, n in self._error_types.most_common(5)))
            self._error_types = Counter()
            failures, self._failures = dict(self._failures), Counter()
        return failures

    def close(self) -> None:
        with self._lock:
            process = self._process
            if process is not None and process.poll() is None and process.stdin is not None:
                try:
                    process.stdin.write(_COUNT.pack(STOP))
                    process.stdin.flush()
                    process.wait(2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._restart()
