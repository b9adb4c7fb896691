"""The release age rule: no window is noised once its ledger entry could have expired."""

import pytest

from stream_dp.config import Settings
from stream_dp.worker.release.stage import too_old_to_release

HOUR = 3_600_000
LIMIT = 10 * HOUR


def test_the_older_of_record_time_and_window_end_decides():
    now = 100 * HOUR
    assert not too_old_to_release(now - LIMIT + 1, now, now, LIMIT)
    assert too_old_to_release(now - LIMIT, now, now, LIMIT)
    # A partial written long after its window closed (an ingest replay): the window's end decides.
    assert too_old_to_release(now - LIMIT - HOUR, now - HOUR, now, LIMIT)
    # A record stamped before its window's end (a producer clock behind): the stamp decides.
    assert too_old_to_release(now - HOUR, now - LIMIT, now, LIMIT)
    assert not too_old_to_release(now - HOUR, now - LIMIT + 1, now, LIMIT)


@pytest.mark.parametrize("timestamp", [None, -1])
def test_a_record_without_timestamp_is_judged_by_its_window_end(timestamp):
    now = 100 * HOUR
    assert not too_old_to_release(now - LIMIT + 1, timestamp, now, LIMIT)
    assert too_old_to_release(now - LIMIT, timestamp, now, LIMIT)


def test_the_limit_is_the_ledger_ttl_less_an_hour(monkeypatch):
    assert Settings().release_age_limit_ms == 8 * 24 * HOUR - HOUR
    monkeypatch.setenv("STREAM_DP_INPUT_RETENTION_MS", str(HOUR))
    monkeypatch.setenv("STREAM_DP_LEDGER_TTL_S", "8200")
    assert Settings().release_age_limit_ms == 8_200_000 - HOUR
