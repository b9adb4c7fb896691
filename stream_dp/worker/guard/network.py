"""Takes the network away from a sample-and-aggregate function's process: a seccomp filter that refuses sockets.

A function runs as the worker's OS user, and the worker's state is a network
connection away: the Redis budget store and release ledger, the Kafka topics
of input events and partials. A function that could connect to them could
spend or reset budgets, or read other units' data into its block's output,
and one unit would no longer move one block only. The sandbox process
therefore installs this filter before it imports the function, and every
block's process, forked from it, and every program those start (a filter
outlives ``fork`` and ``execve`` and cannot be removed) keep it:

* ``socket(2)`` fails with ``EACCES``, whatever the family (``AF_INET`` and
  ``AF_INET6`` reach services, ``AF_UNIX`` a Redis unix socket, ``AF_NETLINK``
  the kernel's); ``socketpair`` stays allowed: a pair connects to nothing;
* ``io_uring_setup`` fails the same way (io_uring can open and connect sockets
  without a ``socket`` call);
* ``pidfd_getfd`` too (it copies a descriptor, a connected socket included,
  out of another process);
* a system call of another ABI is refused whatever it is: on x86_64 the i386
  one (``int 0x80``, whose ``socketcall`` would open a socket) and the x32 one
  (numbers from ``0x40000000``), which this filter's numbers do not cover.

The sandbox holds no socket to begin with (it talks to the worker over the
pipes it inherits, and ``subprocess`` closes the worker's other descriptors),
so with no way to make one, it has none. The filter needs ``no_new_privs``
(``guard.process.drop_capabilities`` sets it) and works on Linux x86_64 and
aarch64; elsewhere ``deny_sockets`` raises, and the sandbox refuses to load
the function rather than run it with the network. Imports nothing of the
worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import sys

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
DENIED = SECCOMP_RET_ERRNO | errno.EACCES

# classic BPF opcodes (linux/bpf_common.h)
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
BPF_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR_OFFSET, ARCH_OFFSET = 0, 4
X32_SYSCALL_BIT = 0x40000000


class Arch:
    """One ABI: its ``AUDIT_ARCH_*`` value and the numbers of the system calls refused."""

    def __init__(self, audit: int, socket: int, io_uring_setup: int, pidfd_getfd: int, x32_bit: bool) -> None:
        self.audit = audit
        self.denied = (socket, io_uring_setup, pidfd_getfd)
        self.x32_bit = x32_bit


ARCHES = {  # linux/audit.h; the numbers: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h
    "x86_64": Arch(audit=0xC000003E, socket=41, io_uring_setup=425, pidfd_getfd=438, x32_bit=True),
    "aarch64": Arch(audit=0xC00000B7, socket=198, io_uring_setup=425, pidfd_getfd=438, x32_bit=False),
}
ARCHES["arm64"] = ARCHES["aarch64"]  # platform.machine()'s name for it on some systems

_HOW_TO_FIX = ("run the worker on Linux x86_64 or aarch64 with a 64-bit Python and seccomp filters available "
               "(CONFIG_SECCOMP_FILTER; in a container, a seccomp profile that allows prctl)")


class NetworkGuardError(OSError):
    """The filter cannot be installed here; its message says what failed and how to fix it."""


def program(arch: Arch) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions: a foreign ABI, an x32 call or a denied call returns
    ``DENIED``, anything else ``SECCOMP_RET_ALLOW``. A jump's offsets count the instructions it skips."""
    checks: list[tuple[int, int]] = []  # (opcode, k) of each test that, when true, denies
    if arch.x32_bit:
        checks.append((BPF_JGE_K, X32_SYSCALL_BIT))
    checks += [(BPF_JEQ_K, nr) for nr in arch.denied]
    # 0: load arch; 1: not ours -> deny; 2: load nr; 3..: checks; then allow, deny
    deny_at = 3 + len(checks) + 1
    out = [(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET), (BPF_JEQ_K, 0, deny_at - 2, arch.audit), (BPF_LD_W_ABS, 0, 0, NR_OFFSET)]
    for i, (code, k) in enumerate(checks):
        out.append((code, deny_at - (3 + i) - 1, 0, k))
    out += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, DENIED)]
    return out


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _refuse(what: str) -> NetworkGuardError:
    return NetworkGuardError(f"cannot take the network away from the function's process: {what}; {_HOW_TO_FIX}")


def deny_sockets() -> None:
    """Install the filter in this process, for good; raises ``NetworkGuardError`` where it cannot be, or if a
    socket can still be made after it."""
    machine = platform.machine()
    if not sys.platform.startswith("linux"):
        raise _refuse(f"seccomp is Linux's, this is {sys.platform}")
    arch = ARCHES.get(machine)
    if arch is None or sys.maxsize <= 2**32:  # a 32-bit interpreter makes another ABI's calls: all refused
        raise _refuse(f"no filter for {machine} with a {64 if sys.maxsize > 2**32 else 32}-bit Python")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    instructions = program(arch)
    filters = (_SockFilter * len(instructions))(*(_SockFilter(*i) for i in instructions))
    fprog = _SockFprog(len(instructions), filters)
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        code = ctypes.get_errno()
        raise _refuse(f"prctl(PR_SET_SECCOMP) failed: {os.strerror(code)}"
                      + (" (no_new_privs is not set)" if code == errno.EACCES else ""))
    # fail closed: a kernel that accepted the filter but does not apply it is caught here
    fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM
    if fd >= 0:
        os.close(fd)
        raise _refuse("a socket could still be made after installing the filter")
    if ctypes.get_errno() != errno.EACCES:
        raise _refuse(f"socket() failed with {os.strerror(ctypes.get_errno())}, not the filter's EACCES")
