"""The worker's memory housekeeping: the periodic heap trim and the opt-in memory report (pure: no services)."""

from __future__ import annotations

import logging
import threading
import tracemalloc

import pytest

from stream_dp.config.settings import Settings
from stream_dp.worker.process import memory_trace, tuning


def test_the_heap_trim_runs_every_interval_until_stopped(monkeypatch):
    calls = []
    trimmed = threading.Event()

    def counting_trim() -> bool:
        calls.append(1)
        if len(calls) >= 3:  # the check at start and two rounds of the thread
            trimmed.set()
        return True

    monkeypatch.setattr(tuning, "trim_heap", counting_trim)
    stop = threading.Event()
    thread = tuning.start_heap_trim(0.01, stop)
    assert thread is not None and thread.daemon
    assert trimmed.wait(30)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_a_heap_trim_interval_of_zero_starts_nothing_and_a_negative_one_is_refused(monkeypatch):
    monkeypatch.setattr(tuning, "trim_heap", lambda: pytest.fail("trimmed although the interval was 0"))
    assert tuning.start_heap_trim(0) is None
    with pytest.raises(ValueError, match="0 \\(never\\) or positive seconds"):
        tuning.start_heap_trim(-1)


def test_trim_heap_runs_on_this_platform():
    assert tuning.trim_heap() in (True, False)  # False only without glibc; it must never raise


def test_the_heap_trim_interval_is_a_setting(monkeypatch):
    monkeypatch.setenv("STREAM_DP_HEAP_TRIM_S", "0")
    assert Settings().heap_trim_s == 0
    monkeypatch.delenv("STREAM_DP_HEAP_TRIM_S")
    assert Settings().heap_trim_s == 30.0


def test_the_memory_report_is_off_unless_asked_for():
    assert memory_trace.settings_from({}) is None
    assert memory_trace.start_from_env({}) is None
    assert memory_trace.settings_from({"STREAM_DP_MEMORY_TRACE": "60"}) == (60.0, memory_trace.DEFAULT_FRAMES)
    assert memory_trace.settings_from({"STREAM_DP_MEMORY_TRACE": "5", "STREAM_DP_MEMORY_TRACE_FRAMES": "3"}) == (5.0, 3)
    for bad in ({"STREAM_DP_MEMORY_TRACE": "soon"}, {"STREAM_DP_MEMORY_TRACE": "-1"},
                {"STREAM_DP_MEMORY_TRACE": "5", "STREAM_DP_MEMORY_TRACE_FRAMES": "0"}):
        with pytest.raises(ValueError, match="STREAM_DP_MEMORY_TRACE"):
            memory_trace.settings_from(bad)


def _grow(kept: list) -> None:
    kept.extend(bytearray(100_000) for _ in range(50))  # 5 MB from this line


def test_the_memory_report_names_the_site_that_grew():
    was_tracing = tracemalloc.is_tracing()
    tracemalloc.start(4)
    try:
        first, lines = memory_trace.report(None)
        assert len(lines) == 1 and lines[0].startswith("memory: RSS ") and "traced" in lines[0]
        kept: list = []
        _grow(kept)
        _, lines = memory_trace.report(first, top=3)
        grew_mb, site = float(lines[1].split()[0]), lines[1]
        assert "test_memory.py" in site and grew_mb >= 4.5, lines  # the 5 MB of ``_grow``, named by its line
    finally:
        if not was_tracing:
            tracemalloc.stop()


def test_resident_memory_and_heap_totals_are_read():
    held = memory_trace.resident()
    assert held["rss"] > 0 and held["anonymous"] > 0
    heap = memory_trace.heap_info()
    assert heap is None or heap["in_use"] > 0
