"""Which clock closes windows: Kafka record timestamps (capped at the wall clock), never event contents.

The attack these tests keep closed: one unit sends an event dated minutes
ahead; if event times drove the watermark, every other unit's on-time events
would then be late and dropped, so which events a release counts would
depend on one unit's data.
"""

from __future__ import annotations

import numpy as np

from stream_dp.windows import EventSchema, RawBatch, RejectReason
from stream_dp.windows.batch import NO_TIMESTAMP

from ._support import NOW_MS, Stream, by_key, event, make_engine

MIN = 60_000
SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value",
                     max_future_skew_ms=5 * MIN)


def engine_1min(*, idle_ms: int = 30_000):
    return make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=idle_ms)


def test_a_future_dated_event_makes_no_other_units_event_late():
    engine, clock = engine_1min()
    # Records of a backlog, two hours old: a wall-clock cap alone would not save these events.
    now = clock.now_ms - 2 * 3_600_000 - 20_000
    stream = Stream()
    stream.add(event("attacker", now + 4 * MIN), timestamp_ms=now)  # inside max_future_skew of its record time
    first = engine.process(stream.batch())  # the attacker's record is read first, in a batch of its own
    for i in range(40):
        stream.add(event(f"u{i}", now + i), timestamp_ms=now + i)
    result = engine.process(stream.batch(1))
    assert first.accepted == 1
    assert result.rejected == {}
    assert result.accepted == 40
    clock.now_ms += 10 * MIN  # everything goes idle and closes by the wall clock
    partials = by_key(engine.tick())
    window = (now // MIN) * MIN
    assert sorted(partials[(window, 0)].units) == sorted(f"u{i}" for i in range(40))
    assert partials[(window + 4 * MIN, 0)].units == ["attacker"]  # in its own window, which it cannot move


def test_one_event_order_does_not_matter_for_who_is_late():
    """The same records, the future-dated one first or last: the same partials."""
    now = NOW_MS - 2 * 3_600_000 - 20_000
    records = [(event("attacker", now + 4 * MIN), now)] + [(event(f"u{i}", now + i), now + i) for i in range(10)]
    outcomes = []
    for order in (records, records[::-1]):
        engine, clock = engine_1min()
        stream = Stream()
        for value, stamp in order:
            stream.add(value, timestamp_ms=stamp)
        results = [engine.process(stream.batch(i, i + 1)) for i in range(len(order))]  # one record per batch
        accepted, late = sum(r.accepted for r in results), sum(r.late for r in results)
        clock.now_ms += 10 * MIN
        outcomes.append((accepted, late, {k: sorted(p.units) for k, p in by_key(engine.tick()).items()}))
    assert outcomes[0][:2] == (11, 0)
    assert outcomes[0] == outcomes[1]


def test_an_event_further_ahead_than_the_skew_of_its_record_time_is_rejected_even_in_the_past():
    engine, _ = engine_1min()
    sent = NOW_MS - 2 * 3_600_000  # a backlog record two hours old
    stream = Stream()
    stream.add(event("a", sent + 5 * MIN + 1), timestamp_ms=sent)  # behind the wall clock, ahead of its record
    stream.add(event("b", sent + 5 * MIN), timestamp_ms=sent)  # exactly at the limit: kept
    result = engine.process(stream.batch())
    assert result.rejected == {RejectReason.AHEAD_OF_RECORD: 1}
    assert "record timestamp" in result.rejections[0].detail
    assert result.accepted == 1


def test_a_two_hour_backlog_closes_window_by_window_with_nothing_late():
    engine, clock = engine_1min()
    start = (NOW_MS - 2 * 3_600_000) // MIN * MIN
    stream = Stream()
    for second in range(0, 2 * 3_600, 7):  # an event every 7 s for two hours, records stamped when produced
        t = start + second * 1000
        stream.add(event(f"u{second % 13}", t), timestamp_ms=t)
    closed: list[int] = []
    late = accepted = 0
    for a in range(0, len(stream.values), 100):
        result = engine.process(stream.batch(a, a + 100))
        late += result.late
        accepted += result.accepted
        closed += [p.window_start_ms for p in result.partials]
    assert late == 0 and accepted == len(stream.values)
    assert closed == sorted(closed) and len(closed) >= 115  # the backlog's own timestamps closed its windows
    clock.now_ms += MIN  # the partition goes idle: the wall clock closes the rest
    closed += [p.window_start_ms for p in engine.tick()]
    assert closed == list(range(start, start + 120 * MIN, MIN))


def test_invalid_records_advance_the_clock_too():
    """A record's timestamp is not its contents: garbage keeps its partition's time moving."""
    engine, clock = engine_1min(idle_ms=10**9)
    t0 = NOW_MS - 10 * MIN
    stream = Stream()
    stream.add(event("a", t0), timestamp_ms=t0)
    stream.add(b"not json", timestamp_ms=t0 + 3 * MIN)
    result = engine.process(stream.batch())
    assert result.rejected == {RejectReason.INVALID_JSON: 1}
    assert [p.window_start_ms for p in result.partials] == [t0 // MIN * MIN]


def test_record_timestamps_ahead_of_the_wall_clock_close_nothing_early():
    engine, clock = engine_1min(idle_ms=10**9)
    stream = Stream()
    stream.add(event("a", clock.now_ms - 1_000), timestamp_ms=clock.now_ms + 3_600_000)  # a producer clock an hour fast
    result = engine.process(stream.batch())
    assert result.accepted == 1 and result.partials == []
    assert engine.watermark_ms == clock.now_ms - 5_000


def test_records_stamped_zero_or_not_at_all_carry_no_clock():
    """Read as "now", one such record in a backlog would close every window up to the wall clock."""
    engine, clock = engine_1min(idle_ms=10**9)
    value = event("a", clock.now_ms - 2 * MIN)
    for offset, stamp in enumerate((NO_TIMESTAMP, 0)):
        result = engine.process(RawBatch([value], np.array([0]), np.array([offset]), np.array([stamp])))
        assert result.accepted == 1 and result.partials == []
        assert engine.watermark_ms is None and engine.record_clock_ms == {}


def _backlog_on_two_partitions(hold_open: bool) -> tuple[int, int]:
    """Partition 1 races through a backlog while partition 0, with records waiting, delivers nothing for a while.

    Returns (accepted, late) of partition 0's events once it delivers again.
    """
    engine, clock = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=2_000, partitions=(0, 1))
    start = (NOW_MS - 3_600_000) // MIN * MIN
    stream = Stream()
    for p in (0, 1):
        stream.add(event(f"first-{p}", start + 1_000), partition=p, timestamp_ms=start + 1_000)
    engine.process(stream.batch())
    # Partition 1 delivers 30 minutes of backlog over 10 s of wall clock; partition 0 is slow to fetch.
    for k in range(10):
        clock.now_ms += 1_000
        if hold_open:
            engine.hold_open([0])  # what the worker does when the consumer lags behind partition 0's end
        first = len(stream.values)
        for m in range(3):
            t = start + (3 * k + m + 1) * MIN
            stream.add(event(f"b{k}-{m}", t), partition=1, timestamp_ms=t)
        engine.process(stream.batch(first))
        engine.tick()
    first = len(stream.values)
    for i in range(10):  # partition 0's waiting records finally arrive: on time for their windows
        stream.add(event(f"a{i}", start + 2_000 + i), partition=0, timestamp_ms=start + 2_000 + i)
    result = engine.process(stream.batch(first))
    return result.accepted, result.late


def test_a_slow_partition_with_records_waiting_is_not_idle():
    assert _backlog_on_two_partitions(hold_open=True) == (10, 0)
    # Without hold_open the slow partition looks idle, the fast one's clock closes its windows: all late.
    assert _backlog_on_two_partitions(hold_open=False) == (0, 10)


def _replay_in_two_batches(read_from: int | None = None) -> tuple[int, int, list[int]]:
    """Partition 0 is reassigned: its earlier owner had read offsets 0..4 (all in window W) and a
    record three minutes later, closed W on its clock but held W's partial (its budget charge had
    not gone through), so it committed offset 2 with W still open. The new owner replays 2..5 in
    two batches: offsets 2, 3, then 4 and the later record 5.

    Returns (closure after the first replay batch, late events over the replay, counts of
    partition 0's partials of W).
    """
    engine, _ = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9, partitions=())
    w = (NOW_MS - 30 * MIN) // MIN * MIN
    engine.assign([0], closed_through_ms={0: w}, replay_until_offset={0: 6}, record_clock_ms={0: w + 3 * MIN})
    if read_from is not None:
        engine.note_read_position(0, read_from)
    stream = Stream()
    for i in range(5):
        stream.add(event(f"u{i}", w + 1_000 + i), partition=0, timestamp_ms=w + 1_000 + i)
    stream.add(event("later", w + 3 * MIN), partition=0, timestamp_ms=w + 3 * MIN)
    first = engine.process(stream.batch(2, 4))
    closure = engine.closed_through_ms[0]
    second = engine.process(stream.batch(4, 6))
    partials = first.partials + second.partials
    counts = [int(p.aggregate().count.sum()) for p in partials if p.window_start_ms == w]
    return closure, first.late + second.late, counts


