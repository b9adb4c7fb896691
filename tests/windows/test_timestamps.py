from __future__ import annotations

import pytest

from stream_dp.windows.specs import MAX_TIMESTAMP_MS
from stream_dp.windows.timestamps import parse_iso8601_ms, to_epoch_ms


def test_auto_reads_small_numbers_as_seconds_and_large_as_milliseconds():
    ms, problems = to_epoch_ms([1_700_000_000, 1_700_000_000_123, 1_700_000_000.123, 99_999_999_999], "auto")
    assert problems == {}
    assert ms.tolist() == [1_700_000_000_000, 1_700_000_000_123, 1_700_000_000_123, 99_999_999_999_000]


def test_fractional_seconds_round_to_the_nearest_millisecond():
    ms, _ = to_epoch_ms([1_700_000_000.0005, 1_700_000_000.9999], "epoch_s")
    assert ms.tolist() == [1_700_000_000_000, 1_700_000_001_000]


def test_fractional_milliseconds_are_floored():
    ms, _ = to_epoch_ms([1_700_000_000_123.9, 5.5], "epoch_ms")
    assert ms.tolist() == [1_700_000_000_123, 5]


def test_iso8601_needs_a_zone_and_honours_offsets():
    ms, problems = to_epoch_ms(
        ["2024-01-01T00:00:00Z", "2024-01-01T02:00:00.250+02:00", "2024-01-01T00:00:00"], "iso8601"
    )
    assert ms[:2].tolist() == [1_704_067_200_000, 1_704_067_200_250]
    assert list(problems) == [2] and "no zone" in problems[2]


def test_auto_mixes_numbers_and_strings():
    ms, problems = to_epoch_ms([1_704_067_200, "2024-01-01T00:00:01Z", "junk", 1_704_067_202_000], "auto")
    assert ms[[0, 1, 3]].tolist() == [1_704_067_200_000, 1_704_067_201_000, 1_704_067_202_000]
    assert list(problems) == [2] and "not an ISO-8601 time" in problems[2]


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), MAX_TIMESTAMP_MS + 1, 10**400])
def test_out_of_range_numbers_are_problems(bad):
    _, problems = to_epoch_ms([1_704_067_200_000, bad], "epoch_ms")
    assert list(problems) == [1]


def test_latest_accepted_time_is_the_end_of_year_9999():
    ms, problems = to_epoch_ms([MAX_TIMESTAMP_MS, "9999-12-31T23:59:59.999Z"], "auto")
    assert problems == {} and ms.tolist() == [MAX_TIMESTAMP_MS, MAX_TIMESTAMP_MS]


def test_parse_reports_what_is_wrong():
    assert parse_iso8601_ms("2024-01-01T00:00:00Z") == 1_704_067_200_000
    assert "not an ISO-8601" in str(parse_iso8601_ms("tomorrow"))
