"""A memory report for finding what a long-running worker keeps: off unless asked for.

``STREAM_DP_MEMORY_TRACE=SECONDS`` starts Python's ``tracemalloc`` (with
``STREAM_DP_MEMORY_TRACE_FRAMES`` frames per allocation, default 12) and a
daemon thread that logs, every SECONDS, one line of totals -- the process's
RSS, what tracemalloc traces (Python objects and numpy arrays), and glibc's
own account of its heap (``mallinfo2``: in use, free but kept, mapped) -- and
the allocation sites that grew most since the previous report. RSS well above
the traced total points at the C heap (fragmentation, or a C library's
buffers such as librdkafka's); a site that grows report after report is what
keeps memory.

Tracing costs CPU and memory on every allocation (a few tens of percent of
the worker's throughput), so it is for a soak or a staging worker, never for
production. Unset, nothing is imported or started.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

TRACE_ENV = "STREAM_DP_MEMORY_TRACE"
FRAMES_ENV = "STREAM_DP_MEMORY_TRACE_FRAMES"
DEFAULT_FRAMES = 12
TOP_SITES = 12


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_info() -> dict[str, int] | None:
    """glibc's heap totals in bytes (``mallinfo2``, glibc 2.33+): ``in_use``, ``free`` (kept by the heap),
    ``mapped`` (blocks served by their own mappings), ``arena`` (the heap's size); None elsewhere."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {"in_use": info.uordblks, "free": info.fordblks, "mapped": info.hblkhd, "arena": info.arena}


def resident() -> dict[str, int]:
    """This process's resident memory in bytes (Linux; empty elsewhere): ``rss``, and its ``anonymous`` part
    (heaps, Python's object arenas, numpy arrays) and ``file`` part (mapped libraries)."""
    names = {"VmRSS:": "rss", "RssAnon:": "anonymous", "RssFile:": "file"}
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key = line.split(None, 1)[0] if line.strip() else ""
                if key in names:
                    out[names[key]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def rss_bytes() -> int:
    """This process's resident set size (Linux; 0 elsewhere)."""
    return resident().get("rss", 0)


def settings_from(environ: Mapping[str, str]) -> tuple[float, int] | None:
    """(seconds between reports, frames per allocation) from ``environ``; None when tracing is off."""
    raw = environ.get(TRACE_ENV, "").strip()
    if not raw:
        return None
    try:
        interval = float(raw)
        frames = int(environ.get(FRAMES_ENV, DEFAULT_FRAMES))
    except ValueError:
        raise ValueError(f"{TRACE_ENV} must be seconds between memory reports (e.g. 60) and {FRAMES_ENV} a whole "
                         f"number of frames, got {raw!r} and {environ.get(FRAMES_ENV)!r}") from None
    if interval <= 0 or frames < 1:
        raise ValueError(f"{TRACE_ENV} must be positive and {FRAMES_ENV} at least 1, got {raw!r} and {frames}")
    return interval, frames


def _site(trace_frames: Any) -> str:
    """Where an allocation was made: its innermost frame, and the innermost frame of stream_dp above it
    (tracemalloc lists a traceback's frames oldest first)."""
    innermost = trace_frames[-1]
    own = next((f for f in reversed(trace_frames) if "stream_dp" in f.filename), None)
    where = f"{innermost.filename}:{innermost.lineno}"
    if own is not None and (own.filename, own.lineno) != (innermost.filename, innermost.lineno):
        where += f" (from {own.filename.rsplit('stream_dp', 1)[-1]}:{own.lineno})"
    return where


def report(previous: Any, top: int = TOP_SITES) -> tuple[Any, list[str]]:
    """A snapshot and the lines describing it against ``previous`` (a snapshot, or None for the first)."""
    import tracemalloc

    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")])
    traced, peak = tracemalloc.get_traced_memory()
    heap = heap_info()
    mb = 1 / 2**20
    held = resident()
    totals = (f"memory: RSS {held.get('rss', 0) * mb:.1f} MB ({held.get('anonymous', 0) * mb:.1f} anonymous), "
              f"traced {traced * mb:.1f} MB (peak {peak * mb:.1f})")
    if heap is not None:
        totals += (f", C heap in use {heap['in_use'] * mb:.1f} MB, free in heap {heap['free'] * mb:.1f} MB, "
                   f"mapped blocks {heap['mapped'] * mb:.1f} MB")
    lines = [totals]
    if previous is not None:
        for stat in snapshot.compare_to(previous, "traceback")[:top]:
            lines.append(f"  {stat.size_diff * mb:+8.2f} MB ({stat.size * mb:8.2f} MB, {stat.count_diff:+d} blocks) "
                         f"{_site(stat.traceback)}")
    return snapshot, lines


def start_from_env(environ: Mapping[str, str] | None = None) -> threading.Thread | None:
    """Start tracing and the reporting thread if ``STREAM_DP_MEMORY_TRACE`` asks for it; None when it does not."""
    settings = settings_from(os.environ if environ is None else environ)
    if settings is None:
        return None
    import tracemalloc

    interval, frames = settings
    tracemalloc.start(frames)
    log.warning("tracing allocations (%s=%g s, %d frames): the worker runs slower and pauses at each report "
                "(raise STREAM_DP_CONSUMER_SESSION_TIMEOUT_MS); never in production",
                TRACE_ENV, interval, frames)

    def run() -> None:
        previous = None
        while True:
            threading.Event().wait(interval)
            previous, lines = report(previous)
            log.info("\n".join(lines))

    thread = threading.Thread(target=run, name="memory-trace", daemon=True)
    thread.start()
    return thread