def test_a_replaying_partition_keeps_its_restored_closure_until_it_has_caught_up():
    w = (NOW_MS - 30 * MIN) // MIN * MIN
    closure, late, counts = _replay_in_two_batches()
    # The restored record clock is minutes past W, but offsets 2..5 are still to be read again:
    # W stays open, and the replay rebuilds it whole, as the first run had it.
    assert closure == w
    assert late == 0 and counts == [3]


def test_reading_from_past_the_processed_offset_is_caught_up_at_once():
    w = (NOW_MS - 30 * MIN) // MIN * MIN
    closure, _, _ = _replay_in_two_batches(read_from=6)  # nothing left to replay: the clock may close W
    assert closure > w


def _late_offsets(results) -> set[int]:
    return {r.offset for res in results for r in res.rejections if r.reason is RejectReason.LATE}


def test_a_replay_meets_every_offset_with_the_closure_the_first_run_met_it_with():
    """The first owner closes W after offset 5 (a record minutes later), but W's partial is held (its
    budget charge has not gone through), so it commits with W still open -- and then reads offsets 6, 7:
    events of W, late for it. A replay that rebuilds W must leave 6 and 7 out of W again, and call them
    late, however its batches fall."""
    w = (NOW_MS - 30 * MIN) // MIN * MIN
    stream = Stream()
    for i in range(5):
        stream.add(event(f"u{i}", w + 1_000 + i), timestamp_ms=w + 1_000 + i)  # offsets 0..4: in W
    stream.add(event("later", w + 3 * MIN), timestamp_ms=w + 3 * MIN)  # 5: closes W
    stream.add(event("tardy", w + 2_000), timestamp_ms=w + 3 * MIN + 1)  # 6: late for W
    stream.add(event("tardy2", w + 3_000), timestamp_ms=w + 3 * MIN + 2)  # 7: late for W
    for i in range(2):
        stream.add(event(f"v{i}", w + 3 * MIN + 10), timestamp_ms=w + 3 * MIN + 10)  # 8, 9

    first, _ = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9)
    results = [first.process(stream.batch(0, 6)), first.process(stream.batch(6, 10))]
    (held,) = [p for r in results for p in r.partials if p.window_start_ms == w]
    assert _late_offsets(results) == {6, 7} and int(held.aggregate().count.sum()) == 5
    # What the worker commits while W is held: W is not durably closed, so the commit offset stays
    # at W's first offset and the committed closure below W (see worker/ingest/commit_plan.committable_offsets).
    steps = {0: [s for s in first.closure_steps[0] if s[1] > w]}
    assert steps[0], "the first run's raise of the closure past W must be kept for a next owner"

    for cuts in ([0, 10], [0, 3, 8, 10], [0, 6, 10], [0, 7, 10], list(range(11))):
        replay, _ = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9, partitions=())
        replay.assign([0], closed_through_ms={0: w}, replay_until_offset={0: 10},
                      record_clock_ms=first.record_clock_ms, closure_steps=steps)
        replay.note_read_position(0, 0)
        again = [replay.process(stream.batch(a, b)) for a, b in zip(cuts, cuts[1:])]
        rebuilt = [p for r in again for p in r.partials if p.window_start_ms == w]
        assert _late_offsets(again) == {6, 7}, cuts
        assert [int(p.aggregate().count.sum()) for p in rebuilt] == [5], cuts
