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

**Free heap pages (glibc).** What is freed inside the heap stays resident until
glibc reuses it; only the heap's top is given back. So a burst -- a fetched
backlog read and decoded, a large window closed -- left the worker's RSS at
its high-water mark for good (a traced soak that fell behind held 193 MB free
inside the heap). Every ``STREAM_DP_HEAP_TRIM_S`` seconds (default 30) a
thread calls ``malloc_trim(0)``, which hands every whole free page of every
arena back (about 2 ms for a heap of 40 MB, outside the GIL; another thread's
``malloc`` waits for the arena being trimmed meanwhile).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading

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


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system now (glibc's ``malloc_trim``); False elsewhere."""
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    malloc_trim(0)
    return True


def start_heap_trim(interval_s: float, stop: threading.Event | None = None) -> threading.Thread | None:
    """A daemon thread calling ``trim_heap`` every ``interval_s`` seconds until ``stop`` is set; None
    when ``interval_s`` is 0 or there is no glibc."""
    if interval_s < 0:
        raise ValueError(f"the heap trim interval must be 0 (never) or positive seconds, got {interval_s}")
    if interval_s == 0 or not trim_heap():
        return None
    stop = stop if stop is not None else threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            trim_heap()

    thread = threading.Thread(target=run, name="heap-trim", daemon=True)
    thread.start()
    return thread


def tune_process(heap_trim_s: float = 30.0) -> None:
    """Both, as the worker process runs them (call once, after start-up), the heap trim every
    ``heap_trim_s`` seconds (0: never), and the memory report if ``STREAM_DP_MEMORY_TRACE`` asks for one
    (``memory_trace``)."""
    tune_allocator()
    tune_garbage_collector()
    start_heap_trim(heap_trim_s)
    start_memory_trace()
