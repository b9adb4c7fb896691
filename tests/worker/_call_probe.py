"""A sample-and-aggregate function that leaves a trace of every call: which blocks the release ran it on.

Each block runs in a process of its own, forked from the sandbox, so nothing kept in memory survives a
call: the trace is a line appended to ``sample_probe.log`` in the temporary directory (``TMPDIR``, one of
the few variables the sandbox passes on: the tests set it to a directory of their own).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np


def logged_size(values: np.ndarray) -> float:
    """The block's size; logs the block's values (the tests make each group's values tell its group)."""
    with open(Path(tempfile.gettempdir()) / "sample_probe.log", "a") as log:
        log.write(" ".join(repr(float(v)) for v in values) + "\n")
    return float(len(values))
