from __future__ import annotations

import numpy as np
import pytest

from stream_dp.windows import EventSchema, RawBatch, RejectReason

from ._support import NOW_MS, Stream, batch_of, event, make_engine

MIN = 60_000
W0 = NOW_MS - 5 * MIN  # start of a window well in the past of the wall clock


def test_raw_batch_checks_lengths():
    with pytest.raises(ValueError, match="equally long"):
        RawBatch([b"{}"], np.array([0, 1]), np.array([0]), np.array([0]))


def test_unassigned_partition_is_a_usage_error_that_changes_nothing():
    engine, _ = make_engine(partitions=[0])
    with pytest.raises(ValueError, match=r"assign\(\[3\]\)"):
        engine.process(RawBatch([event("a", W0)], np.array([3]), np.array([0]), np.array([W0])))
    assert engine.open_windows == [] and engine.committable_offsets() == {}


def test_assigning_twice_is_refused():
    engine, _ = make_engine(partitions=[0])
    with pytest.raises(ValueError, match="revoke them"):
        engine.assign([0])


def test_window_closes_when_watermark_passes_its_end():
    engine, _ = make_engine(lateness_ms=10_000)
    r = engine.process(batch_of([event("a", W0 + 1_000), event("b", W0 + MIN + 9_999)]))
    assert r.partials == [] and engine.open_windows == [(W0, W0 + MIN), (W0 + MIN, W0 + 2 * MIN)]
    r = engine.process(batch_of([event("c", W0 + MIN + 10_000)], first_offset=2))  # watermark reaches W0 + MIN
    assert [(p.window_start_ms, p.window_end_ms) for p in r.partials] == [(W0, W0 + MIN)]
    assert r.partials[0].units == ["a"] and r.partials[0].first_offset == 0 and r.partials[0].last_offset == 0
    assert engine.closed_through_ms == {0: W0 + MIN}
    assert engine.watermark_ms == W0 + MIN


def test_late_event_is_rejected_and_never_changes_a_released_window():
    engine, _ = make_engine(lateness_ms=0)
    first = engine.process(batch_of([event("a", W0), event("b", W0 + MIN)]))
    assert len(first.partials) == 1
    late_value = event("z", W0 + 5)
    r = engine.process(batch_of([late_value, event("c", W0 + MIN + 1)], first_offset=2))
    assert r.late == 1 and r.accepted == 1 and r.balanced
    (rejection,) = r.rejections
    assert rejection.reason is RejectReason.LATE and rejection.offset == 2 and rejection.value == late_value
    assert engine.open_windows == [(W0 + MIN, W0 + 2 * MIN)]


def test_events_within_allowed_lateness_still_count():
    engine, _ = make_engine(lateness_ms=30_000)
    engine.process(batch_of([event("a", W0 + MIN + 20_000)]))  # watermark W0 + 50 s: window W0 still open
    r = engine.process(batch_of([event("b", W0 + 59_999)], first_offset=1))
    assert r.accepted == 1 and r.partials == []
    r = engine.process(batch_of([event("c", W0 + 2 * MIN)], first_offset=2))  # watermark W0 + 90 s
    (closed,) = r.partials
    assert closed.window_start_ms == W0 and closed.units == ["b"]


def test_idle_partition_stops_holding_windows_and_all_idle_follows_the_clock():
    engine, clock = make_engine(partitions=[0, 1], idle_ms=30_000, lateness_ms=0)
    stream = Stream()
    stream.add(event("a", W0 + 1), partition=0)
    stream.add(event("b", W0 + 2), partition=1)
    engine.process(stream.batch())
    clock.now_ms += 20_000
    stream.add(event("c", W0 + 3 * MIN), partition=0)
    r = engine.process(stream.batch(2))
    assert r.partials == []  # partition 1 is silent but not idle yet: it holds window W0
    clock.now_ms += 9_999
    assert engine.tick() == []
    clock.now_ms += 1
    closed = engine.tick()  # partition 1 idle now: partition 0 alone sets the watermark
    assert {(p.window_start_ms, p.partition) for p in closed} == {(W0, 0), (W0, 1)}
    assert engine.open_windows == [(W0 + 3 * MIN, W0 + 4 * MIN)]
    clock.now_ms += 20_000  # both idle: the wall clock closes what it has passed
    closed = engine.tick()
    assert [p.window_start_ms for p in closed] == [W0 + 3 * MIN]
    assert engine.watermark_ms == clock.now_ms


