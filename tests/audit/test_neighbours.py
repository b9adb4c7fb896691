"""The audit harness's own bookkeeping (pure): which continual windows it samples."""

from __future__ import annotations

import pytest

from tests.audit.neighbours import SCENARIOS, audited_windows, release_key

CONTINUAL = next(s for s in SCENARIOS if s.name == "continual")


@pytest.mark.parametrize("start_ms", [1_795_438_896_000, 1_795_438_897_000])  # even and odd seconds
def test_continual_samples_are_the_last_window_of_whole_periods(start_ms):
    """Periods of 2 s start at even seconds; the sample of a period is its second window, whatever
    the parity of the stream's start (half the runs once started on an odd second and waited forever)."""
    chosen = audited_windows(CONTINUAL, start_ms, 20)
    assert len(chosen) >= 9
    for w in range(20):
        start = start_ms + w * 1000
        index = (start // 1000) % 2 + 1  # the window's place in its period, as the worker numbers it
        record = {"window": {"start_ms": start}, "group": {"group": "a"}, "continual": {"window_index": index}}
        sampled = release_key(CONTINUAL, record) is not None
        assert (w in chosen) == (sampled and w >= 1), (w, index)
