from dataclasses import replace

import numpy as np
import pytest

from stream_dp.dp.histogram import SparseHistogram
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.partials.wire import PartialAggregate, Progress

MIN = 60_000


def _partial(partition, start, groups, counts, sums=None, distinct=None, parts=3, placed=None, changed=False):
    return PartialAggregate(
        query="q", window_start_ms=start, window_end_ms=start + MIN, partition=partition, input_partitions=parts,
        groups=groups, count=np.array(counts, dtype=np.int64),
        sum=None if sums is None else np.array(sums, dtype=np.float64),
        distinct_units=np.array(distinct if distinct is not None else counts, dtype=np.int64),
        units_charged=sum(counts), units_excluded=0, closed_at_ms=start + MIN + 1,
        placement_partitions=parts if placed is None else placed, placement_changed=changed,
    )


def _combiner(public=None, timeout=30_000, has_sum=True, start=0):
    # One partials partition: every window is homed at 0, and progress is read there. A public query's
    # first window (``start``) is known, as the release stage sets it from the ledger.
    c = WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=timeout,
                       public_groups=public, has_sum=has_sum)
    c.query_start_ms = start if public is not None else None
    return c


def test_waits_for_every_partition_or_its_progress():
    c = _combiner()
    c.add_partial(_partial(0, 0, [("a",)], [2], [1.0]), now_ms=0)
    c.add_partial(_partial(1, 0, [("a",), ("b",)], [1, 4], [2.0, 3.0]), now_ms=0)
    assert c.ready() == []
    c.add_progress(home=0, progress=Progress("q", 2, 3, MIN - 1))
    assert c.ready() == []
    c.add_progress(home=0, progress=Progress("q", 2, 3, MIN))
    assert c.ready() == [0]
    window = c.take(0)
    assert dict(zip(window.groups, window.count.tolist())) == {("a",): 3, ("b",): 4}
    assert dict(zip(window.groups, window.sum.tolist())) == {("a",): 3.0, ("b",): 3.0}
    assert window.partitions_missing == []
    assert c.pending_windows == 0


def test_no_wait_releases_a_window_without_a_partition_that_is_behind():
    c = _combiner(timeout=10_000)
    c.add_partial(_partial(0, 0, [("a",)], [2]), now_ms=1_000)
    assert c.overdue(now_ms=10_999) == []
    assert c.ready() == []
    # Past the timeout the window is overdue: the release stage asks the broker about partitions 1 and 2.
    (late,) = c.overdue(now_ms=11_000)
    assert (late.window_start_ms, late.window_end_ms, late.first_seen_ms, late.partitions) == (0, MIN, 1_000, [1, 2])
    assert c.ready() == []  # an hour later still: waiting is not given up by time
    c.leave_out(0, {2})  # the broker showed partition 2 holds nothing more for it
    assert [o.partitions for o in c.overdue(now_ms=3_600_000)] == [[1]]
    c.add_partial(_partial(1, 0, [("a",)], [5]), now_ms=3_600_000)
    assert c.overdue(now_ms=3_600_000) == [] and c.ready() == [0]
    window = c.take(0)
    assert window.count.tolist() == [7] and window.partitions_missing == [2]
    assert c.add_partial(_partial(2, 0, [("a",)], [5]), now_ms=3_700_000) is False  # late: refused


