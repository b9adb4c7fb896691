"""Property tests of the engine over generated streams (Hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_dp.windows import RawBatch, WindowPartial

from ._support import NOW_MS, by_key, make_engine, raw_batch

SIZE = 1_000  # one-second windows keep the generated streams short
BASE = NOW_MS - 3_600_000  # well behind the wall clock, which never moves while processing
CLIP = (0.0, 100.0)
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Event:
    unit: int
    group: int
    ts: int
    value: float


@dataclass
class Message:
    partition: int
    offset: int
    value: bytes | None
    event: Event | None


events_st = st.lists(
    st.builds(
        Event,
        unit=st.integers(0, 5),
        group=st.integers(0, 3),
        ts=st.integers(0, 4 * SIZE - 1),
        value=st.floats(-20.0, 120.0, allow_nan=False),
    ),
    min_size=1,
    max_size=60,
)


def encode(e: Event) -> bytes:
    return orjson.dumps({"user_id": f"u{e.unit}", "ts": BASE + e.ts, "page": f"g{e.group}", "value": e.value})


def arrange(events: list[Event], jitter: list[int], partitions: int, garbage: list[int] = ()) -> list[Message]:
    """Arrival order by ts + jitter (so each event is within ``max(jitter)`` of the newest before it),
    offsets numbered per partition in that order; units keyed to partitions."""
    order = sorted(range(len(events)), key=lambda i: (events[i].ts + jitter[i % len(jitter)], i))
    messages: list[Message] = []
    next_offset = [0] * partitions
    for position, i in enumerate(order):
        e = events[i]
        p = e.unit % partitions
        if position in garbage:
            messages.append(Message(p, next_offset[p], b'{"user_id":', None))
            next_offset[p] += 1
        messages.append(Message(p, next_offset[p], encode(e), e))
        next_offset[p] += 1
    return messages


def batches(messages: list[Message], cuts: list[int]) -> list[RawBatch]:
    points = sorted({0, len(messages), *[c % (len(messages) + 1) for c in cuts]})
    out = []
    for a, b in zip(points, points[1:]):
        chunk = messages[a:b]
        out.append(
            raw_batch([m.value for m in chunk], [m.partition for m in chunk], [m.offset for m in chunk])
        )
    return out


def run(messages, cuts, partitions, *, lateness, max_groups=100, max_events=100):
    engine, clock = make_engine(
        size_ms=SIZE,
        lateness_ms=lateness,
        idle_ms=10**9,
        max_groups=max_groups,
        max_events=max_events,
        clip=CLIP,
        partitions=range(partitions),
    )
    results = [engine.process(b) for b in batches(messages, cuts)]
    clock.now_ms += 2 * 10**9  # everything idle: the wall clock closes all windows
    final = engine.tick()
    return results, final, engine


def all_partials(results, final) -> list[WindowPartial]:
    return [p for r in results for p in r.partials] + final


@PROPERTY_SETTINGS
@given(
    events=events_st,
    jitter=st.lists(st.integers(0, 500), min_size=1, max_size=5),
    partitions=st.integers(1, 3),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    max_groups=st.integers(1, 3),
    max_events=st.integers(1, 3),
)
def test_bounds_are_never_exceeded(events, jitter, partitions, cuts, max_groups, max_events):
    results, final, _ = run(
        arrange(events, jitter, partitions),
        cuts,
        partitions,
        lateness=500,
        max_groups=max_groups,
        max_events=max_events,
    )
    assert all(r.balanced for r in results)
    per_window: dict[int, dict[str, set]] = {}
    for p in all_partials(results, final):
        assert np.all(p.pair_count >= 1) and np.all(p.pair_count <= max_events)
        assert np.all(p.pair_sum >= CLIP[0] * p.pair_count) and np.all(p.pair_sum <= CLIP[1] * p.pair_count)
        for u, g in zip(p.pair_unit.tolist(), p.pair_group.tolist()):
            per_window.setdefault(p.window_start_ms, {}).setdefault(p.units[u], set()).add(p.groups[g])
        assert np.all(p.unit_totals().groups <= max_groups)
    for groups_of_unit in per_window.values():  # a unit's groups across all partitions of a window
        assert all(len(g) <= max_groups for g in groups_of_unit.values())


@PROPERTY_SETTINGS
@given(
    events=events_st,
    jitter=st.lists(st.integers(0, 500), min_size=1, max_size=5),
    partitions=st.integers(1, 3),
    cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_windows_are_disjoint_and_complete(events, jitter, partitions, cuts):
    results, final, _ = run(arrange(events, jitter, partitions), cuts, partitions, lateness=500)
    partials = by_key(all_partials(results, final))
    assert sum(r.accepted for r in results) == len(events)  # within the allowed lateness: nothing is late
    expected: dict[tuple[int, int], int] = {}
    for e in events:
        start = BASE + e.ts - (BASE + e.ts) % SIZE
        key = (start, e.unit % partitions)
        expected[key] = expected.get(key, 0) + 1
    assert {k: int(p.pair_count.sum()) for k, p in partials.items()} == expected
    assert {k: p.accepted_events for k, p in partials.items()} == expected
    for (start, _), p in partials.items():
        assert p.window_end_ms - p.window_start_ms == SIZE and start % SIZE == BASE % SIZE


@PROPERTY_SETTINGS
@given(
    events=events_st,
    jitter=st.lists(st.integers(0, 500), min_size=1, max_size=5),
    partitions=st.integers(1, 3),
    cuts_a=st.lists(st.integers(0, 200), max_size=6),
    cuts_b=st.lists(st.integers(0, 200), max_size=6),
    interleave_seed=st.integers(0, 2**32 - 1),
    max_groups=st.integers(1, 3),
    max_events=st.integers(1, 3),
)
def test_results_do_not_depend_on_arrival_order_within_lateness(
    events, jitter, partitions, cuts_a, cuts_b, interleave_seed, max_groups, max_events
):
    in_order = arrange(events, jitter, partitions)
    # the same messages, each partition still in offset order, partitions interleaved at random
    rng = np.random.default_rng(interleave_seed)
    queues = {p: [m for m in in_order if m.partition == p] for p in range(partitions)}
    shuffled: list[Message] = []
    while any(queues.values()):
        p = rng.choice([q for q, rest in queues.items() if rest])
        shuffled.append(queues[p].pop(0))
    bounds = {"max_groups": max_groups, "max_events": max_events}
    a = by_key(all_partials(*run(in_order, cuts_a, partitions, lateness=500, **bounds)[:2]))
    b = by_key(all_partials(*run(shuffled, cuts_b, partitions, lateness=500, **bounds)[:2]))
    assert a == b  # WindowPartial equality is bit for bit


@PROPERTY_SETTINGS
@given(
    events=events_st,
    cuts=st.lists(st.integers(0, 200), max_size=6),
    order_seed=st.integers(0, 2**32 - 1),
)
def test_any_permutation_gives_the_same_result_when_lateness_covers_the_span(events, cuts, order_seed):
    reference = arrange(events, [0], 1)
    permuted = [reference[i] for i in np.random.default_rng(order_seed).permutation(len(reference))]
    a = by_key(all_partials(*run(reference, cuts, 1, lateness=10 * SIZE, max_groups=2, max_events=1)[:2]))
    b = by_key(all_partials(*run(permuted, [], 1, lateness=10 * SIZE, max_groups=2, max_events=1)[:2]))
    assert a == b


@PROPERTY_SETTINGS
@given(
    events=events_st,
    jitter=st.lists(st.integers(0, 3_000), min_size=1, max_size=5),
    partitions=st.integers(1, 3),
    cuts=st.lists(st.integers(0, 200), min_size=1, max_size=6),
    cut_choice=st.integers(0, 100),
    garbage=st.lists(st.integers(0, 60), max_size=5),
    max_groups=st.integers(1, 3),
)
def test_replay_after_a_crash_gives_identical_output(events, jitter, partitions, cuts, cut_choice, garbage, max_groups):
    # jitter beyond the lateness makes some events late; garbage adds rejected messages
    messages = arrange(events, jitter, partitions, garbage)
    after_crash, replayed = crash_and_replay(batches(messages, cuts), cut_choice, partitions, max_groups)
    assert by_key(replayed) == by_key(after_crash)


def crash_and_replay(
    stream: list[RawBatch], cut_choice: int, partitions: int, max_groups: int
) -> tuple[list[WindowPartial], list[WindowPartial]]:
    """Partials a first engine emits after batch ``cut_choice``, and those a second engine emits
    when restored from the first one's commit at that point and replaying from its offsets."""
    bounds = {"max_groups": max_groups, "max_events": 2}
    first, clock = make_engine(
        size_ms=SIZE, lateness_ms=300, idle_ms=10**9, clip=CLIP, partitions=range(partitions), **bounds
    )
    crash_after = cut_choice % len(stream)
    after_crash: list[WindowPartial] = []
    for i, b in enumerate(stream):
        partials = first.process(b).partials
        if i == crash_after:
            committed, closed_through = first.committable_offsets(), first.closed_through_ms
            record_clock = first.record_clock_ms
        elif i > crash_after:
            after_crash += partials
    clock.now_ms += 2 * 10**9
    after_crash += first.tick()

    second, clock2 = make_engine(size_ms=SIZE, lateness_ms=300, idle_ms=10**9, clip=CLIP, partitions=[], **bounds)
    second.assign(range(partitions), closed_through_ms=closed_through, record_clock_ms=record_clock)
    replayed: list[WindowPartial] = []
    for b in stream:
        keep = np.array([o >= committed.get(int(p), 0) for p, o in zip(b.partitions, b.offsets)], dtype=bool)
        if keep.any():
            values = [v for v, k in zip(b.values, keep) if k]
            result = second.process(RawBatch(values, b.partitions[keep], b.offsets[keep], b.timestamps[keep]))
            assert result.balanced
            replayed += result.partials
    clock2.now_ms += 2 * 10**9
    replayed += second.tick()
    return after_crash, replayed


