"""User functions for the sample-and-aggregate tests: well-behaved ones and every way one can misbehave."""

from __future__ import annotations

import os
import time

import numpy as np


def mean_or_zero(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else 0.0


def fails_on_negative(values: np.ndarray) -> float:
    if (values < 0).any():
        raise ArithmeticError("a negative value")
    return float(values.sum())


def slow_on_large(values: np.ndarray) -> float:
    if (values > 1000).any():
        time.sleep(30)
    return float(len(values))


def exits_on_seven(values: np.ndarray) -> float:
    if (values == 7).any():
        os._exit(3)
    return float(len(values))


def nan_always(values: np.ndarray) -> float:
    return float("nan")


def sees_worker_settings(values: np.ndarray) -> float:
    """1.0 if any worker setting (a secret among them) reached the sandbox's environment."""
    return float(any(name.startswith(("STREAM_DP_", "KAFKA_", "REDIS_")) for name in os.environ))


NOT_A_FUNCTION = 3


def sees_worker_settings_in_proc(values: np.ndarray) -> float:
    """1.0 if the process's initial environment block (what /proc shows) held a worker setting."""
    with open("/proc/self/environ", "rb") as handle:
        names = [entry.split(b"=", 1)[0] for entry in handle.read().split(b"\0")]
    return float(any(name.startswith((b"STREAM_DP_", b"KAFKA_", b"REDIS_")) for name in names))


def prints_to_stdout(values: np.ndarray) -> float:
    print("a function's own output must not break the sandbox's protocol", len(values))
    return float(len(values))


_SEEN: list[float] = []


def remembers_what_it_saw(values: np.ndarray) -> float:
    """State across calls: the first block's mean, whatever block it is given (a cache gone wrong).

    Run in one process for every block, it would carry one block's units into every other block's output.
    """
    if len(values):
        _SEEN.append(float(values.mean()))
    return _SEEN[0] if _SEEN else 0.0


def counts_its_calls(values: np.ndarray) -> float:
    """How many blocks this process has seen: 1.0 in a process of its own."""
    _SEEN.append(0.0)
    return float(len(_SEEN))
