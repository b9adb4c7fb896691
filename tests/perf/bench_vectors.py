"""Cost of the vector and sample-and-aggregate paths against the scalar one, in the same run.

    .venv/bin/python tests/perf/bench_vectors.py              # 200k events, 3 fields, ~20 s
    .venv/bin/python tests/perf/bench_vectors.py --fields 8

    .venv/bin/python tests/perf/bench_vectors.py --aggregate-only   # the 1M-event covariance window alone

Prints events per CPU second of the window engine (decode + window + bound +
close) for a scalar query (the baseline) and for a query reading ``--fields``
numbers per event, their ratio; the per-group aggregation of closed partials
with covariance features against the scalar totals; and how many blocks per
second a sample-and-aggregate function answers through its sandbox process.

Then one big window (``--aggregate-events`` events, one per unit, in 10
groups, a covariance of ``--aggregate-fields`` fields: the window that
once took a worker past its 2 GiB): events per second and tracemalloc's
peak of the partial's aggregation as the worker does it (features a block
of pairs at a time) and as it once did (every pair's features at once, then
summed: about 4 GB at 1M events and 16 fields), and whether both give the
same sums bit for bit. ``--aggregate-events 0`` skips it.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from stream_dp.dp.vectors import FeatureSpec, group_row_sums
from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowSpec
from stream_dp.windows.exact_sums import truncate_features
from stream_dp.windows.partial import WindowPartial
from stream_dp.worker.sandbox.runner import FunctionSandbox
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_windows import START_MS, WINDOW_MS, Timer, synthetic_batches  # noqa: E402


def _with_fields(batches: list[RawBatch], fields: int, seed: int) -> list[RawBatch]:
    """The same events with ``fields`` extra numbers each (x0, x1, ...)."""
    rng = np.random.default_rng(seed)
    out = []
    for b in batches:
        extra = np.round(rng.normal(0.0, 2.0, (len(b.values), fields)), 3).tolist()
        values = [v[:-1] + b"".join(b',"x%d":%r' % (i, x) for i, x in enumerate(row)) + b"}"
                  for v, row in zip(b.values, extra)]
        out.append(RawBatch(values, b.partitions, b.offsets, b.timestamps, keys=b.keys))
    return out


def _engine(schema: EventSchema, partitions: int, clock: list[int], clip: tuple[float, float]) -> WindowEngine:
    engine = WindowEngine(
        schema, WindowSpec(size_ms=WINDOW_MS, allowed_lateness_ms=5_000, idle_timeout_ms=30_000),
        BoundingSpec(max_groups_per_unit=3, max_events_per_group=2, clip_lo=clip[0], clip_hi=clip[1],
                     secret=b"bench-secret-0123456789abcdef"),
        clock_ms=lambda: clock[0], partitioner="murmur2",
    )
    engine.assign(list(range(partitions)))
    engine.set_partition_count(partitions)
    return engine


def _run(batches: list[RawBatch], schema: EventSchema, args: argparse.Namespace, clip: tuple[float, float]):
    clock = [START_MS + (args.windows + 1) * WINDOW_MS]
    engine = _engine(schema, args.partitions, clock, clip)
    partials = []
    with Timer() as timer:
        for b in batches:
            partials += engine.process(b).partials
        clock[0] += 10 * WINDOW_MS
        partials += engine.tick()
    return timer, partials


def _big_window(events: int, fields: int, groups: int = 10) -> WindowPartial:
    """A closed window's partial of ``events`` units with one event each, in ``groups`` groups."""
    rng = np.random.default_rng(10)
    return WindowPartial(
        START_MS, START_MS + WINDOW_MS, 0, 0, events - 1, events, [f"u{i}" for i in range(events)],
        [(f"g{i}",) for i in range(groups)], np.arange(events, dtype=np.int32),
        (np.arange(events) % groups).astype(np.int32), np.ones(events, dtype=np.int64), np.zeros(events),
        row_value=np.round(rng.normal(0.0, 1.0, (events, fields)), 3),
    )


def _one_shot_features(partial: WindowPartial, spec: FeatureSpec) -> np.ndarray:
    """The per-group feature sums as the worker once built them: every pair's features at once, then summed."""
    starts = np.cumsum(partial.pair_count) - partial.pair_count
    means = np.add.reduceat(partial.row_value, starts, axis=0) / partial.pair_count[:, None]
    features = truncate_features(spec.of_means(means), spec.norm_bound)
    return group_row_sums(partial.pair_group.astype(np.int64), features, len(partial.groups), spec.width)