def test_an_empty_public_window_is_asked_about_past_its_timeout_like_one_with_data():
    """A window without a partial blocks its home's later windows until progress shows it empty. A partition
    whose worker is paused sends neither, so past the timeout the empty window is overdue like any other and
    the broker's answer releases it; a window with data behind it waits for it, never jumps ahead."""
    public = [("a",)]
    c = _combiner(public=public, timeout=10_000)
    c.add_progress(home=0, progress=Progress("q", 0, 2, 2 * MIN))  # partition 0 went on; partition 1 is paused
    c.add_partial(_partial(0, MIN, [("a",)], [3], parts=2), now_ms=2 * MIN)
    # timed from when it is first found holding up its home (here at its end), as a window from its first partial
    assert c.ready() == [] and c.overdue(now_ms=MIN) == [] and c.overdue(now_ms=MIN + 9_999) == []
    (empty,) = [o for o in c.overdue(now_ms=MIN + 10_000)]
    assert (empty.window_start_ms, empty.window_end_ms, empty.first_seen_ms, empty.partitions) == (0, MIN, MIN, [1])
    # window MIN (data from partition 0) is overdue too, from its first partial
    assert [o.window_start_ms for o in c.overdue(now_ms=2 * MIN + 10_000)] == [0, MIN]
    c.leave_out(0, {1})  # the broker: partition 1 holds nothing more for window 0
    assert c.ready() == [0]
    window = c.take(0)
    assert window.count.tolist() == [0] and window.partitions_missing == [1]
    assert c.ready() == []  # window MIN still waits for partition 1
    c.leave_out(MIN, {1})
    assert c.ready() == [MIN] and c.take(MIN).count.tolist() == [3]
    c.leave_out(0, {1})  # an answer about a window released meanwhile adds nothing
    assert c.pending_windows == 0


def test_an_old_empty_window_found_in_a_backlog_waits_its_timeout_from_then():
    """A backlog's windows ended long ago by the wall clock: an empty one found holding up its home is asked
    about only ``release_timeout`` after it was first found, not at once (its partitions are being read)."""
    c = _combiner(public=[("a",)], timeout=300_000)
    c.add_progress(home=0, progress=Progress("q", 0, 2, MIN))
    later = 30 * MIN  # the wall clock, half an hour past window 0
    assert c.overdue(now_ms=later) == [] and c.overdue(now_ms=later + 299_999) == []
    assert [(o.window_start_ms, o.first_seen_ms) for o in c.overdue(now_ms=later + 300_000)] == [(0, later)]
    c.add_progress(home=0, progress=Progress("q", 1, 2, MIN))  # partition 1 reports it: nothing waits
    assert c.overdue(now_ms=later + 300_000) == [] and c.ready() == [0]


def test_an_empty_window_no_partition_closed_is_not_asked_about_whatever_the_wall_clock():
    """Only a partition's progress shows a window ended: a releasing process whose clock runs ten minutes
    ahead must not ask the broker about windows that have not begun for the producers (nothing would be in
    them yet, and they would be released without partitions that were about to fill them)."""
    c = _combiner(public=[("a",)], timeout=1_000)
    c.note_input_partitions(2)
    assert c.overdue(now_ms=10 * MIN) == [] and c.overdue(now_ms=10 * MIN + 1_000) == []
    c.add_progress(home=0, progress=Progress("q", 0, 2, MIN))  # partition 0 closed window 0, no later one
    c.overdue(now_ms=10 * MIN)
    assert [o.window_start_ms for o in c.overdue(now_ms=20 * MIN)] == [0]


def test_partitions_the_topic_gained_are_waited_for():
    c = _combiner(timeout=1)
    c.add_partial(_partial(0, 0, [("a",)], [2], parts=2), now_ms=0)
    c.add_partial(_partial(1, 0, [("a",)], [3], parts=2), now_ms=0)
    c.note_input_partitions(6)  # the topic's metadata lists 6 partitions now
    c.note_input_partitions(2)  # an older count (a worker that has not seen the growth) changes nothing
    assert c.ready() == [] and [o.partitions for o in c.overdue(now_ms=1)] == [[2, 3, 4, 5]]
    for p in (2, 3, 4, 5):
        c.add_progress(home=0, progress=Progress("q", p, 6, MIN))
    assert c.ready() == [0]


def test_replayed_partial_of_same_partition_is_not_added_twice():
    c = _combiner(timeout=1)
    c.add_partial(_partial(0, 0, [("a",)], [2]), now_ms=0)
    c.add_partial(_partial(0, 0, [("a",)], [2]), now_ms=0)
    assert c.take(0).count.tolist() == [2]


