"""Sample-and-aggregate functions that try to reach the worker's services over the network.

Where the services are is written by the tests to ``service.txt`` in the
sandbox's temporary directory (the sandbox passes ``TMPDIR`` on): a line
``redis HOST PORT KEY`` or ``kafka HOST PORT``. A function that gets through
answers 1.0 (Redis: after ``INCR KEY`` and a ``PONG``; Kafka: after the
broker's ApiVersions response); one that is refused raises what the socket
call raised. ``connects_at_import`` does the same when its module is imported.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import subprocess
import sys

import numpy as np


def _service() -> list[str]:
    with open(os.path.join(os.environ["TMPDIR"], "service.txt")) as handle:
        return handle.read().split()


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the service closed the connection")
        data += chunk
    return data


def _resp(*words: str) -> bytes:
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words)


def reach_the_service() -> float:
    """1.0 once the service has answered (Redis: after the INCR changed its state); raises if refused."""
    kind, host, port, *rest = _service()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        if kind == "redis":
            sock.sendall(_resp("INCR", rest[0]) + _resp("PING"))
            answer = b""
            while not answer.endswith(b"+PONG\r\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise EOFError("Redis closed the connection")
                answer += chunk
            return 1.0
        client = b"probe"  # Kafka ApiVersions v0: api_key 18, version 0, correlation id 7, client id
        request = struct.pack(">hhih", 18, 0, 7, len(client)) + client
        sock.sendall(struct.pack(">i", len(request)) + request)
        size, correlation = struct.unpack(">ii", _exactly(sock, 8))
        _exactly(sock, size - 4)
        return 1.0 if correlation == 7 else 0.0


def reaches_the_service(values: np.ndarray) -> float:
    return reach_the_service()


def families_opened(values: np.ndarray) -> float:
    """How many of AF_INET, AF_INET6 and AF_UNIX (stream and datagram) sockets could be made: each refusal must be
    the sandbox's EACCES, anything else raises."""
    opened = 0
    for family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            try:
                socket.socket(family, kind).close()
                opened += 1
            except PermissionError as exc:
                if exc.errno != errno.EACCES:
                    raise
    return float(opened)


def a_socketpair_carries_the_values(values: np.ndarray) -> float:
    """A connected pair within the process is no way out: it still works."""
    left, right = socket.socketpair()
    with left, right:
        left.sendall(values.tobytes())
        return float(np.frombuffer(_exactly(right, values.nbytes)).sum())


_LIBC = ctypes.CDLL(None, use_errno=True)
_X32 = 0x40000000


def _syscall_errno(number: int, *args: int) -> float:
    """0 if the raw system call succeeded (its descriptor closed), else its errno."""
    ctypes.set_errno(0)
    result = _LIBC.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    if result >= 0:
        os.close(result)
        return 0.0
    return float(ctypes.get_errno())


def io_uring_setup_errno(values: np.ndarray) -> float:
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    return _syscall_errno(425, 1, ctypes.addressof(params))


def x32_socket_errno(values: np.ndarray) -> float:
    """socket(AF_INET, SOCK_STREAM) through the x32 ABI's number (x86_64 only)."""
    return _syscall_errno(_X32 | 41, socket.AF_INET, socket.SOCK_STREAM, 0)


def a_program_it_starts_opens_a_socket(values: np.ndarray) -> float:
    """1.0 if a new program (execve) may make a socket, 0.0 if it gets EACCES."""
    script = ("import socket, sys\ntry:\n    socket.socket().close()\nexcept PermissionError as exc:\n"
              "    sys.exit(0 if exc.errno == 13 else 3)\nsys.exit(1)")
    return float(subprocess.run([sys.executable, "-c", script], check=False).returncode)


def socket_descriptors(values: np.ndarray) -> float:
    """How many of this block's process's descriptors are sockets (inherited ones included)."""
    return float(sum(os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
                     for name in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{name}")))
