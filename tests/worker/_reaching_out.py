"""Sample-and-aggregate functions that reach past their own call: a process left running, a forged answer.

Each must cost at most its own block: the process dies with its block, and
whatever a block writes to its answer pipe is its own answer at most, never the
next block's.
"""

from __future__ import annotations

import fcntl
import os
import subprocess

import numpy as np

from stream_dp.worker.sandbox.child import encode


def starts_a_process(values: np.ndarray) -> float:
    """Leaves ``sleep 60`` running and answers its pid."""
    return float(subprocess.Popen(["sleep", "60"]).pid)


def forges_on_seven(values: np.ndarray) -> float:
    """On a 7, writes an answer of its own (99) and more bytes to every pipe it may write to, then answers as usual."""
    if (values == 7).any():
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                writable = fd > 2 and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
                if writable and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                    os.write(fd, encode("ok", 99.0) + b"more than one answer" * 10)
            except OSError:  # the fd listing's own, closed since
                pass
    return float(len(values))


def forges_an_error_naming_its_values(values: np.ndarray) -> float:
    """Writes an error answer of its own whose text spells out its values, as if an exception class were named so."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            writable = fd > 2 and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            if writable and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                os.write(fd, encode("error", text=f"returned V_{values.tolist()}, not a number"))
        except OSError:  # the fd listing's own, closed since
            pass
    os._exit(0)


def opens_the_sandbox_pipes(values: np.ndarray) -> float:
    """How many of the long-lived sandbox process's descriptors (its request and answer pipes among them) this
    block's process can open through /proc: with one, it could read later blocks' requests and answer for them."""
    parent, opened = os.getppid(), 0
    for fd in range(16):
        try:
            handle = os.open(f"/proc/{parent}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        os.close(handle)
        opened += 1
    return float(opened)
