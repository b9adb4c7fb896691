"""Measurement: how trusted producer timestamps should move a partition's window clock.

Candidates, each on one partition with one-minute windows and 5 s of allowed lateness:

* ``quorum k``: the clock is the k-th largest of the newest producer stamps read per unit (record key,
  ``stream_dp.windows.record_clock``); k = 1 is the newest stamp, the rule before. Run through the window engine itself.
* ``step S``: each record may move the clock at most S ms past where it was (the clock follows a
  record's stamp only up to the clock before it plus S). Run in a small simulation written here,
  which also runs the quorum rule so that both are seen the same way (its quorum figures must equal
  the engine's: they are checked).

Streams:

* attack 3: a backlog two hours old, 30 windows x 2,000 events of 2,000 units stamped with their event
  times, read 20,000 records at a time, with m records after the first window's events stamped an hour
  ahead (the broker's limit; capped at the wall clock when read), each of a unit of its own (m units) or
  all of one unit: events called late, of 60,000;
* an honest backlog produced two hours ago by 20 producers whose clocks are off by up to 2 s, 5% of the
  events delayed by up to 8 s on their way: events late, and windows still open when it is read
  (they close once the partition is idle);
* an honest live stream from the same producers at 0.1, 1, 10 and 100 events/s, read every 200 ms for
  20 minutes: events late, how long after its end plus lateness each window closed (mean / max, s), and
  how many windows no record closed (the idle rule closes them once the stream stops). Each honest event
  is of a unit of its own: the quorum counts units, so a stream of fewer units waits for more records.

Then the rule's throughput: trusted records (20,000 a batch, 4 partitions, 5,000 units) through the clock
rule alone and through ``WindowEngine.process``, in records (events) per second.

    .venv/bin/python tests/perf/bench_clock_rule.py     # a few minutes
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowSpec
from stream_dp.windows.record_clock import ClockRule, UnitStamps, clocks_by_slot

MIN = 60_000
HOUR = 3_600_000
LATENESS = 5_000
NOW = 1_704_067_800_000
SCHEMA = EventSchema(unit_field="u", timestamp_field="ts", group_by=("g",), max_future_skew_ms=5 * MIN)


@dataclass
class Stream:
    """Records in reading order: event times, record stamps, and the wall clock each batch is read at."""

    event_ms: np.ndarray
    stamp_ms: np.ndarray
    keys: list[bytes]  # each record's unit
    batches: list[tuple[int, int, int]]  # (first record, end, wall clock)
    honest: np.ndarray  # which records are the honest stream's (not the attacker's)


def attack(m: int, one_unit: bool = False, windows: int = 30, per_window: int = 2_000, batch: int = 20_000) -> Stream:
    start = (NOW - 2 * HOUR) // MIN * MIN
    events, stamps, honest, keys = [], [], [], []
    for w in range(windows):
        t = start + w * MIN + np.arange(per_window) * (MIN - 1_000) // per_window
        events.append(t), stamps.append(t), honest.append(np.ones(per_window, bool))
        keys += [b"u%d" % i for i in range(per_window)]
        if w == 0 and m:
            events.append(np.full(m, start + MIN - 500)), stamps.append(np.full(m, NOW + HOUR - 1))
            honest.append(np.zeros(m, bool))
            keys += [b"attacker" if one_unit else b"attacker-%d" % j for j in range(m)]
    event_ms, stamp_ms = np.concatenate(events), np.concatenate(stamps)
    batches = [(a, min(a + batch, len(event_ms)), NOW) for a in range(0, len(event_ms), batch)]
    return Stream(event_ms, stamp_ms, keys, batches, np.concatenate(honest))


def producers_stream(rate_per_s: float, duration_ms: int, start: int, rng: np.random.Generator,
                     producers: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event time, record stamp, send time) in send order: producers' clocks off by up to 2 s, 5% of the
    events delayed by up to 8 s, the rest by 0.1 s on average."""
    n = rng.poisson(rate_per_s * duration_ms / 1000)
    happened = np.sort(rng.uniform(start, start + duration_ms, n)).astype(np.int64)
    skew = rng.uniform(-2_000, 2_000, producers).astype(np.int64)[rng.integers(0, producers, n)]
    delay = np.where(rng.random(n) < 0.05, rng.uniform(0, 8_000, n), rng.exponential(100, n)).astype(np.int64)
    sent = happened + delay
    order = np.argsort(sent, kind="stable")
    return (happened + skew)[order], (sent + skew)[order], sent[order]


def honest_backlog(rng: np.random.Generator, batch: int = 20_000) -> Stream:
    start = (NOW - 2 * HOUR) // MIN * MIN
    event_ms, stamp_ms, _ = producers_stream(2_000 / 60, 30 * MIN, start, rng)
    batches = [(a, min(a + batch, len(event_ms)), NOW) for a in range(0, len(event_ms), batch)]
    return Stream(event_ms, stamp_ms, _own_units(len(event_ms)), batches, np.ones(len(event_ms), bool))


