"""Cost of the vector and sample-and-aggregate paths against the scalar one, in the same run.

    .venv/bin/python tests/perf/bench_vectors.py              # 200k events, 3 fields, ~20 s
    .venv/bin/python tests/perf/bench_vectors.py --fields 8

Prints events per CPU second of the window engine (decode + window + bound +
close) for a scalar query (the baseline) and for a query reading ``--fields``
numbers per event, their ratio; the per-group aggregation of closed partials
with covariance features against the scalar totals; and how many blocks per
second a sample-and-aggregate function answers through its sandbox process.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from stream_dp.dp.vectors import FeatureSpec
from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowSpec
from stream_dp.worker.sandbox import FunctionSandbox
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
