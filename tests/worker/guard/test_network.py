"""A sample-and-aggregate function cannot open a socket: it reaches neither Redis nor Kafka nor anything else.

Real processes against the real services: a block (or the function's module,
as it is imported) connects to the Redis of ``redis_url`` and sends ``INCR``
and ``PING``, or to the Kafka broker and asks for its API versions. Each must
be refused with the sandbox's ``EACCES`` before a byte leaves, and Redis must
show no trace of it. The filter's decisions are also checked against the
kernel's system call numbers with a small classic-BPF interpreter written from
the kernel's documentation (``Documentation/networking/filter.rst``).
"""

from __future__ import annotations

import errno
import os
import platform
import re
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import redis

from stream_dp.worker.guard import network as network_guard
from stream_dp.worker.sandbox.runner import FunctionLoadError, FunctionSandbox
from tests.worker.sandbox.test_runner import SANDBOXED_QUERY

ROOT = Path(__file__).resolve().parents[3]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's")
X86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="the x32 ABI is x86_64's")


def _run_one(path: str, values: list[float]) -> tuple[float, dict[str, int]]:
    sandbox = FunctionSandbox(path, timeout_s=10.0)
    try:
        (out,) = sandbox.run([np.array(values, dtype=np.float64)]).tolist()
        return out, sandbox.take_failures()
    finally:
        sandbox.close()