def _own_units(n: int) -> list[bytes]:
    return [b"u%d" % i for i in range(n)]


def live(rate_per_s: float, rng: np.random.Generator, poll_ms: int = 200, minutes: int = 20) -> Stream:
    start = NOW - minutes * MIN
    event_ms, stamp_ms, sent = producers_stream(rate_per_s, minutes * MIN, start, rng)
    polls = np.arange(start + poll_ms, NOW + 2 * MIN, poll_ms)
    ends = np.searchsorted(sent, polls, side="right")
    firsts = np.concatenate([[0], ends[:-1]])
    return Stream(event_ms, stamp_ms, _own_units(len(event_ms)),
                  [(int(a), int(b), int(t)) for a, b, t in zip(firsts, ends, polls)], np.ones(len(event_ms), bool))


def run_engine(stream: Stream, quorum: int) -> tuple[int, list[float]]:
    """(honest events late, close delays): for each window records closed (not the idle rule once the stream
    stopped), how far past its end plus lateness the newest stamp read (capped at the wall clock) was when
    it closed, in s: the delay on a live stream, how much more of a backlog had to be read."""
    wall = [NOW]
    engine = WindowEngine(SCHEMA, WindowSpec(size_ms=MIN, allowed_lateness_ms=LATENESS, idle_timeout_ms=10**9),
                          BoundingSpec(max_groups_per_unit=1, max_events_per_group=1, secret=b"bench-secret-0123456789"),
                          clock_ms=lambda: wall[0], clock_rule=ClockRule(trust_producer_timestamps=True, quorum=quorum))
    engine.assign([0])
    values = [orjson.dumps({"u": key.decode(), "ts": int(t), "g": "a"}) for key, t in zip(stream.keys,
                                                                                          stream.event_ms.tolist())]
    late, delays, newest = 0, [], None
    for a, b, now in stream.batches:
        if b == a:
            continue
        wall[0] = now
        batch = RawBatch(values[a:b], np.zeros(b - a, np.int32), np.arange(a, b), stream.stamp_ms[a:b],
                         keys=stream.keys[a:b], producer_stamped=np.ones(b - a, bool))
        result = engine.process(batch)
        late += sum(1 for r in result.rejections if r.reason.value == "late" and stream.honest[r.offset])
        newest = _newest(stream, a, b, now, newest)
        delays += [(newest - p.window_end_ms - LATENESS) / 1000 for p in result.partials]
    return late, delays


def _newest(stream: Stream, a: int, b: int, now: int, newest: int | None) -> int:
    """The newest honest stamp read through record ``b``, capped at the wall clock."""
    stamps = stream.stamp_ms[a:b][stream.honest[a:b]]
    if not len(stamps):
        return newest if newest is not None else now
    read = min(int(stamps.max()), now)
    return read if newest is None else max(newest, read)


def quorum_clock(k: int) -> Callable[[np.ndarray, list[bytes], dict], int | None]:
    def advance(stamps: np.ndarray, keys: list[bytes], state: dict) -> int | None:
        newest: dict[bytes, int] = state.setdefault("newest", {})  # every unit's newest stamp, unbounded
        for key, s in zip(keys, stamps.tolist()):
            newest[key] = max(s, newest.get(key, s))
        return sorted(newest.values())[-k] if len(newest) >= k else None
    return advance


def step_clock(step_ms: int) -> Callable[[np.ndarray, list[bytes], dict], int | None]:
    def advance(stamps: np.ndarray, keys: list[bytes], state: dict) -> int | None:
        clock = state.get("clock")
        for s in stamps.tolist():
            clock = s if clock is None else max(clock, min(s, clock + step_ms))
        state["clock"] = clock
        return clock
    return advance


def simulate(stream: Stream, advance: Callable[[np.ndarray, list[bytes], dict], int | None]) -> tuple[int, list[float]]:
    """``run_engine``'s figures by a clock rule written here: the clock moves after each batch, each stamp
    capped at its batch's wall clock; an event is late when its window ends at or before the window boundary at or below clock -
    lateness, and a window closes once that boundary reaches its end."""
    clock, state, late, delays, newest = None, {}, 0, [], None
    ends = stream.event_ms // MIN * MIN + MIN
    closed = None
    for a, b, now in stream.batches:
        if b == a:
            continue
        if closed is not None:
            late += int(((ends[a:b] <= closed) & stream.honest[a:b]).sum())
        seen_ends = np.unique(ends[:b])
        before = closed
        newest = _newest(stream, a, b, now, newest)
        moved = advance(np.minimum(stream.stamp_ms[a:b], now), stream.keys[a:b], state)  # capped at reading time
        if moved is not None:
            clock = min(moved, now) if clock is None else max(clock, min(moved, now))
            closed = (clock - LATENESS) // MIN * MIN
            newly = seen_ends[(seen_ends <= closed) & (True if before is None else seen_ends > before)]
            delays += [(newest - end - LATENESS) / 1000 for end in newly.tolist()]
    return late, delays


