"""What per-group value histograms (quantiles queries) cost on the ingest and combine path.

    .venv/bin/python tests/perf/bench_histograms.py                 # 1M events, 1k groups, ~1 min
    .venv/bin/python tests/perf/bench_histograms.py --groups 100000

Closes the windows of ``bench_windows``' synthetic events, then times per
partial, best of ``--repeat``: ``aggregate`` without and with a histogram
(``--bins`` bins), the partial's binary encoding without and with it (and
its bytes), and the combiner's merge of the window's partials without and
with histograms. Prints CPU milliseconds; nothing is asserted. The engine
itself does no extra work for histograms (a partial keeps the value column
it had already built), which ``bench_windows`` measures.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from stream_dp.dp.histogram import HistogramSpec
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.partials.wire import PartialAggregate, encode_partial_payload
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_windows import START_MS, WINDOW_MS, make_engine, synthetic_batches  # noqa: E402


def best_cpu_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        fn()
        times.append(time.process_time() - started)
    return min(times) * 1e3


def message(partial, totals) -> PartialAggregate:
    return PartialAggregate(
        query="q", window_start_ms=partial.window_start_ms, window_end_ms=partial.window_end_ms,
        partition=partial.partition, input_partitions=8, groups=list(totals.groups), count=totals.count,
        sum=totals.sum, distinct_units=totals.distinct_units, units_charged=len(partial.units), units_excluded=0,
        closed_at_ms=partial.window_end_ms, placement_partitions=8, histogram=totals.histogram,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--units", type=int, default=200_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--bins", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    batches = synthetic_batches(args.events, args.units, args.groups, 1, args.partitions, 50_000, 7)
    clock = [START_MS + 2 * WINDOW_MS]
    engine = make_engine(args.partitions, clock, 3, 2)
    partials = [p for b in batches for p in engine.process(b).partials]
    clock[0] += 10 * WINDOW_MS
    partials += engine.tick()
    spec = HistogramSpec(bins=args.bins, lo=0.0, hi=100.0)
    rows = sum(len(p.row_value) for p in partials)
    print(f"{args.events} events -> {len(partials)} partials, {rows} kept events, "
          f"{sum(len(p.groups) for p in partials)} (partition, group) rows; {args.bins} bins")
    print(f"  value column kept per partial: {sum(p.row_value.nbytes for p in partials) / 2**20:.1f} MiB in all "
          f"(8 bytes per kept event)")

    excluded = [np.arange(len(p.units)) % 50 == 0 for p in partials]  # 2% of units out of budget
    plain = best_cpu_ms(lambda: [p.aggregate(e) for p, e in zip(partials, excluded)], args.repeat)
    with_hist = best_cpu_ms(lambda: [p.aggregate(e, histogram=spec) for p, e in zip(partials, excluded)], args.repeat)
    print(f"aggregate        {plain:8.1f} ms without, {with_hist:8.1f} ms with histograms "
          f"(+{(with_hist - plain) / rows * 1e6:.0f} ns per kept event)")

    totals = [p.aggregate(e, histogram=spec) for p, e in zip(partials, excluded)]
    messages = [message(p, t) for p, t in zip(partials, totals)]
    bare = [replace(m, histogram=None) for m in messages]
    enc_plain = best_cpu_ms(lambda: [encode_partial_payload(m) for m in bare], args.repeat)
    enc_hist = best_cpu_ms(lambda: [encode_partial_payload(m) for m in messages], args.repeat)
    size_plain = sum(len(encode_partial_payload(m)) for m in bare)
    size_hist = sum(len(encode_partial_payload(m)) for m in messages)
    cells = sum(len(m.histogram) for m in messages)
    print(f"encode           {enc_plain:8.1f} ms without, {enc_hist:8.1f} ms with; {size_plain / 1024:.0f} KiB -> "
          f"{size_hist / 1024:.0f} KiB ({cells} nonzero cells, {(size_hist - size_plain) / max(cells, 1):.1f} bytes/cell)")

    def merge(items: list[PartialAggregate], bins: int | None) -> None:
        combiner = WindowCombiner("q", window_size_ms=WINDOW_MS, window_offset_ms=0, release_timeout_ms=1,
                                  public_groups=None, has_sum=True, quantile_bins=bins)
        for m in items:
            combiner.add_partial(m, now_ms=0)
        combiner.take(items[0].window_start_ms)

    merge_plain = best_cpu_ms(lambda: merge(bare, None), args.repeat)
    merge_hist = best_cpu_ms(lambda: merge(messages, args.bins), args.repeat)
    print(f"combine          {merge_plain:8.1f} ms without, {merge_hist:8.1f} ms with histograms")


if __name__ == "__main__":
    main()
