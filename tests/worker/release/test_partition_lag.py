"""Whether a partition that has not reported a window closed may be left out of its release."""

import pytest

from stream_dp.windows.watermarks import window_close_ms
from stream_dp.worker.release.partition_lag import PartitionEvidence


@pytest.mark.parametrize(
    ("evidence", "nothing_more", "behind"),
    [
        # committed past every record before the close offset: what it held is in its partials
        (PartitionEvidence(committed=40, log_start=0, log_end=90, close_offset=40), True, 0),
        (PartitionEvidence(committed=55, log_start=0, log_end=90, close_offset=40), True, 0),
        # records before the close offset not processed (committed: the first of an open window)
        (PartitionEvidence(committed=12, log_start=0, log_end=90, close_offset=40), False, 28),
        # no record at or after the close time yet: everything up to the log end may still hold events
        (PartitionEvidence(committed=80, log_start=0, log_end=90, close_offset=None), False, 10),
        (PartitionEvidence(committed=90, log_start=0, log_end=90, close_offset=None), True, 0),
        # never committed: counted from the log start (an empty partition holds nothing)
        (PartitionEvidence(committed=None, log_start=7, log_end=7, close_offset=None), True, 0),
        (PartitionEvidence(committed=None, log_start=7, log_end=9, close_offset=None), False, 2),
        (PartitionEvidence(committed=None, log_start=7, log_end=9, close_offset=7), True, 0),
        # a committed offset below the log start (retention deleted the rest) counts from the start
        (PartitionEvidence(committed=3, log_start=7, log_end=9, close_offset=8), False, 1),
    ],
)
def test_a_partition_holds_nothing_more_once_its_committed_offset_reached_the_close_offset(
    evidence, nothing_more, behind
):
    assert evidence.nothing_more is nothing_more
    assert evidence.records_behind == behind
    assert f"{behind} records" in evidence.describe()


def test_the_close_time_is_the_first_record_time_that_moves_the_watermark_past_the_end():
    assert window_close_ms(60_000, 0) == 60_000
    assert window_close_ms(60_000, 5_000) == 65_000