@pytest.fixture
def redis_probe(redis_url, tmp_path, monkeypatch):
    """``service.txt`` naming the real Redis and a fresh key; yields a client of the test's own and the key."""
    parts = urlsplit(redis_url)
    key = f"stream-dp-test:sandbox-network:{uuid.uuid4().hex}"
    (tmp_path / "service.txt").write_text(f"redis {parts.hostname} {parts.port or 6379} {key}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    client = redis.Redis.from_url(redis_url)
    try:
        yield client, key
    finally:
        client.delete(key)
        client.close()


@pytest.fixture
def kafka_probe(kafka_bootstrap, tmp_path, monkeypatch):
    host, _, port = kafka_bootstrap.split(",")[0].rpartition(":")
    (tmp_path / "service.txt").write_text(f"kafka {host} {port}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@LINUX
@pytest.mark.services
def test_a_block_cannot_reach_redis(redis_probe, caplog):
    """The block's INCR never reaches Redis: the socket call fails with PermissionError, the block counts as
    failed, and the key the block would have incremented does not exist."""
    client, key = redis_probe
    out, failures = _run_one("tests.worker._network_probe:reaches_the_service", [1.0])
    assert np.isnan(out), out  # 1.0: the block got its PONG
    assert failures == {"error": 1}
    assert "1 block(s): PermissionError" in caplog.text, caplog.text
    assert client.exists(key) == 0


@LINUX
@pytest.mark.services
def test_a_block_cannot_reach_kafka(kafka_probe, caplog):
    out, failures = _run_one("tests.worker._network_probe:reaches_the_service", [1.0])
    assert np.isnan(out), out  # 1.0: the broker answered
    assert failures == {"error": 1}
    assert "1 block(s): PermissionError" in caplog.text, caplog.text


def _refused_at_import() -> None:
    sandbox = FunctionSandbox("tests.worker._connects_at_import:statistic")
    try:
        with pytest.raises(FunctionLoadError, match=r"cannot be loaded: PermissionError: \[Errno 13\]"):
            sandbox.check()
    finally:
        sandbox.close()


@LINUX
@pytest.mark.services
def test_a_module_that_reaches_redis_when_imported_is_refused(redis_probe):
    client, key = redis_probe
    _refused_at_import()
    assert client.exists(key) == 0


@LINUX
@pytest.mark.services
def test_a_module_that_reaches_kafka_when_imported_is_refused(kafka_probe):
    _refused_at_import()


@LINUX
def test_no_socket_of_any_family_opens_and_a_socketpair_still_works():
    assert _run_one("tests.worker._network_probe:families_opened", [1.0]) == (0.0, {})
    assert _run_one("tests.worker._network_probe:a_socketpair_carries_the_values", [1.5, 2.0]) == (3.5, {})
    assert _run_one("tests.worker._functions:mean_or_zero", [1.0, 2.0]) == (1.5, {})


@LINUX
def test_io_uring_and_programs_the_function_starts_are_refused_too():
    assert _run_one("tests.worker._network_probe:io_uring_setup_errno", [1.0]) == (errno.EACCES, {})
    # a filter outlives execve: a program started by the block (a redis-cli, a new interpreter) has none either
    assert _run_one("tests.worker._network_probe:a_program_it_starts_opens_a_socket", [1.0]) == (0.0, {})


@LINUX
@X86_64
def test_the_x32_abi_is_refused():
    assert _run_one("tests.worker._network_probe:x32_socket_errno", [1.0]) == (errno.EACCES, {})


@LINUX
def test_a_block_inherits_no_socket_from_the_worker(redis_url):
    """The worker holds Redis and Kafka connections; the sandbox gets its pipes only (close_fds)."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()  # this process now holds a socket
        assert _run_one("tests.worker._network_probe:socket_descriptors", [1.0]) == (0.0, {})
    finally:
        client.close()


# the sandbox tests' query with a function that needs nothing of the machine
_QUERY = SANDBOXED_QUERY.replace("tests.worker._secret_probe:statistic", "tests.worker._functions:mean_or_zero")


@LINUX
def test_where_the_filter_cannot_be_installed_check_config_refuses_the_function(tmp_path):
    """Fail closed: on a machine the filter has no numbers for (here the interpreter is told it runs on riscv64,
    in the worker and so in its sandbox, which gets the worker's import path), the function is not loaded."""
    (tmp_path / "sitecustomize.py").write_text("import platform\nplatform.machine = lambda: 'riscv64'\n")
    config = tmp_path / "queries.yaml"
    config.write_text(_QUERY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "stream_dp.cli.main", "check-config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert done.returncode != 0, done.stdout + done.stderr
    assert re.search(r"sample_aggregate\.function: function tests\.worker\._functions:mean_or_zero was not loaded, "
                     r"its sandbox cannot be set up: cannot take the network away from the function's process: no "
                     r"filter for riscv64 with a 64-bit Python; run the worker on Linux x86_64 or aarch64",
                     done.stderr), done.stderr


_WRONG_FILTER = """
from stream_dp.worker.guard import network as network_guard
from stream_dp.worker.guard.process import drop_capabilities
for arch in network_guard.ARCHES.values():
    arch.denied = tuple(nr for nr in arch.denied if nr not in (41, 198))  # socket's number left out
drop_capabilities()
try:
    network_guard.deny_sockets()
except network_guard.NetworkGuardError as exc:
    print(exc)
"""


@LINUX
def test_a_filter_that_lets_a_socket_through_is_caught_when_installed():
    """Fail closed on the kernel's word, not the program's: after installing, a socket must fail with EACCES."""
    done = subprocess.run([sys.executable, "-c", _WRONG_FILTER], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=True)
    assert "a socket could still be made after installing the filter; run the worker on Linux" in done.stdout, \
        done.stdout + done.stderr


# --- the filter's decisions, without a kernel --------------------------------------------------------------
# From Documentation/networking/filter.rst (classic BPF) and Documentation/userspace-api/seccomp_filter.rst:
# the program reads struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}, little-endian here.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "i386": 0x40000003, "arm": 0x40000028}
# system call numbers from the kernel's tables (syscall_64.tbl; asm-generic/unistd.h for aarch64)
DENIED_NUMBERS = {"x86_64": {41: "socket", 425: "io_uring_setup", 438: "pidfd_getfd"},
                  "aarch64": {198: "socket", 425: "io_uring_setup", 438: "pidfd_getfd"}}
ALLOWED_NUMBERS = {"x86_64": {53: "socketpair", 42: "connect", 0: "read", 1: "write", 57: "fork", 59: "execve"},
                   "aarch64": {199: "socketpair", 203: "connect", 63: "read", 64: "write", 220: "clone"}}
ALLOW, EACCES_ERRNO = 0x7FFF0000, 0x00050000 | errno.EACCES


def _run_bpf(instructions, nr: int, arch: int) -> int:
    """A classic-BPF interpreter for the instructions a seccomp filter of this kind needs; anything else raises."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *([0] * 6))
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = instructions[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            (accumulator,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif code in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K: forward only, jt if true
            taken = accumulator == k if code == 0x15 else accumulator >= k
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"instruction {pc}: opcode {code:#x} is not one this interpreter knows")
        assert pc < len(instructions), "a jump past the end of the program"


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_denies_exactly_sockets_io_uring_and_fd_theft_of_its_own_abi(machine):
    instructions = network_guard.program(network_guard.ARCHES[machine])
    arch = AUDIT_ARCH[machine]
    for nr, name in ALLOWED_NUMBERS[machine].items():
        assert _run_bpf(instructions, nr, arch) == ALLOW, name
    decided = {nr: _run_bpf(instructions, nr, arch) for nr in range(1024)}
    assert {nr for nr, action in decided.items() if action != ALLOW} == set(DENIED_NUMBERS[machine])
    assert {decided[nr] for nr in DENIED_NUMBERS[machine]} == {EACCES_ERRNO}
    for other, audit in AUDIT_ARCH.items():  # another ABI's calls: every one refused, whatever its number
        if other != machine:
            assert {_run_bpf(instructions, nr, audit) for nr in range(0, 1024, 7)} == {EACCES_ERRNO}, other


def test_the_x32_abi_is_refused_by_the_x86_64_filter_whatever_the_call():
    instructions = network_guard.program(network_guard.ARCHES["x86_64"])
    assert {_run_bpf(instructions, 0x40000000 | nr, AUDIT_ARCH["x86_64"]) for nr in range(0, 1024)} == {EACCES_ERRNO}
