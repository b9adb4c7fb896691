"""The audit harness's own bookkeeping (pure): which continual windows it samples."""

from __future__ import annotations

import pytest

from tests.audit.neighbours import SCENARIOS, audited_windows

CONTINUAL = next(s for s in SCENARIOS if s.name == "continual")


@pytest.mark.parametrize("start_ms", [1_795_438_896_000, 1_795_438_897_000])  # even and odd seconds
def test_continual_samples_are_whole_periods(start_ms):
    """Periods of 2 s start at even seconds; a sample is the sum of a period's two running totals, read at
    its second window, whatever the parity of the stream's start (half the runs once started on an odd
    second and waited forever)."""
    chosen = audited_windows(CONTINUAL, start_ms, 20)
    assert len(chosen) >= 9
    for w in chosen:
        first, second = start_ms + (w - 1) * 1000, start_ms + w * 1000
        # the windows' places in their period, as the worker numbers them: 1 then 2 of the same period
        assert ((first // 1000) % 2 + 1, (second // 1000) % 2 + 1) == (1, 2), w
        assert first // 2000 == second // 2000, w