def test_public_groups_fill_zeros_drop_unknown_groups_and_release_empty_windows():
    public = [("a",), ("b",)]
    c = _combiner(public=public, timeout=1_000_000)
    c.add_partial(_partial(0, 0, [("b",), ("zzz",)], [4, 9], [1.0, 9.0], parts=1), now_ms=0)
    c.add_progress(home=0, progress=Progress("q", 0, 1, MIN))
    assert c.ready() == [0]
    first = c.take(0)
    assert first.groups == public and first.count.tolist() == [0, 4] and first.sum.tolist() == [0.0, 1.0]
    # Three silent windows pass: each is released (empty) once progress passes it.
    c.add_progress(home=0, progress=Progress("q", 0, 1, 4 * MIN))
    assert c.ready() == [MIN, 2 * MIN, 3 * MIN]
    empty = c.take(MIN)
    assert empty.count.tolist() == [0, 0] and empty.closed_at_ms is None


def test_selected_groups_union_keys_and_count_only():
    c = _combiner(has_sum=False, timeout=1)
    c.add_partial(_partial(0, 0, [("a",), ("b",)], [1, 2], parts=2), now_ms=0)
    c.add_partial(_partial(1, 0, [("c",), ("a",)], [5, 7], parts=2), now_ms=0)
    window = c.take(0)
    assert dict(zip(window.groups, window.count.tolist())) == {("a",): 8, ("b",): 2, ("c",): 5}
    assert window.sum is None


def test_pending_source_offsets_hold_commits():
    c = _combiner()
    c.add_partial(_partial(0, 0, [("a",)], [1]), now_ms=0, source=(0, 17))
    c.add_partial(_partial(1, MIN, [("a",)], [1]), now_ms=0, source=(0, 18))
    assert sorted(c.pending_source_offsets()) == [(0, 17), (0, 18)]
    c.take(0)
    assert c.pending_source_offsets() == [(0, 18)]


def test_validation():
    with pytest.raises(ValueError, match="window_size_ms"):
        WindowCombiner("q", window_size_ms=0, window_offset_ms=0, release_timeout_ms=1, public_groups=None, has_sum=False)


def _homed(partitions=4):
    return WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=1_000_000,
                          public_groups=None, has_sum=False, partials_partitions=partitions)


def test_only_progress_read_in_the_windows_home_completes_it():
    c = _homed()
    home = c.home(0)
    other = (home + 1) % 4
    c.add_partial(_partial(0, 0, [("a",)], [1], parts=2), now_ms=0, source=(home, 5))
    # Partition 1's progress seen in another partials partition proves nothing about
    # partials still unread in the home partition.
    c.add_progress(Progress("q", 1, 2, MIN), home=other)
    assert c.ready() == []
    c.add_progress(Progress("q", 1, 2, MIN), home=home)
    assert c.ready() == [0]


def test_ready_and_revoke_respect_ownership():
    c = _homed()
    home = c.home(0)
    c.add_partial(_partial(0, 0, [("a",)], [1], parts=1), now_ms=0, source=(home, 1))
    c.add_progress(Progress("q", 0, 1, MIN), home=home)
    assert c.ready(owned={(home + 1) % 4}) == []
    assert c.ready(owned={home}) == [0]
    c.revoke({home})
    assert c.pending_windows == 0 and c.ready() == []


def test_window_home_is_stable_and_spread():
    from stream_dp.worker.partials.homes import window_home

    homes = [window_home("q", start * MIN, 4) for start in range(400)]
    assert homes == [window_home("q", start * MIN, 4) for start in range(400)]
    assert min(homes.count(h) for h in range(4)) > 60  # roughly uniform


def test_homes_that_never_released_fill_empty_windows_from_the_query_start():
    c = WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=1_000_000,
                       public_groups=[("a",)], has_sum=False, partials_partitions=2)
    home_of = {start: c.home(start * MIN) for start in range(20)}
    quiet_home = 1 - home_of[0]
    for home in (0, 1):
        c.add_progress(Progress("q", 0, 1, 20 * MIN), home=home)
    assert c.ready(owned={quiet_home}) == []  # nothing released anywhere yet: no start known
    c.query_start_ms = 0
    expected = [s * MIN for s in range(20) if home_of[s] == quiet_home]
    assert c.ready(owned={quiet_home}) == expected