def test_closed_through_never_goes_back():
    engine, clock = make_engine(idle_ms=1_000, lateness_ms=0)
    engine.process(batch_of([event("a", NOW_MS - MIN)]))
    clock.now_ms += 5_000
    engine.tick()  # idle: the wall clock moves the watermark to NOW + 5 s
    assert engine.closed_through_ms == {0: NOW_MS}
    r = engine.process(batch_of([event("b", NOW_MS - 30_000)], first_offset=1))
    assert engine.watermark_ms == NOW_MS - 30_000  # from events again, lower than the wall clock's
    assert engine.closed_through_ms == {0: NOW_MS} and r.late == 1


def test_a_lagging_partition_assigned_later_keeps_its_windows():
    engine, _ = make_engine(partitions=[0], lateness_ms=0)
    first = engine.process(batch_of([event("a", W0 + 1), event("a2", W0 + MIN + 7), event("b", W0 + 3 * MIN)]))
    assert [(p.window_start_ms, p.partition) for p in first.partials] == [(W0, 0), (W0 + MIN, 0)]
    assert engine.closed_through_ms == {0: W0 + 3 * MIN}
    # partition 1 comes from a worker that had closed it only through W0
    engine.assign([1], closed_through_ms={1: W0})
    stream = Stream()
    stream.add(event("c", W0 + MIN + 1), partition=1)
    stream.add(event("d", W0 + MIN + 2), partition=1)
    r = engine.process(stream.batch(0, 1))
    assert r.accepted == 1 and r.late == 0 and r.partials == []  # partition 1 holds the engine back now
    assert engine.watermark_ms == W0 + MIN + 1
    r = engine.process(stream.batch(1, 2))
    assert r.accepted == 1 and r.partials == []
    stream.add(event("e", W0 + 3 * MIN + 5), partition=1)
    r = engine.process(stream.batch(2))
    assert [(p.window_start_ms, p.partition, sorted(p.units)) for p in r.partials] == [(W0 + MIN, 1, ["c", "d"])]
    assert engine.closed_through_ms == {0: W0 + 3 * MIN, 1: W0 + 3 * MIN}
    late = engine.process(RawBatch([event("f", W0 + 2 * MIN)], np.array([0]), np.array([9]), np.array([W0 + 2 * MIN])))
    assert late.late == 1  # partition 0's part of that window had closed long before
    assert engine.open_windows == [(W0 + 3 * MIN, W0 + 4 * MIN)]


def test_committable_offsets_follow_the_oldest_open_window():
    engine, _ = make_engine(partitions=[0, 1], lateness_ms=0)
    stream = Stream()
    stream.add(event("a", W0 + 10), partition=0)  # p0 offset 0, window W0
    stream.add(b"garbage", partition=0)  # p0 offset 1
    stream.add(event("b", W0 + MIN), partition=0)  # p0 offset 2, window W0 + 1
    stream.add(event("c", W0 + MIN + 5), partition=1)  # p1 offset 0, window W0 + 1
    r = engine.process(stream.batch())
    assert {p.window_start_ms for p in r.partials} == {W0}
    assert engine.committable_offsets() == {0: 2, 1: 0}
    stream.add(event("d", W0 + 3 * MIN), partition=0)
    stream.add(event("e", W0 + 3 * MIN), partition=1)
    engine.process(stream.batch(4))
    assert engine.committable_offsets() == {0: 3, 1: 1}
    assert engine.closed_through_ms == {0: W0 + 3 * MIN, 1: W0 + 3 * MIN}


def test_committable_offset_after_only_rejections_is_the_next_one():
    engine, _ = make_engine(partitions=[0, 1])
    engine.process(batch_of([b"x", None, b"{}"], first_offset=40))
    assert engine.committable_offsets() == {0: 43}


