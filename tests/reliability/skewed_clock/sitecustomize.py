"""Run by the interpreter at start-up (``site``) in a process started with ``faked_clock_env``: its Python wall
clock, ``time.time`` and ``time.time_ns`` (every read of the wall clock in stream_dp), runs
``FAULT_CLOCK_SKEW_S`` seconds off. The monotonic clock and the C library's wall clock stay true."""

import os
import time

_SKEW_NS = round(float(os.environ.get("FAULT_CLOCK_SKEW_S", "0")) * 1e9)
_true_time_ns = time.time_ns


def _skewed_time() -> float:
    return (_true_time_ns() + _SKEW_NS) / 1e9


def _skewed_time_ns() -> int:
    return _true_time_ns() + _SKEW_NS


time.time = _skewed_time
time.time_ns = _skewed_time_ns