def _cell(late: int, delays: list[float], windows: int) -> str:
    if not delays:
        return f"{late:>6} {'-':>7} / {'-':>5} {windows:>4}"
    return f"{late:>6} {np.mean(delays):>7.1f} / {np.max(delays):>5.1f} {windows - len(delays):>4}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    quorums = (1, 2, 4, 8, 16, 32, 64)
    steps = (1_000, 10_000, 60_000)
    rules = [(f"quorum {k}", k, quorum_clock(k)) for k in quorums] + [(f"step {s // 1000} s", None, step_clock(s))
                                                                      for s in steps]
    rng = np.random.default_rng(args.seed)  # synthetic streams only

    ms = (1, 3, 7, 15, 31, 63)
    for one_unit in (False, True):
        print(f"attack 3: honest events late of 60,000, by m records stamped an hour ahead, "
              f"{'all of one unit' if one_unit else 'each of a unit of its own'}")
        print(f"  {'rule':<12}" + "".join(f"{f'm={m}':>9}" for m in ms))
        for name, k, advance in rules:
            row = []
            for m in ms:
                stream = attack(m, one_unit)
                late = simulate(stream, advance)[0]
                if k is not None:
                    assert run_engine(stream, k)[0] == late, (k, m)  # the simulation reads as the engine
                row.append(late)
            print(f"  {name:<12}" + "".join(f"{x:>9,}" for x in row))

    streams = {"backlog": honest_backlog(rng), **{f"live {r}/s": live(r, rng) for r in (0.1, 1, 10, 100)}}
    print("\nhonest streams from 20 producers (clocks off by up to 2 s, 5% of events up to 8 s late on their way):\n"
          "  per stream: events late; how far past a window's end + lateness the newest stamp read was when it "
          "closed, mean / max s; windows records left open (for the idle rule once the stream stops)")
    print(f"  {'rule':<12}" + "".join(f"{name:>27}" for name in streams))
    for name, k, advance in rules:
        cells = []
        for stream in streams.values():
            windows = len(np.unique(stream.event_ms // MIN))
            cells.append(_cell(*(run_engine(stream, k) if k is not None else simulate(stream, advance)), windows))
        print(f"  {name:<12}" + "".join(f"{c:>27}" for c in cells))
    throughput()


def throughput(n: int = 20_000, partitions: int = 4, units: int = 5_000, repeats: int = 20) -> None:
    """Records per second through the trusted clock rule alone and through the engine (best of ``repeats``)."""
    rng = np.random.default_rng(2)  # synthetic data only
    stamps = np.sort(rng.integers(NOW - 2 * HOUR, NOW - HOUR, n))
    slots = rng.integers(0, partitions, n)
    keys = [b"u%d" % u for u in rng.integers(0, units, n).tolist()]
    rule = ClockRule(trust_producer_timestamps=True)
    stamped = np.ones(n, bool)
    best = min(_timed(lambda: clocks_by_slot(slots, partitions, stamps, stamped, keys, rule, NOW,
                                             [UnitStamps.empty()] * partitions)) for _ in range(repeats))
    print(f"\nthroughput, {n:,} trusted records a batch, {partitions} partitions, {units:,} units:\n"
          f"  clock rule alone        {n / best / 1e6:>8.2f} M records/s ({best * 1e3:.2f} ms a batch)")
    values = [orjson.dumps({"u": key.decode(), "ts": int(t), "g": "a"}) for key, t in zip(keys, stamps.tolist())]
    batch = {trusted: RawBatch(values, slots.astype(np.int32), np.arange(n), stamps, keys=keys,
                               producer_stamped=stamped if trusted else None) for trusted in (True, False)}
    for trusted in (True, False):
        times = []
        for _ in range(max(3, repeats // 4)):
            engine = WindowEngine(SCHEMA, WindowSpec(size_ms=MIN, allowed_lateness_ms=LATENESS, idle_timeout_ms=10**9),
                                  BoundingSpec(max_groups_per_unit=1, max_events_per_group=1,
                                               secret=b"bench-secret-0123456789"),
                                  clock_ms=lambda: NOW, clock_rule=ClockRule(trust_producer_timestamps=trusted))
            engine.assign(range(partitions))
            times.append(_timed(lambda: engine.process(batch[trusted])))  # noqa: B023 (called at once)
        best = min(times)
        label = "engine, trusted" if trusted else "engine, broker stamps"
        print(f"  {label:<23} {n / best / 1e3:>8.0f} k events/s")


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
