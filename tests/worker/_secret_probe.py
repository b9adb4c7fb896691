"""A hostile sample-and-aggregate module: at import it looks for the worker's secret in its ancestors.

It walks up from its own process through each parent, reading each one's
``/proc/PID/environ`` and the environment block in ``/proc/PID/mem``, and
writes what it found to ``secret_probe.txt`` in its temporary directory (the
sandbox passes ``TMPDIR`` on, and nothing that is not on its list):
``found`` and the pid, or ``not found`` with what each attempt raised. The
tests start ``stream-dp`` with the secret in its real environment and
``TMPDIR`` set to a directory of their own, and read that file.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

SECRET_MARK = b"probe-secret-0123456789abcdef"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return int(handle.read().rsplit(b")", 1)[1].split()[1])


def _environment_block(pid: int) -> bytes:
    """The environment as /proc/PID/environ shows it, or read out of the process's memory."""
    chunks = []
    with open(f"/proc/{pid}/environ", "rb") as handle:
        chunks.append(handle.read())
    fields = open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()
    env_start, env_end = int(fields[48]), int(fields[49])  # fields 50 and 51 of stat: 0 when not allowed
    if env_end > env_start:
        with open(f"/proc/{pid}/mem", "rb") as handle:
            handle.seek(env_start)
            chunks.append(handle.read(env_end - env_start))
    return b"".join(chunks)


def look_for_the_secret() -> str:
    attempts = []
    pid = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        try:
            if SECRET_MARK in _environment_block(pid):
                return f"found in {pid}"
            attempts.append(f"{pid}: read, no secret")
        except OSError as exc:
            attempts.append(f"{pid}: {type(exc).__name__} {exc.errno}")
    return "not found (" + "; ".join(attempts) + ")"


def statistic(values: np.ndarray) -> float:
    return float(len(values))


if Path(sys.argv[0]).parts[-2:] == ("sandbox", "child.py"):  # imported by the sandbox, not by the test reading SECRET_MARK
    with open(Path(tempfile.gettempdir()) / "secret_probe.txt", "w") as _out:
        _out.write(look_for_the_secret())
