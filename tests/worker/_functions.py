"""User functions for the sample-and-aggregate tests: well-behaved ones and every way one can misbehave."""

from __future__ import annotations

import os
import sys
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


def raises_its_values(values: np.ndarray) -> float:
    """Raises an exception whose class is named after the block's values (and whose message holds them)."""
    name = "V_" + "_".join(f"{v:g}".replace(".", "p").replace("-", "m") for v in values)
    raise type(name, (LookupError,), {})(f"values {values.tolist()}")


def raises_a_library_error(values: np.ndarray) -> float:
    """statistics.StatisticsError, a ValueError subclass defined by the standard library, not a builtin."""
    import statistics

    return statistics.stdev(values)


def returns_the_count_as_text(values: np.ndarray) -> float:
    return str(len(values))  # type: ignore[return-value]


def returns_a_bool(values: np.ndarray) -> float:
    return bool(len(values))  # type: ignore[return-value]


def returns_a_numpy_bool(values: np.ndarray) -> float:
    return np.bool_(len(values))  # type: ignore[return-value]


def returns_numbers_of_every_kind(values: np.ndarray) -> float:
    """A Python int, a float, a numpy integer and a numpy float, by the block's first value."""
    kinds = [int, float, np.int64, np.float32]
    return kinds[int(values[0]) % 4](len(values))


# The marker every secret of test_sandbox.py holds, whatever variable it is in.
SECRET_MARK = "do-not-leak-0123456789abcdef"


def sees_a_secret(values: np.ndarray) -> float:
    """1.0 if any variable of the sandbox's environment holds a secret (names and values, any case)."""
    return float(any(SECRET_MARK in f"{name}={value}" for name, value in os.environ.items()))


NOT_A_FUNCTION = 3


def sees_a_secret_in_proc(values: np.ndarray) -> float:
    """1.0 if the process's initial environment block (what /proc shows) held a secret."""
    with open("/proc/self/environ", "rb") as handle:
        return float(SECRET_MARK.encode() in handle.read())


def environment_names(values: np.ndarray) -> float:
    """The sandbox's environment, its names written to stderr (the test reads them there); 0.0."""
    print("ENVIRONMENT", " ".join(sorted(os.environ)), file=sys.stderr, flush=True)
    return 0.0


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


def needs_two(values: np.ndarray, other: np.ndarray) -> float:
    return float(len(values) + len(other))


def needs_a_keyword(values: np.ndarray, *, scale: float) -> float:
    return float(len(values)) * scale


def takes_nothing() -> float:
    return 1.0


class AnError(KeyError):
    """Calling it with a block makes an exception instance, never a number."""


def with_a_default(values: np.ndarray, scale: float = 2.0) -> float:
    return float(len(values)) * scale
