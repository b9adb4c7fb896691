"""The record clock rule (``record_clock``) against a reference written record by record from its
documented semantics, and the attacks it is there for, through the window engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.windows import EventSchema, RawBatch
from stream_dp.windows.record_clock import NO_CLOCK, ClockRule, UnitStamps, clocks_by_slot, records_clock

from ._support import NOW_MS, event, make_engine

MIN = 60_000
HOUR = 3_600_000


def reference_clocks(batches, rule: ClockRule, n_slots: int) -> list[list[int | None]]:
    """Each slot's clock after each batch, record by record: a broker's stamp counts as it is; a producer's
    only when trusted and keyed, and then the clock is, over the distinct keys read on the slot so far, the
    quorum-th largest of each key's newest stamp; stamps <= 0 count for nothing; every stamp counts as at most
    the wall clock when it was read, and a clock never goes back. Every key's stamp is kept (no bound)."""
    clock: list[int | None] = [None] * n_slots
    newest: list[dict[bytes, int]] = [{} for _ in range(n_slots)]
    out = []
    for now, records in batches:
        for slot, stamp, by_producer, key in records:
            if stamp <= 0 or (by_producer and not rule.trust_producer_timestamps):
                continue
            stamp = min(stamp, now)
            if by_producer:
                if key is None:
                    continue
                newest[slot][key] = max(stamp, newest[slot].get(key, stamp))
                if len(newest[slot]) < rule.quorum:
                    continue
                stamp = sorted(newest[slot].values())[-rule.quorum]
            clock[slot] = stamp if clock[slot] is None else max(clock[slot], stamp)
        out.append(list(clock))
    return out


def engine_clocks(batches, rule: ClockRule, n_slots: int) -> list[list[int | None]]:
    clock: list[int | None] = [None] * n_slots
    kept = [UnitStamps.empty() for _ in range(n_slots)]
    out = []
    for now, records in batches:
        if records:
            slots, stamps, by_producer, keys = zip(*records)
            clocks, kept = clocks_by_slot(np.array(slots, np.int64), n_slots, np.array(stamps, np.int64),
                                          np.array(by_producer, bool), list(keys), rule, now, kept)
            assert all(len(k) <= rule.quorum for k in kept)  # bounded state
            for slot, value in enumerate(clocks.tolist()):
                if value != NO_CLOCK:
                    clock[slot] = value if clock[slot] is None else max(clock[slot], value)
        out.append(list(clock))
    return out


STAMPS = st.one_of(st.integers(-2, 0), st.integers(NOW_MS - 10 * MIN, NOW_MS + HOUR))
KEYS = st.one_of(st.none(), st.sampled_from([b"", b"a", b"b", b"c", b"d", b"e", b"f", b"g"]))
RECORDS = st.lists(st.tuples(st.integers(0, 2), STAMPS, st.booleans(), KEYS), max_size=40)
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
    keys = [r[3] for r in records]
    whole, kept_whole = records_clock(stamps, by_producer, keys, rule, NOW_MS)
    first, kept = records_clock(stamps[:split], by_producer[:split], keys[:split], rule, NOW_MS)
    second, kept = records_clock(stamps[split:], by_producer[split:], keys[split:], rule, NOW_MS, kept)
    assert whole == max((c for c in (first, second) if c is not None), default=None)
    assert sorted(kept.stamps.tolist()) == sorted(kept_whole.stamps.tolist())
    expected = reference_clocks([(NOW_MS, [(0, int(s), bool(p), k) for s, p, k in zip(stamps, by_producer, keys)])],
                                rule, 1)
    assert whole == expected[0][0]


def test_one_unit_moves_nothing_however_many_records_and_a_quorum_of_units_does():
    rule = ClockRule(trust_producer_timestamps=True)
    ahead = np.full(100, NOW_MS + HOUR, np.int64)
    stamped = np.ones(100, bool)
    assert records_clock(ahead, stamped, [b"target"] * 100, rule, NOW_MS)[0] is None
    assert records_clock(ahead, stamped, [None] * 100, rule, NOW_MS)[0] is None
    assert records_clock(ahead, stamped, None, rule, NOW_MS)[0] is None
    keys = [b"u%d" % (i % (rule.quorum - 1)) for i in range(100)]
    assert records_clock(ahead, stamped, keys, rule, NOW_MS)[0] is None
    keys = [b"u%d" % (i % rule.quorum) for i in range(100)]
    assert records_clock(ahead, stamped, keys, rule, NOW_MS)[0] == NOW_MS