def test_restore_skips_replayed_events_without_calling_them_late():
    engine, _ = make_engine(partitions=[])
    engine.assign([0], closed_through_ms={0: W0 + MIN})
    r = engine.process(batch_of([event("a", W0 + 5), event("b", W0 + MIN + 5), event("c", W0 - 1)]))
    assert (r.replayed, r.accepted, r.late, r.rejections) == (2, 1, 0, [])
    assert engine.open_windows == [(W0 + MIN, W0 + 2 * MIN)]
    assert engine.closed_through_ms == {0: W0 + MIN}
    assert engine.committable_offsets() == {0: 1}


def test_restore_tells_replays_from_new_late_events_by_offset():
    engine, _ = make_engine(partitions=[])
    # The earlier owner processed offsets 0..1; offset 2 is new to everybody.
    engine.assign([0], closed_through_ms={0: W0 + MIN}, replay_until_offset={0: 2})
    r = engine.process(batch_of([event("a", W0 + 5), event("b", W0 + 6), event("c", W0 + 7)]))
    assert (r.replayed, r.late, r.accepted) == (2, 1, 0)
    assert [(x.offset, x.reason.value) for x in r.rejections] == [(2, "late")]
    assert engine.next_offsets == {0: 3}


def test_restore_is_per_partition():
    engine, _ = make_engine(partitions=[])
    engine.assign([0, 1], closed_through_ms={0: W0 + MIN})
    stream = Stream()
    stream.add(event("a", W0 + 5), partition=0)
    stream.add(event("b", W0 + 5), partition=1)
    r = engine.process(stream.batch())
    assert r.replayed == 1 and r.accepted == 1
    assert engine.committable_offsets() == {0: 1, 1: 0}


def test_revoke_drops_the_partition_from_open_windows():
    engine, clock = make_engine(partitions=[0, 1], lateness_ms=0, max_groups=1)
    stream = Stream()
    stream.add(event("a", W0 + 1, "/x", 2.0), partition=0)
    stream.add(event("b", W0 + 2, "/y", 3.0), partition=1)
    engine.process(stream.batch())
    engine.revoke([1, 7])
    assert engine.partitions == [0]
    assert 1 not in engine.committable_offsets()
    clock.now_ms += 60_000
    (partial,) = engine.tick()
    assert partial.partition == 0 and partial.units == ["a"]
    engine.revoke([0])
    assert engine.open_windows == []


def test_partial_columns_and_aggregates():
    engine, clock = make_engine(max_groups=2, max_events=2, clip=(0.0, 10.0))
    events = [
        event("u1", W0 + 1, "/a", 4.0),
        event("u1", W0 + 2, "/a", 50.0),  # clipped to 10
        event("u2", W0 + 3, "/a", -3.0),  # clipped to 0
        event("u2", W0 + 4, "/b", 1.0),
        event(3, W0 + 5, 7, 2.0),  # integer unit and group
    ]
    engine.process(batch_of(events))
    clock.now_ms += 10 * MIN
    (p,) = engine.tick()
    assert sorted(p.units) == ["3", "u1", "u2"]
    assert sorted(p.groups, key=repr) == [("/a",), ("/b",), (7,)]
    assert p.pair_unit.dtype == np.int32 and p.pair_group.dtype == np.int32
    assert p.pair_count.dtype == np.int64 and p.pair_sum.dtype == np.float64
    assert p.accepted_events == 5 and int(p.pair_count.sum()) == 5
    totals = p.aggregate()
    by_group = {
        g: (int(c), float(s), int(d))
        for g, c, s, d in zip(totals.groups, totals.count, totals.sum, totals.distinct_units)
    }
    assert by_group == {("/a",): (3, 14.0, 2), ("/b",): (1, 1.0, 1), (7,): (1, 2.0, 1)}
    without_u1 = p.aggregate(p.unit_mask(["u1", "nobody"]))
    by_group = {
        g: (int(c), float(s), int(d))
        for g, c, s, d in zip(without_u1.groups, without_u1.count, without_u1.sum, without_u1.distinct_units)
    }
    assert by_group == {("/a",): (1, 0.0, 1), ("/b",): (1, 1.0, 1), (7,): (1, 2.0, 1)}
    per_unit = p.unit_totals()
    contributions = {
        u: (int(g), int(c), float(s))
        for u, g, c, s in zip(per_unit.units, per_unit.groups, per_unit.count, per_unit.sum)
    }
    assert contributions == {"u1": (1, 2, 14.0), "u2": (2, 2, 1.0), "3": (1, 1, 2.0)}


