"""Throughput and memory of the window engine on synthetic events.

    .venv/bin/python tests/perf/bench_windows.py            # 200k events, ~30 s
    .venv/bin/python tests/perf/bench_windows.py --events 1000000
    .venv/bin/python tests/perf/bench_windows.py --profile   # top functions of the full path

Prints events per CPU second (process time, so other load on the machine
skews it less than wall time; wall-clock rates in brackets) of decoding alone
(the baseline) and of the whole engine (decode + window + bound + close),
their ratio, and bytes per open
(unit, group) pair measured two ways: numpy array bytes of the pruned state,
and tracemalloc's count of everything the engine allocated for it (unit and
group tables included).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
import tracemalloc

import numpy as np

from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowSpec
from stream_dp.windows.decoding import EventDecoder
from stream_dp.windows.partitioning import expected_partitions

START_MS = 28_333_333 * 60_000  # a minute boundary
WINDOW_MS = 60_000


def synthetic_batches(
    events: int, units: int, groups: int, windows: int, partitions: int, batch: int, seed: int
) -> list[RawBatch]:
    """Events spread evenly over ``windows`` minutes, a few seconds out of order, keyed by unit."""
    rng = np.random.default_rng(seed)  # synthetic data only; noise never comes from numpy
    unit = rng.integers(0, units, events)
    group = np.minimum(rng.zipf(1.3, events) - 1, groups - 1)  # skewed popularity, like page views
    ts = START_MS + np.sort(rng.integers(0, windows * WINDOW_MS, events)) + rng.integers(-2_000, 2_000, events)
    value = np.round(rng.gamma(2.0, 20.0, events), 3)
    keys = [b"user-%d" % u for u in unit.tolist()]
    # placed as Kafka's default partitioner places each key, as the placement check expects
    partition = expected_partitions(np.array(keys, dtype="S"), partitions, "murmur2")
    values = [
        b'{"user_id":"user-%d","ts":%d,"page":"/page/%d","value":%s}' % (u, t, g, repr(v).encode())
        for u, t, g, v in zip(unit.tolist(), ts.tolist(), group.tolist(), value.tolist())
    ]
    offsets = np.zeros(events, dtype=np.int64)
    for p in range(partitions):
        mine = partition == p
        offsets[mine] = np.arange(int(mine.sum()))
    return [
        # records stamped with their event times, as a backfill's producer stamps them
        RawBatch(values[i : i + batch], partition[i : i + batch], offsets[i : i + batch], ts[i : i + batch],
                 keys=keys[i : i + batch])
        for i in range(0, events, batch)
    ]


def make_engine(
    partitions: int, clock: list[int], max_groups: int, max_events: int, placement: bool = True
) -> WindowEngine:
    engine = WindowEngine(
        EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value"),
        WindowSpec(size_ms=WINDOW_MS, allowed_lateness_ms=5_000, idle_timeout_ms=30_000),
        BoundingSpec(
            max_groups_per_unit=max_groups,
            max_events_per_group=max_events,
            clip_lo=0.0,
            clip_hi=100.0,
            secret=b"bench-secret-0123456789abcdef",
        ),
        clock_ms=lambda: clock[0],
        partitioner="murmur2" if placement else None,
    )
    engine.assign(range(partitions))
    if placement:
        engine.set_partition_count(partitions)
    return engine


class Timer:
    """Wall and CPU seconds of a block."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def time_decode(batches: list[RawBatch], schema: EventSchema, now: int) -> Timer:
    decoder = EventDecoder(schema)
    with Timer() as timer:
        for b in batches:
            decoder.decode(b.values, now)
    return timer


def time_engine(
    batches: list[RawBatch], partitions: int, args: argparse.Namespace, placement: bool = True
) -> tuple[Timer, int, int]:
    clock = [START_MS + (args.windows + 1) * WINDOW_MS]
    engine = make_engine(partitions, clock, args.max_groups, args.max_events, placement)
    partials = accepted = 0
    with Timer() as timer:
        for b in batches:
            result = engine.process(b)
            accepted += result.accepted
            partials += len(result.partials)
        clock[0] += 10 * WINDOW_MS
        partials += len(engine.tick())  # everything idle: the wall clock closes the rest
    return timer, accepted, partials


def memory_per_pair(args: argparse.Namespace) -> None:
    """One long-open window holding many pairs: bytes of state per (unit, group) pair."""
    n = args.memory_events
    batches = synthetic_batches(n, args.units, args.groups, 1, args.partitions, args.batch, args.seed + 1)
    clock = [START_MS]  # nothing closes: no partition is idle and the watermark stays in the window
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    engine = make_engine(args.partitions, clock, args.max_groups, args.max_events)
    for b in batches:
        engine.process(b)
    pairs = engine.open_pairs  # folds all pending rows in
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    window_rows = engine.open_rows
    held = engine.state_nbytes()
    print(f"memory: {n} events in one open window -> {pairs} (unit, group) pairs, {window_rows} rows")
    print(f"  row arrays      {held['rows'] / pairs:6.1f} bytes/pair  ({held['rows'] / window_rows:.1f} bytes/row)")
    print(f"  + unit ids      {(held['rows'] + held['unit_ids']) / pairs:6.1f} bytes/pair")
    print(
        f"  tracemalloc     {(after - before) / pairs:6.1f} bytes/pair  (everything the engine holds, group table included)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--windows", type=int, default=5, help="minutes of event time the events span")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--max-groups", type=int, default=3)
    parser.add_argument("--max-events", type=int, default=2)
    parser.add_argument("--memory-events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    t0 = time.perf_counter()
    batches = synthetic_batches(
        args.events, args.units, args.groups, args.windows, args.partitions, args.batch, args.seed
    )
    print(
        f"{args.events} events, {args.units} units, {args.groups} groups, {args.windows} one-minute windows, "
        f"{args.partitions} partitions, batches of {args.batch} (generated in {time.perf_counter() - t0:.1f} s)"
    )
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value")
    now = START_MS + (args.windows + 1) * WINDOW_MS
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        time_engine(batches, args.partitions, args)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
        return
    decode = [time_decode(batches, schema, now) for _ in range(args.repeat)]
    runs = [time_engine(batches, args.partitions, args) for _ in range(args.repeat)]
    unchecked = [time_engine(batches, args.partitions, args, placement=False) for _ in range(args.repeat)]
    decode_cpu, decode_wall = min(t.cpu for t in decode), min(t.wall for t in decode)
    engine_cpu, engine_wall = min(r[0].cpu for r in runs), min(r[0].wall for r in runs)
    _, accepted, partials = runs[0]
    n = args.events
    print(f"decode only      {n / decode_cpu:12,.0f} events/CPU-s  ({n / decode_wall:,.0f} events/s wall)")
    print(
        f"full engine      {n / engine_cpu:12,.0f} events/CPU-s  ({n / engine_wall:,.0f} events/s wall; "
        f"{accepted} accepted, {partials} partials)"
    )
    print(
        f"ratio            {decode_cpu / engine_cpu:12.2f}  (full engine speed / decode-only speed, best of {args.repeat})"
    )
    unchecked_cpu = min(r[0].cpu for r in unchecked)
    print(
        f"no placement     {n / unchecked_cpu:12,.0f} events/CPU-s  (key and partition checks off; "
        f"the checks cost {(engine_cpu - unchecked_cpu) / n * 1e9:,.0f} ns/event, "
        f"{(engine_cpu / unchecked_cpu - 1) * 100:.1f}% of the engine)"
    )
    memory_per_pair(args)


if __name__ == "__main__":
    main()
