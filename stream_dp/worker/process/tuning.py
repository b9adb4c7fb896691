"""Process-wide settings of the worker: the garbage collector and the C heap.

**Garbage collector.** Every poll allocates and frees tens of thousands of
short-lived container objects (record batches' records, decoded events,
lists), and CPython's collector runs its youngest generation every 700
allocations and its full collection over every object the process holds --
the imported modules, the clients and the query objects built at start-up
included. Measured on the worker, that made reading records several times
slower than the same code in a small process. The worker therefore freezes
what start-up built (``gc.freeze``: full collections skip it) and collects the
youngest generation every ``gen0`` allocations instead. Reference counting
still frees nearly everything at once; only reference cycles wait a little
longer.

**C heap (glibc).** glibc serves a large allocation from a fresh memory
mapping, returned to the system when freed -- but after the first such block
is freed it raises that threshold (up to 32 MB), so the engine's large numpy
arrays then come from the heap, whose freed middle stays resident. An engine
holding 3M open (unit, group) pairs measured 144 bytes of RSS per pair that
way, 53 with the threshold fixed at 1 MB (48 of them its own arrays). The
worker fixes it (``mallopt(M_MMAP_THRESHOLD)``), which also stops the
adjusting; elsewhere than glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import gc
import logging

from stream_dp.worker.process.memory_trace import start_from_env as start_memory_trace

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def tune_garbage_collector(gen0: int = GEN0_THRESHOLD, gen1: int = GEN1_THRESHOLD, gen2: int = GEN2_THRESHOLD) -> None:
    """Freeze the objects alive now and set the collection thresholds (call once, after start-up)."""
    if gen0 < 1 or gen1 < 1 or gen2 < 1:
        raise ValueError(f"garbage-collector thresholds must be positive, got {gen0}, {gen1}, {gen2}")
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0, gen1, gen2)


def tune_allocator(mmap_threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve allocations of ``mmap_threshold`` bytes or more from their own mappings (glibc only);
    returns whether the setting took."""
    if mmap_threshold < 4096:
        raise ValueError(f"mmap_threshold must be at least a page (4096 bytes), got {mmap_threshold}")
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
    if not done:
        log.warning("could not set the C heap's mmap threshold; open windows may hold more memory than they use")
    return done


def tune_process() -> None:
    """Both, as the worker process runs them (call once, after start-up); and the memory report
    if ``STREAM_DP_MEMORY_TRACE`` asks for one (``memory_trace``)."""
    tune_allocator()
    tune_garbage_collector()
    start_memory_trace()
