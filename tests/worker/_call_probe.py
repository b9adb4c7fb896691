"""A sample-and-aggregate function that leaves a trace of every call: which blocks the release ran it on.

Each block runs in a process of its own, forked from the sandbox, so nothing kept in memory survives a
call: the trace is a line appended to the file named by ``SAMPLE_PROBE_LOG`` (an environment variable
the sandbox passes on, as it passes every variable that is not a worker setting).
"""

from __future__ import annotations

import os

import numpy as np


def logged_size(values: np.ndarray) -> float:
    """The block's size; logs the block's values (the tests make each group's values tell its group)."""
    with open(os.environ["SAMPLE_PROBE_LOG"], "a") as log:
        log.write(" ".join(repr(float(v)) for v in values) + "\n")
    return float(len(values))