@pytest.mark.parametrize(
    ("placements", "reason"),
    [
        ([(3, False), (3, True)], "partition_count_changed"),
        ([(3, False), (6, False)], "partition_counts_differ"),
        ([(3, False), (0, False)], "placement_unchecked"),
    ],
)
def test_partials_placed_under_different_partition_counts_are_left_out(placements, reason):
    """A unit could sit on both partitions, bounded twice: the window is released as if empty."""
    c = _combiner(timeout=1)
    for partition, (placed, changed) in enumerate(placements):
        c.add_partial(_partial(partition, 0, [("a",)], [1], [5.0], placed=placed, changed=changed), now_ms=0)
    window = c.take(0)
    assert window.withheld == reason
    assert window.groups == [] and window.count.tolist() == [] and window.sum.tolist() == []


def test_partials_placed_under_one_count_are_added_up():
    c = _combiner(timeout=1)
    c.add_partial(_partial(0, 0, [("a",)], [1], [5.0], placed=6), now_ms=0)
    c.add_partial(_partial(1, 0, [("a",)], [2], [1.0], placed=6), now_ms=0)
    window = c.take(0)
    assert window.withheld is None and window.count.tolist() == [3]


def test_a_lone_partial_is_released_whatever_its_placement():
    c = _combiner(timeout=1)
    c.add_partial(_partial(0, 0, [("a",)], [1], [5.0], placed=0), now_ms=0)
    assert c.take(0).withheld is None


def test_a_backlog_releases_every_window_of_a_home_in_order_the_empty_ones_too():
    """Windows with data and without, all ready at once (a backlog): none skipped, none out of order.

    Releasing the data windows first would move the home past the empty ones,
    which would then never be released: the gaps would show without noise
    which windows had activity.
    """
    public = [("a",)]
    c = _combiner(public=public)
    c.input_partitions = 1
    c.add_partial(_partial(0, 0, [("a",)], [1], [1.0], parts=1), now_ms=0)
    c.add_partial(_partial(0, 2 * MIN, [("a",)], [1], [1.0], parts=1), now_ms=0)
    c.add_partial(_partial(0, 4 * MIN, [("a",)], [1], [1.0], parts=1), now_ms=0)
    c.add_progress(home=0, progress=Progress("q", 0, 1, 3 * MIN))  # window 3 is not known to be empty yet
    assert c.ready() == [0, MIN, 2 * MIN]  # window 4 waits for window 3
    for start in c.ready():
        c.take(start)
    c.add_progress(home=0, progress=Progress("q", 0, 1, 5 * MIN))
    assert c.ready() == [3 * MIN, 4 * MIN]


def test_a_window_still_waiting_for_partials_is_released_when_they_come_whatever_other_homes_did():
    public = [("a",)]
    c = WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=10 * MIN,
                       public_groups=public, has_sum=True, partials_partitions=2)
    starts = [k * MIN for k in range(40)]
    waiting = next(s for s in starts if c.home(s) == 0)
    other = next(s for s in starts if c.home(s) == 1 and s > waiting)
    c.query_start_ms = waiting  # no earlier window of either home to wait for
    c.add_partial(_partial(0, waiting, [("a",)], [1], [1.0], parts=2), now_ms=0)  # partition 1 has not sent yet
    c.add_partial(_partial(0, other, [("a",)], [1], [1.0], parts=2), now_ms=0)
    c.add_partial(_partial(1, other, [("a",)], [1], [1.0], parts=2), now_ms=0)
    assert other in c.ready() and waiting not in c.ready()
    for start in c.ready():
        c.take(start)
    c.add_partial(_partial(1, waiting, [("a",)], [2], [1.0], parts=2), now_ms=0)
    assert waiting in c.ready()
    assert c.take(waiting).count.tolist() == [3]


def test_a_public_window_before_the_querys_start_is_never_released_data_or_not():
    """Its first window is the query's (a clock's), whatever data comes before it."""
    c = _combiner(public=[("a",)], timeout=10 * MIN, start=10 * MIN)
    assert c.add_partial(_partial(0, 3 * MIN, [("a",)], [2], [1.0], parts=1), now_ms=0, unreleased=True) is False
    assert c.unreleasable(3 * MIN) and not c.is_released(3 * MIN, 4 * MIN)
    c.add_progress(home=0, progress=Progress("q", 0, 1, 12 * MIN))
    assert c.ready() == [10 * MIN, 11 * MIN]


