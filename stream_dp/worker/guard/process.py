"""Keeps a sample-and-aggregate function out of the processes that hold the worker's secrets (Linux).

A user function runs in a sandbox process of the worker's own OS user. Any
process of a user may read ``/proc/PID/environ`` and ``/proc/PID/mem`` of that
user's other processes, so a function could walk up to its parent and read
``STREAM_DP_CONTRIBUTION_SECRET`` or a Redis password from the worker's
environment -- unless the worker is *not dumpable*: then the kernel lets only
a process with ``CAP_SYS_PTRACE`` in, which an ordinary user never has, and
root does. So:

* every ``stream-dp`` process makes itself not dumpable at start
  (``make_undumpable``; ``execve`` resets the flag, so each process must);
* the sandbox drops every capability before it loads the function
  (``drop_capabilities``), so a worker run as root is protected too, and sets
  ``no_new_privs`` so that no set-user-id program gives them back.

The third guard, no sockets (``guard.network.deny_sockets``), keeps the
function from the worker's state in Redis and Kafka; it needs the
``no_new_privs`` set here. Unlike these two it fails closed outside Linux.

Imports nothing of the worker: the sandbox process uses it before loading the
user's code. Outside Linux both are no-ops that return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_LAST_CAP_FILE = "/proc/sys/kernel/cap_last_cap"
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _prctl(libc: ctypes.CDLL, option: int, arg: int = 0) -> None:
    if libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {arg}) failed: {os.strerror(errno)}")


def make_undumpable() -> bool:
    """Forbid other processes of this user (without CAP_SYS_PTRACE) to read this one's memory and environment."""
    libc = _libc()
    if libc is None:
        return False
    _prctl(libc, PR_SET_DUMPABLE, 0)
    return True


def is_dumpable() -> bool:
    libc = _libc()
    return True if libc is None else bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def drop_capabilities() -> bool:
    """Give up every capability for good (bounding, ambient, effective, permitted, inheritable) and set no_new_privs.

    Raises ``OSError`` if the capabilities cannot be cleared: the sandbox then
    refuses to load the function rather than run it with them.
    """
    libc = _libc()
    if libc is None:
        return False
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    try:
        with open(_CAP_LAST_CAP_FILE) as handle:
            last_cap = int(handle.read())
    except OSError:
        last_cap = 40
    for cap in range(last_cap + 1):
        # Needs CAP_SETPCAP, which only a privileged process has; an unprivileged one has nothing to drop.
        libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    empty = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), empty) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: cannot clear the sandbox's capabilities: {os.strerror(errno)}")
    held = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), held) != 0 or any(d.effective or d.permitted for d in held):
        raise OSError("the sandbox still holds capabilities after clearing them")
    return True