def _measured(run) -> tuple[float, float, np.ndarray]:
    """(seconds, tracemalloc peak MB, result) of ``run()``: timed without tracing, then traced once more."""
    started = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - started
    del result
    tracemalloc.start()
    try:
        result = run()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return seconds, peak, result


def big_window(events: int, fields: int) -> None:
    partial = _big_window(events, fields)
    spec = FeatureSpec("covariance", fields, 10.0)
    print(f"one window of {events:,} events in {len(partial.groups)} groups, covariance of {fields} fields "
          f"({spec.width} features per pair; the events' vectors hold {partial.row_value.nbytes / 2**20:,.0f} MB)")
    blocks_s, blocks_mb, blocks = _measured(lambda: partial.aggregate(features=spec).features)
    print(f"  aggregate, features in blocks  {events / blocks_s:12,.0f} events/s  peak {blocks_mb:7,.0f} MB")
    once_s, once_mb, once = _measured(lambda: _one_shot_features(partial, spec))
    print(f"  aggregate, features at once    {events / once_s:12,.0f} events/s  peak {once_mb:7,.0f} MB  "
          f"(as before; same sums bit for bit: {once.tobytes() == blocks.tobytes()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--fields", type=int, default=3)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=2_000, help="blocks sent through the sandbox")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--aggregate-events", type=int, default=1_000_000, help="events of the big window (0: skip)")
    parser.add_argument("--aggregate-fields", type=int, default=16)
    parser.add_argument("--aggregate-only", action="store_true", help="measure the big window alone")
    args = parser.parse_args()
    if args.aggregate_only:
        big_window(args.aggregate_events, args.aggregate_fields)
        return
    scalar = synthetic_batches(args.events, args.units, args.groups, args.windows, args.partitions, 10_000, 7)
    vector = _with_fields(scalar, args.fields, 8)
    names = tuple(f"x{i}" for i in range(args.fields))
    base_schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), value_field="value")
    vector_schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), vector_fields=names)
    base = [_run(scalar, base_schema, args, (0.0, 100.0)) for _ in range(args.repeat)]
    vec = [_run(vector, vector_schema, args, (-1e15, 1e15)) for _ in range(args.repeat)]
    n = args.events
    base_cpu, vec_cpu = min(t.cpu for t, _ in base), min(t.cpu for t, _ in vec)
    print(f"{n} events, {args.fields} vector fields, {args.groups} groups, best of {args.repeat}")
    print(f"scalar engine    {n / base_cpu:12,.0f} events/CPU-s  (baseline)")
    print(f"vector engine    {n / vec_cpu:12,.0f} events/CPU-s  (x{base_cpu / vec_cpu:.2f} of the baseline)")

    spec = FeatureSpec("covariance", args.fields, 10.0)
    _, partials = vec[0]
    pairs = sum(len(p.pair_count) for p in partials)
    started = time.process_time()
    for p in partials:
        p.aggregate()
    plain = time.process_time() - started
    started = time.process_time()
    for p in partials:
        p.aggregate(features=spec)
    featured = time.process_time() - started
    print(f"partial totals   {pairs / plain:12,.0f} pairs/CPU-s  (count and sum only)")
    print(f"  + covariance   {pairs / featured:12,.0f} pairs/CPU-s  ({spec.width} features per pair, "
          f"x{plain / featured:.2f} of the plain totals)")

    sandbox = FunctionSandbox("statistics:median")
    try:
        sandbox.check()
        rng = np.random.default_rng(9)
        blocks = [rng.normal(0, 1, 40) for _ in range(args.blocks)]
        started = time.perf_counter()
        sandbox.run(blocks)
        seconds = time.perf_counter() - started
    finally:
        sandbox.close()
    print(f"sandbox          {args.blocks / seconds:12,.0f} blocks/s wall  (statistics:median of 40 values, "
          f"{seconds / args.blocks * 1e6:.0f} us per block, process round trip included)")
    if args.aggregate_events:
        big_window(args.aggregate_events, args.aggregate_fields)


if __name__ == "__main__":
    main()
