"""The record clock rule (``record_clock``) against a reference written record by record from its
documented semantics, and the attacks it is there for, through the window engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.windows import EventSchema, RawBatch
from stream_dp.windows.record_clock import NO_CLOCK, ClockRule, clocks_by_slot, records_clock, top_stamps

from ._support import NOW_MS, event, make_engine

MIN = 60_000
HOUR = 3_600_000


def reference_clocks(batches, rule: ClockRule, n_slots: int) -> list[list[int | None]]:
    """Each slot's clock after each batch, record by record: a broker's stamp counts as it is; a producer's
    only when trusted, and then the clock is the quorum-th largest trusted stamp read so far; stamps <= 0
    count for nothing; every stamp counts as at most the wall clock when it was read, and a clock never goes
    back."""
    clock: list[int | None] = [None] * n_slots
    trusted: list[list[int]] = [[] for _ in range(n_slots)]
    out = []
    for now, records in batches:
        for slot, stamp, by_producer in records:
            if stamp <= 0 or (by_producer and not rule.trust_producer_timestamps):
                continue
            stamp = min(stamp, now)
            if by_producer:
                trusted[slot].append(stamp)
                if len(trusted[slot]) < rule.quorum:
                    continue
                stamp = sorted(trusted[slot])[-rule.quorum]
            clock[slot] = stamp if clock[slot] is None else max(clock[slot], stamp)
        out.append(list(clock))
    return out


def engine_clocks(batches, rule: ClockRule, n_slots: int) -> list[list[int | None]]:
    clock: list[int | None] = [None] * n_slots
    kept = [np.zeros(0, np.int64) for _ in range(n_slots)]
    out = []
    for now, records in batches:
        if records:
            slots, stamps, by_producer = (np.array(column) for column in zip(*records))
            clocks, kept = clocks_by_slot(slots.astype(np.int64), n_slots, stamps.astype(np.int64),
                                          by_producer.astype(bool), rule, now, kept)
            for slot, value in enumerate(clocks.tolist()):
                if value != NO_CLOCK:
                    clock[slot] = value if clock[slot] is None else max(clock[slot], value)
        out.append(list(clock))
    return out


STAMPS = st.one_of(st.integers(-2, 0), st.integers(NOW_MS - 10 * MIN, NOW_MS + HOUR))
RECORDS = st.lists(st.tuples(st.integers(0, 2), STAMPS, st.booleans()), max_size=40)
BATCHES = st.lists(st.tuples(st.integers(NOW_MS - MIN, NOW_MS + MIN), RECORDS), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(batches=BATCHES, trusted=st.booleans(), quorum=st.integers(1, 5))
def test_batches_move_each_partitions_clock_as_the_record_by_record_reference(batches, trusted, quorum):
    rule = ClockRule(trust_producer_timestamps=trusted, quorum=quorum)
    assert engine_clocks(batches, rule, 3) == reference_clocks(batches, rule, 3)


@settings(max_examples=200, deadline=None)
@given(records=RECORDS, quorum=st.integers(1, 5), split=st.integers(0, 40))
def test_one_partitions_records_carry_the_same_clock_read_at_once_or_in_two_parts(records, quorum, split):
    rule = ClockRule(trust_producer_timestamps=True, quorum=quorum)
    stamps = np.array([r[1] for r in records], dtype=np.int64)
    by_producer = np.array([r[2] for r in records], dtype=bool)
    whole, kept_whole = records_clock(stamps, by_producer, rule, NOW_MS)
    first, kept = records_clock(stamps[:split], by_producer[:split], rule, NOW_MS)
    second, kept = records_clock(stamps[split:], by_producer[split:], rule, NOW_MS, kept)
    assert whole == max((c for c in (first, second) if c is not None), default=None)
    assert kept.tolist() == kept_whole.tolist()
    expected = reference_clocks([(NOW_MS, [(0, int(s), bool(p)) for s, p in zip(stamps, by_producer)])], rule, 1)
    assert whole == expected[0][0]


def test_top_stamps_keeps_the_largest_in_order():
    assert top_stamps(np.array([5, 9]), np.array([1, 7, 3, 11]), 3).tolist() == [7, 9, 11]
    assert top_stamps(np.zeros(0, np.int64), np.array([4, 2]), 3).tolist() == [2, 4]


def test_a_quorum_is_a_positive_integer():
    with pytest.raises(ValueError, match="quorum"):
        ClockRule(quorum=0)


# -- through the engine -----------------------------------------------------------------------------------

SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value",
                     max_future_skew_ms=5 * MIN)


def _backlog_with(target_stamps: list[int], *, trusted: bool = True, windows: int = 6, per_window: int = 200,
                  batch: int = 500) -> tuple[int, int]:
    """A backlog two hours old stamped by its producers with its event times, the target's records (stamped
    ``target_stamps``) after the first window's events, read ``batch`` records at a time; (accepted, late)."""
    engine, clock = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9)
    engine.clock_rule = ClockRule(trust_producer_timestamps=trusted)
    start = (NOW_MS - 2 * HOUR) // MIN * MIN
    values, stamps = [], []
    for w in range(windows):
        for i in range(per_window):
            t = start + w * MIN + i * (MIN - 1_000) // per_window
            values.append(event(f"u{i}", t))
            stamps.append(t)
        if w == 0:
            for k, stamp in enumerate(target_stamps):
                values.append(event("target", start + MIN - 500 + k))
                stamps.append(stamp)
    accepted = late = 0
    for a in range(0, len(values), batch):
        n = len(values[a:a + batch])
        result = engine.process(RawBatch(values[a:a + batch], np.zeros(n, np.int32), np.arange(a, a + n),
                                         np.array(stamps[a:a + batch]), producer_stamped=np.ones(n, bool)))
        accepted += result.accepted
        late += result.late
    return accepted, late


@pytest.mark.parametrize("stamp", [0, -1, NOW_MS, NOW_MS + HOUR - 1], ids=["zero", "none", "now", "an-hour-ahead"])
def test_one_producer_stamp_moves_no_clock_in_a_trusted_backlog(stamp):
    assert _backlog_with([]) == (1_200, 0)
    assert _backlog_with([stamp]) == (1_201, 0)


def test_fewer_records_than_the_quorum_move_nothing_and_a_quorum_does():
    quorum = ClockRule().quorum
    assert _backlog_with([NOW_MS] * (quorum - 1)) == (1_200 + quorum - 1, 0)
    accepted, late = _backlog_with([NOW_MS] * quorum)
    assert late > 0  # the rule's limit, stated in docs/privacy/clock.md: a quorum of trusted stamps is the clock


def test_producer_stamps_carry_no_clock_unless_trusted():
    """On a topic whose records the broker stamps, a record some producer stamped (one written before the topic
    was switched to LogAppendTime) moves nothing, whatever its stamp."""
    assert _backlog_with([NOW_MS] * 100, trusted=False) == (1_300, 0)
    engine, _ = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9)
    t = NOW_MS - 30 * MIN
    result = engine.process(RawBatch([event("a", t)], np.array([0]), np.array([0]), np.array([t]),
                                     producer_stamped=np.array([True])))
    assert result.accepted == 1 and engine.record_clock_ms == {} and engine.watermark_ms is None


def test_broker_stamps_move_the_clock_beside_untrusted_producer_stamps():
    engine, _ = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9)
    t = NOW_MS - 30 * MIN
    engine.process(RawBatch([event("a", t), event("b", t)], np.array([0, 0]), np.array([0, 1]),
                            np.array([t, NOW_MS]), producer_stamped=np.array([False, True])))
    assert engine.record_clock_ms == {0: t}