def test_windows_pending_before_the_start_was_known_are_discarded_and_nothing_is_released_until_it_is():
    c = _combiner(public=[("a",)], timeout=1, start=None)
    for start in (2 * MIN, 5 * MIN):
        assert c.add_partial(_partial(0, start, [("a",)], [1], [1.0], parts=1), now_ms=0)
    c.add_progress(home=0, progress=Progress("q", 0, 1, 8 * MIN))
    assert c.ready() == [] and c.discard_unreleasable() == []  # no start known: wait
    c.query_start_ms = 4 * MIN
    assert c.discard_unreleasable() == [(2 * MIN, 1)]
    assert c.ready() == [4 * MIN, 5 * MIN, 6 * MIN, 7 * MIN]


def test_a_home_whose_mark_is_unknown_releases_nothing_then_continues_from_its_mark():
    c = _combiner(public=[("a",)], timeout=1)
    c.unknown_homes.add(0)
    c.add_partial(_partial(0, 3 * MIN, [("a",)], [1], [1.0], parts=1), now_ms=0)
    c.add_partial(_partial(0, 6 * MIN, [("a",)], [1], [1.0], parts=1), now_ms=0)
    c.add_progress(home=0, progress=Progress("q", 0, 1, 8 * MIN))
    assert c.ready() == []  # from the query's start it would draw released windows again
    c.unknown_homes.discard(0)
    c.restore_released_through(0, 5 * MIN)
    assert c.discard_unreleasable() == [(3 * MIN, 1)]
    assert c.ready() == [5 * MIN, 6 * MIN, 7 * MIN]


def test_the_first_window_is_the_one_holding_the_start():
    from stream_dp.worker.release.publication_start import first_window_start

    assert first_window_start(0, MIN, 0) == 0
    assert first_window_start(MIN - 1, MIN, 0) == 0
    assert first_window_start(MIN, MIN, 0) == MIN
    assert first_window_start(25_000, MIN, 30_000) == -30_000  # offset windows: [-30 s, 30 s) holds 25 s
    assert first_window_start(30_000, MIN, 30_000) == 30_000


def _hist(dense):
    dense = np.asarray(dense, dtype=np.int64)
    group, bins = np.nonzero(dense)
    return SparseHistogram.from_cells(dense.shape[0], dense.shape[1], group, bins, dense[group, bins])


def _quantiles(public=None, bins=3):
    return WindowCombiner("q", window_size_ms=MIN, window_offset_ms=0, release_timeout_ms=1_000_000,
                          public_groups=public, has_sum=False, quantile_bins=bins)


def test_histograms_of_a_windows_partials_are_added_up_aligned_with_its_groups():
    c = _quantiles()
    c.add_partial(replace(_partial(0, 0, [("a",), ("b",)], [3, 1], parts=2), histogram=_hist([[1, 2, 0], [0, 0, 1]])),
                  now_ms=0)
    c.add_partial(replace(_partial(1, 0, [("c",), ("a",)], [2, 4], parts=2), histogram=_hist([[2, 0, 0], [0, 1, 3]])),
                  now_ms=0)
    window = c.take(0)
    dense = dict(zip(window.groups, window.histogram.dense().tolist()))
    assert dense == {("a",): [1, 3, 3], ("b",): [0, 0, 1], ("c",): [2, 0, 0]}
    assert window.histogram.totals().tolist() == window.count.tolist()


def test_public_groups_without_data_get_all_zero_rows_and_unknown_groups_are_dropped():
    public = [("a",), ("b",), ("c",)]
    c = _quantiles(public=public)
    c.add_partial(replace(_partial(0, 0, [("zzz",), ("b",)], [5, 2], parts=1), histogram=_hist([[5, 0, 0], [0, 2, 0]])),
                  now_ms=0)
    c.add_progress(home=0, progress=Progress("q", 0, 1, 3 * MIN))
    window = c.take(0)
    assert window.groups == public and window.histogram.dense().tolist() == [[0, 0, 0], [0, 2, 0], [0, 0, 0]]
    empty = c.take(MIN)  # a window nobody had data in
    assert empty.histogram.shape == (3, 3) and len(empty.histogram) == 0