def test_many_units_keep_only_the_quorum_newest():
    rule = ClockRule(trust_producer_timestamps=True, quorum=3)
    stamps = np.arange(1, 101, dtype=np.int64)
    clock, kept = records_clock(stamps, np.ones(100, bool), [b"u%d" % i for i in range(100)], rule, NOW_MS)
    assert clock == 98 and sorted(kept.stamps.tolist()) == [98, 99, 100]
    # an older stamp of a unit left out does not count as its newest
    clock, kept = records_clock(np.array([5, 6]), np.ones(2, bool), [b"u0", b"u1"], rule, NOW_MS, kept)
    assert clock == 98 and sorted(kept.stamps.tolist()) == [98, 99, 100]


def test_a_quorum_is_a_positive_integer():
    with pytest.raises(ValueError, match="quorum"):
        ClockRule(quorum=0)


# -- through the engine -----------------------------------------------------------------------------------

SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value",
                     max_future_skew_ms=5 * MIN)


def _backlog_with(target_stamps: list[int], *, trusted: bool = True, windows: int = 6, per_window: int = 200,
                  batch: int = 500, target_keys: list[bytes | None] | None = None,
                  target_valid: bool = True, target_unit: str | None = None) -> tuple[int, int]:
    """A backlog two hours old stamped by its producers with its event times and keyed by its units, the target's
    records (stamped ``target_stamps``, keyed ``target_keys``, by default all ``b"target"``; events, or not JSON
    unless ``target_valid``) after the first window's events, read ``batch`` records at a time; (accepted, late)."""
    if target_keys is None:
        target_keys = [b"target"] * len(target_stamps)
    engine, clock = make_engine(schema=SCHEMA, size_ms=MIN, lateness_ms=5_000, idle_ms=10**9)
    engine.clock_rule = ClockRule(trust_producer_timestamps=trusted)
    start = (NOW_MS - 2 * HOUR) // MIN * MIN
    values, stamps, keys = [], [], []
    for w in range(windows):
        for i in range(per_window):
            t = start + w * MIN + i * (MIN - 1_000) // per_window
            values.append(event(f"u{i}", t))
            stamps.append(t)
            keys.append(f"u{i}".encode())
        if w == 0:
            for k, (stamp, key) in enumerate(zip(target_stamps, target_keys)):
                unit = target_unit or (key.decode() if key is not None else "target")  # by default its key's unit
                values.append(event(unit, start + MIN - 500 + k) if target_valid else b"not json")
                stamps.append(stamp)
                keys.append(key)
    accepted = late = 0
    for a in range(0, len(values), batch):
        n = len(values[a:a + batch])
        result = engine.process(RawBatch(values[a:a + batch], np.zeros(n, np.int32), np.arange(a, a + n),
                                         np.array(stamps[a:a + batch]), keys=keys[a:a + batch],
                                         producer_stamped=np.ones(n, bool)))
        accepted += result.accepted
        late += result.late
    return accepted, late


@pytest.mark.parametrize("stamp", [0, -1, NOW_MS, NOW_MS + HOUR - 1], ids=["zero", "none", "now", "an-hour-ahead"])
def test_one_producer_stamp_moves_no_clock_in_a_trusted_backlog(stamp):
    assert _backlog_with([]) == (1_200, 0)
    assert _backlog_with([stamp]) == (1_201, 0)


def test_fewer_units_than_the_quorum_move_nothing_and_a_quorum_of_units_does():
    quorum = ClockRule().quorum
    units = [b"t%d" % i for i in range(quorum)]
    assert _backlog_with([NOW_MS] * (quorum - 1), target_keys=units[:-1]) == (1_200 + quorum - 1, 0)
    accepted, late = _backlog_with([NOW_MS] * quorum, target_keys=units)
    assert late > 0  # the rule's limit, stated in docs/privacy/clock.md: a quorum of units' trusted stamps is the clock


@pytest.mark.parametrize("records", [ClockRule().quorum, 100])
def test_one_units_records_move_nothing_however_many(records):
    assert _backlog_with([NOW_MS] * records) == (1_200 + records, 0)
    assert _backlog_with([NOW_MS + HOUR - 1] * records, target_valid=False) == (1_200, 0)
    assert _backlog_with([NOW_MS] * records, target_keys=[None] * records) == (1_200 + records, 0)


def test_records_the_worker_rejects_or_one_units_events_under_many_keys_move_nothing():
    """A trusted stamp counts for the privacy unit of a record the worker accepts as an event, not for its key:
    one unit's events sent under a quorum of keys are one unit, records of no unit (not JSON) under a quorum of
    keys none (an outside attack made 10,016 of 30,000 honest events late with either)."""
    quorum = ClockRule().quorum
    keys = [b"k%d" % i for i in range(quorum)]
    engine_events = _backlog_with([NOW_MS] * quorum, target_keys=keys, target_unit="target")
    assert engine_events[1] == 0
    assert _backlog_with([NOW_MS] * quorum, target_keys=keys, target_valid=False) == (1_200, 0)


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
