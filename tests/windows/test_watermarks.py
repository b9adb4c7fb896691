from __future__ import annotations

from stream_dp.windows import WindowSpec
from stream_dp.windows.watermarks import PartitionProgress, combined_watermark_ms

SPEC = WindowSpec(size_ms=60_000, allowed_lateness_ms=10_000, idle_timeout_ms=30_000)
NOW = 1_000_000


def progress(max_record: int | None, last_active: int = NOW, restored: int | None = None) -> PartitionProgress:
    return PartitionProgress(restored_through_ms=restored, last_active_wall_ms=last_active, max_record_ms=max_record)


def test_partition_watermark_is_newest_record_minus_lateness_floored_by_restore():
    assert progress(500_000).watermark_ms(10_000, NOW) == 490_000
    assert progress(500_000, restored=600_000).watermark_ms(10_000, NOW) == 600_000
    assert progress(None, restored=600_000).watermark_ms(10_000, NOW) == 600_000
    assert progress(None).watermark_ms(10_000, NOW) is None


def test_record_timestamps_ahead_of_the_wall_clock_count_as_now():
    assert progress(NOW + 3_600_000).watermark_ms(10_000, NOW) == NOW - 10_000


def test_minimum_over_active_partitions():
    assert combined_watermark_ms([progress(500_000), progress(300_000)], NOW, SPEC) == 290_000


def test_an_active_partition_without_events_holds_everything():
    assert combined_watermark_ms([progress(500_000), progress(None)], NOW, SPEC) is None


def test_idle_partitions_are_left_out():
    silent = progress(100_000, last_active=NOW - 30_000)  # exactly idle_timeout ago
    assert silent.is_idle(NOW, SPEC.idle_timeout_ms)
    assert combined_watermark_ms([progress(500_000), silent], NOW, SPEC) == 490_000
    never_delivered = progress(None, last_active=NOW - 40_000)
    assert combined_watermark_ms([progress(500_000), never_delivered], NOW, SPEC) == 490_000


def test_all_idle_follows_the_wall_clock():
    idle = [progress(100_000, last_active=NOW - 31_000), progress(None, last_active=NOW - 99_000)]
    assert combined_watermark_ms(idle, NOW, SPEC) == NOW - 10_000


def test_no_partitions_no_watermark():
    assert combined_watermark_ms([], NOW, SPEC) is None
