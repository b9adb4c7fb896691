"""A sample-and-aggregate function that looks for another block's values in memory it can read.

The test gives one block values equal to ``MARKER_BITS`` read as a float64 (a
pattern no other test value has) and the other blocks plain values. Each call
counts the places where those 8 bytes appear in the readable mappings of a
process's memory: ``copies_in_own_memory`` scans its own (``/proc/self/mem``),
``copies_in_the_sandbox_process`` the long-lived sandbox process it was forked
from (its parent). A block that was not given the marker and still finds it
sees what another block left behind.

The probe itself never holds the 8 bytes in one run: it keeps the pattern as an
int and looks for its two 4-byte halves separately, so a block that was not
given the marker finds 0.
"""

from __future__ import annotations

import os

import numpy as np

MARKER_BITS = 0x5EED_C0DE_0DD5_B10C  # read as a little-endian float64: about 1.9e149, finite
_CHUNK = 1 << 20
_UNREADABLE = ("[vvar]", "[vvar_vclock]", "[vsyscall]")  # mapped, but not through /proc/PID/mem


def marker_block(size: int) -> np.ndarray:
    """``size`` values, each the marker (for the test process, never called in the sandbox)."""
    return np.full(size, MARKER_BITS, dtype="<u8").view("<f8")


def _regions(pid: int | str) -> list[tuple[int, int]]:
    regions = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(address, 16) for address in fields[0].split("-"))
            if fields[1].startswith("r") and (fields[5] if len(fields) > 5 else "") not in _UNREADABLE:
                regions.append((start, end))
    return regions


def count_copies(pid: int | str) -> int:
    """How many times the marker's 8 bytes appear in the readable memory of process ``pid``."""
    low = (MARKER_BITS & 0xFFFF_FFFF).to_bytes(4, "little")
    high = (MARKER_BITS >> 32).to_bytes(4, "little")
    buffer = bytearray(_CHUNK + 7)  # a chunk and 7 bytes of the next: a match may straddle chunks
    count = 0
    regions = _regions(pid)  # listed once: the scan's own allocations must not change the list under it
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for start, end in regions:
            offset = start
            while offset < end:
                size = min(_CHUNK, end - offset)
                try:
                    got = os.preadv(fd, [memoryview(buffer)[: size + min(7, end - offset - size)]], offset)
                except OSError:  # a mapping that cannot be read (a guard page, one gone since listed)
                    break
                at = buffer.find(low, 0, got)
                while at != -1 and at < size:
                    if at + 8 <= got and buffer[at + 4 : at + 8] == high:
                        count += 1
                    at = buffer.find(low, at + 1, got)
                offset += size
    finally:
        os.close(fd)
    return count


def copies_in_own_memory(values: np.ndarray) -> float:
    return float(count_copies("self"))


def copies_in_the_sandbox_process(values: np.ndarray) -> float:
    """The count in the parent's memory, or -1 where this system does not let a process read its parent's."""
    try:
        return float(count_copies(os.getppid()))
    except PermissionError:
        return -1.0