@pytest.mark.parametrize(
    ("histograms", "reason"),
    [((_hist([[1, 0, 0]]), None), "histogram_missing"),
     ((_hist([[1, 0, 0]]), _hist([[1, 0, 0, 0]])), "histogram_bins_differ")],
)
def test_partials_whose_histograms_cannot_be_added_up_are_withheld(histograms, reason):
    c = _quantiles()
    for partition, histogram in enumerate(histograms):
        c.add_partial(replace(_partial(partition, 0, [("a",)], [1], parts=2), histogram=histogram), now_ms=0)
    window = c.take(0)
    assert window.withheld == reason and window.groups == [] and window.histogram.shape == (0, 3)


def test_other_queries_have_no_histogram_and_quantile_bins_are_checked():
    c = _combiner(timeout=1)
    c.add_partial(_partial(0, 0, [("a",)], [2]), now_ms=0)
    assert c.take(0).histogram is None
    with pytest.raises(ValueError, match="pass the query's quantiles.bins"):
        _quantiles(bins=0)


def test_partials_that_cannot_be_added_up_make_a_window_released_as_if_empty(caplog):
    # A partial whose counts do not line up with its groups (a fault no producer can cause, but which
    # must not stop the release stage on every restart): the window goes out without data, flagged.
    c = _combiner(public=[("a",), ("b",)], timeout=1)
    broken = replace(_partial(0, 0, [("a",), ("b",)], [2, 3]), count=np.array([2], dtype=np.int64))
    c.add_partial(broken, now_ms=0)
    window = c.take(0)
    assert window.withheld == "combine_failed"
    assert window.groups == [("a",), ("b",)] and window.count.tolist() == [0, 0] and window.sum.tolist() == [0.0, 0.0]
    assert "its partials cannot be added up; it is released as if empty" in caplog.text


def _with_positions(partial, public):
    """The partial as a worker with ``public`` writes it: each group's position in the list (-1: not in it)."""
    index = {g: i for i, g in enumerate(public)}
    return replace(partial, public_positions=np.array([index.get(g, -1) for g in partial.groups], dtype=np.int64))


def test_public_positions_add_up_to_the_same_window_as_the_keys():
    # The reference is the same window combined by key from partials without positions (earlier versions).
    rng = np.random.default_rng(7)  # synthetic counts only
    public = [(f"/p{i}",) for i in range(500)]
    partials = []
    for partition in range(3):
        rows = np.sort(rng.choice(520, size=300, replace=False))  # a few groups outside the list too
        counts = rng.integers(1, 50, size=len(rows))
        partials.append(_partial(partition, 0, [(f"/p{i}",) for i in rows.tolist()], counts.tolist(),
                                 (counts * 1.5).tolist(), parts=3))
    windows = []
    for with_positions in (False, True):
        c = _combiner(public=public, timeout=1)
        for partial in partials:
            c.add_partial(_with_positions(partial, public) if with_positions else partial, now_ms=0)
        windows.append(c.take(0))
    by_key, by_position = windows
    assert by_position.withheld is None and by_position.groups == public
    assert by_position.count.tolist() == by_key.count.tolist() and by_position.count.sum() > 0
    assert by_position.sum.tolist() == by_key.sum.tolist()
    assert by_position.distinct_units.tolist() == by_key.distinct_units.tolist()


@pytest.mark.parametrize("doctor", ["shifted", "twice", "outside"])
def test_public_positions_that_do_not_name_their_groups_make_the_window_released_as_if_empty(doctor):
    public = [(f"/p{i}",) for i in range(100)]
    partial = _with_positions(_partial(0, 0, [(f"/p{i}",) for i in range(0, 100, 2)], [3] * 50, parts=1), public)
    positions = partial.public_positions.copy()
    if doctor == "shifted":
        positions = (positions + 1) % 100  # in range, each once, but the groups of other rows
    elif doctor == "twice":
        positions[1] = positions[0]
    else:
        positions[-1] = 100
    c = _combiner(public=public, timeout=1)
    c.add_partial(replace(partial, public_positions=positions), now_ms=0)
    window = c.take(0)
    assert window.withheld == "combine_failed" and window.count.sum() == 0