def test_replay_of_a_long_stream_rebuilds_open_windows_exactly():
    rng = np.random.default_rng(5)
    events = [
        Event(int(rng.integers(0, 40)), int(rng.integers(0, 6)), int(t), float(rng.uniform(-10, 110)))
        for t in np.sort(rng.integers(0, 20 * SIZE, 2_000))
    ]
    messages = arrange(events, [0, 150, 400, 900], 3, garbage=list(range(0, 2_000, 97)))
    stream = batches(messages, list(range(0, len(messages), 137)))
    after_crash, replayed = crash_and_replay(stream, 7, 3, 2)
    assert len(after_crash) > 20  # the crash leaves many windows to rebuild
    assert by_key(replayed) == by_key(after_crash)


@PROPERTY_SETTINGS
@given(
    junk=st.lists(st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=40).map(str.encode)), max_size=30),
    events=events_st,
)
def test_accounting_identity_holds_for_any_bytes(junk, events):
    engine, _ = make_engine(size_ms=SIZE, lateness_ms=0, partitions=[0])
    values = [encode(e) for e in events] + junk
    order = np.random.default_rng(len(values)).permutation(len(values))
    values = [values[i] for i in order]
    result = engine.process(raw_batch(values, np.zeros(len(values)), np.arange(len(values))))
    assert result.balanced and result.input_count == len(values)
    assert result.accepted + len(result.rejections) + result.replayed == len(values)
    assert len({r.offset for r in result.rejections}) == len(result.rejections)  # each message accounted once


@PROPERTY_SETTINGS
@given(
    events=events_st,
    jitter=st.lists(st.integers(0, 500), min_size=1, max_size=5),
    partitions=st.integers(2, 3),
    cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_partitions_assigned_late_lose_nothing(events, jitter, partitions, cuts):
    """An engine that runs ahead on some partitions and only then is assigned the others
    releases the same partials as one that owned all of them from the start."""
    messages = arrange(events, jitter, partitions)
    reference = by_key(all_partials(*run(messages, cuts, partitions, lateness=500)[:2]))
    engine, clock = make_engine(size_ms=SIZE, lateness_ms=500, idle_ms=10**9, clip=CLIP, partitions=[0])
    first = [m for m in messages if m.partition == 0]
    rest = [m for m in messages if m.partition != 0]
    partials = [p for b in batches(first, cuts) for p in engine.process(b).partials]
    engine.assign(range(1, partitions))
    partials += [p for b in batches(rest, cuts) if len(b) for p in engine.process(b).partials]
    clock.now_ms += 2 * 10**9
    partials += engine.tick()
    assert by_key(partials) == reference
