"""Runs a sample-and-aggregate query's user function away from the worker: one child process per query.

The child is started fresh (``spawn``: a new interpreter, none of the
worker's objects, sockets or memory), with the worker's settings
(``STREAM_DP_*``, ``KAFKA_*``, ``REDIS_*``) removed from its environment
before the function's module is imported. It receives one block's values at a
time and answers with a number. Each block has its own time limit: a block
whose function raises, returns something that is not a finite number, runs
past ``timeout_s`` or kills its process counts as failed (the plan puts the
output range's midpoint in its place) and the child is restarted for the
next block -- so one unit's data can only ever change its own block's
output, never stop the worker or the other blocks.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
from collections import Counter
from typing import Any

import numpy as np

from stream_dp.dp.sample_aggregate import parse_function_path

log = logging.getLogger(__name__)

_SCRUBBED_PREFIXES = ("STREAM_DP_", "KAFKA_", "REDIS_")
_START_TIMEOUT_S = 60.0


class FunctionLoadError(ValueError):
    """The function's import path does not name a callable that can be loaded."""


def _load(path: str) -> Any:
    import importlib

    module_name, attribute = parse_function_path(path)
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    if not callable(target):
        raise TypeError(f"{path} is a {type(target).__name__}, not a function")
    return target


def _child(path: str, conn: Any) -> None:
    """The child's loop: scrub the environment, load the function, answer one block at a time."""
    for name in list(os.environ):
        if name.startswith(_SCRUBBED_PREFIXES):
            del os.environ[name]
    try:
        function = _load(path)
    except BaseException as exc:  # anything the import does: report it, then stop
        conn.send(("load_error", f"{type(exc).__name__}: {exc}"[:500]))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        values = np.frombuffer(message, dtype=np.float64)
        try:
            out = float(function(values))
            conn.send(("ok", out) if math.isfinite(out) else ("error", "not_finite"))
        except Exception as exc:  # the user's function failed on this block
            conn.send(("error", type(exc).__name__))


class FunctionSandbox:
    """One query's user function in a child process (module docstring). Thread-safe; starts on first use."""

    def __init__(self, function: str, *, timeout_s: float = 1.0) -> None:
        parse_function_path(function)
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.function = function
        self.timeout_s = timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self._failures: Counter[str] = Counter()
        self._error_types: Counter[str] = Counter()

    def check(self) -> None:
        """Start the child and load the function; raises ``FunctionLoadError`` with the child's reason."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_child, args=(self.function, child), daemon=True,
                                        name=f"stream-dp-sandbox:{self.function}")
        process.start()
        child.close()
        if not parent.poll(_START_TIMEOUT_S):
            process.kill()
            raise FunctionLoadError(f"function {self.function}: the sandbox did not start within {_START_TIMEOUT_S:g} s")
        try:
            status, detail = parent.recv()
        except EOFError:
            status, detail = "load_error", f"the process exited with code {process.exitcode}"
        if status != "ready":
            process.join(5)
            raise FunctionLoadError(
                f"function {self.function} cannot be loaded: {detail}; make its module importable by the worker "
                "(installed, or on PYTHONPATH) and name a function as package.module:function"
            )
        self._process, self._conn = process, parent

    def _restart(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
        self._process = self._conn = None

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
                payload = np.ascontiguousarray(values, dtype=np.float64).tobytes()
                try:
                    self._conn.send(payload)
                    if not self._conn.poll(self.timeout_s):
                        self._failures["timeout"] += 1
                        self._restart()
                        continue
                    status, detail = self._conn.recv()
                except (EOFError, OSError):  # the function ended its process (BrokenPipe is an OSError)
                    self._failures["crashed"] += 1
                    self._restart()
                    continue
                if status == "ok":
                    out[i] = detail
                elif detail == "not_finite":
                    self._failures["not_finite"] += 1
                else:
                    self._failures["error"] += 1
                    self._error_types[detail] += 1
        return out

    def take_failures(self) -> dict[str, int]:
        """Failed blocks by reason (``error``, ``not_finite``, ``timeout``, ``crashed``, ``load_error``) since the last call,
        for the worker's metrics and log (counts only: no values, no unit ids); exception types are logged."""
        with self._lock:
            if self._error_types:
                log.warning("%s raised on %s", self.function,
                            ", ".join(f"{n} block(s): {name}" for name, n in self._error_types.most_common(5)))
            self._error_types = Counter()
            failures, self._failures = dict(self._failures), Counter()
        return failures

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
            if self._process is not None:
                self._process.join(2)
            self._restart()