def test_a_group_only_excluded_units_touched_is_left_out():
    """Its key came from excluded units alone: it must not reach partition selection."""
    engine, clock = make_engine()
    engine.process(batch_of([event("exhausted", W0, "/private-key"), event("ok", W0 + 1, "/a"),
                             event("exhausted", W0 + 2, "/a")]))
    clock.now_ms += 10 * MIN
    (p,) = engine.tick()
    totals = p.aggregate(p.unit_mask(["exhausted"]))
    assert totals.groups == [("/a",)]
    assert totals.count.tolist() == [1] and totals.distinct_units.tolist() == [1]
    assert len(p.aggregate(p.unit_mask(["exhausted", "ok"])).groups) == 0


def test_aggregate_checks_the_mask():
    engine, clock = make_engine()
    engine.process(batch_of([event("a", W0)]))
    clock.now_ms += 10 * MIN
    (p,) = engine.tick()
    with pytest.raises(ValueError, match="unit_mask"):
        p.aggregate(np.array([1, 0]))


def test_count_only_query_has_zero_sums():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",))
    engine, clock = make_engine(schema=schema)
    engine.process(batch_of([event("a", W0, value=None), event("b", W0, value=None)]))
    clock.now_ms += 10 * MIN
    (p,) = engine.tick()
    assert p.aggregate().count.tolist() == [2] and p.aggregate().sum.tolist() == [0.0]


def test_ungrouped_query_has_one_empty_group():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", value_field="value")
    engine, clock = make_engine(schema=schema)
    engine.process(batch_of([event("a", W0, "/x"), event("b", W0, "/y")]))
    clock.now_ms += 10 * MIN
    (p,) = engine.tick()
    assert p.groups == [()] and p.aggregate().count.tolist() == [2]


def test_redelivered_message_counts_once():
    engine, clock = make_engine()
    engine.process(batch_of([event("a", W0, "/x", 5.0)]))
    engine.process(batch_of([event("a", W0, "/x", 5.0)]))  # same partition and offset
    clock.now_ms += 10 * MIN
    (p,) = engine.tick()
    assert p.pair_count.tolist() == [1] and p.pair_sum.tolist() == [5.0]


def test_a_unit_across_partitions_is_still_bounded_as_one():
    engine, clock = make_engine(partitions=[0, 1], max_groups=1, max_events=1)
    stream = Stream()
    for i in range(6):
        stream.add(event("same-unit", W0 + i, f"/g{i % 3}", 1.0), partition=i % 2)
    engine.process(stream.batch())
    clock.now_ms += 10 * MIN
    partials = engine.tick()
    assert sum(int(p.pair_count.sum()) for p in partials) == 1
    assert len(partials) == 2  # both partitions had events; one of them kept none
    assert sum(p.accepted_events for p in partials) == 6


def test_compaction_keeps_state_bounded_and_results_unchanged():
    values = [event(f"u{i % 50}", W0 + i, f"/g{i % 7}", float(i)) for i in range(3_000)]
    small, clock_small = make_engine(max_groups=2, max_events=1, compact_min_rows=64)
    large, clock_large = make_engine(max_groups=2, max_events=1)
    for start in range(0, 3_000, 100):
        small.process(batch_of(values[start : start + 100], first_offset=start))
        large.process(batch_of(values[start : start + 100], first_offset=start))
    assert small.open_rows < 300 < large.open_rows
    assert small.open_pairs == large.open_pairs == 100
    clock_small.now_ms += 10 * MIN
    clock_large.now_ms += 10 * MIN
    assert small.tick() == large.tick()


def test_state_size_is_reported():
    engine, _ = make_engine()
    engine.process(batch_of([event(f"user-{i}", W0, "/x") for i in range(100)]))
    held = engine.state_nbytes()
    assert held["rows"] == 100 * 36
    assert held["unit_ids"] > 0 and held["group_table"] > 0
